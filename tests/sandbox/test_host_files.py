"""The files a job host runs inside the sandbox (host.py, host_ns.py, job/protocol.py) are
bound as single files and loaded by path: none may import nestor (it is masked in there) or
one of its siblings by module name (`python -I` keeps their directory off sys.path)."""

import ast
import sys
from pathlib import Path

from nestor.sandbox.hosts import HOST_FILES, HOST_IN


def _imported(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            names.add("." if node.level else node.module.split(".")[0])
    return names


def test_every_host_file_is_bound_next_to_host_py_and_imports_only_stdlib_and_verifiers():
    assert len(HOST_FILES) == 3
    for source, inside in HOST_FILES.items():
        assert Path(source).is_file(), source
        assert Path(inside).parent == Path(HOST_IN).parent, inside
        foreign = _imported(Path(source)) - set(sys.stdlib_module_names) - {"verifiers"}
        assert not foreign, f"{source} imports {sorted(foreign)}"
