"""The rooms' import order and the hidden eval's wall, read from the source (docs/architecture.md).

Every `import` in nestor/ is parsed, those inside functions too (a lazy import crosses a wall as
surely as a top-level one). A room may import a room below it; of one rank, only the siblings
named here; the leaves anything. The checker is tried on a made-up package first, so a test that
passes on ours is one that could have failed.
"""

import ast
from pathlib import Path

import pytest

NESTOR = Path(__file__).resolve().parents[1] / "nestor"

# cli -> {report, serve} -> {outer, sft} -> {policy, agent} -> pool -> inner -> job -> sandbox,
# with tasks, models, ledger and config as leaves.
RANK = {"cli": 8, "report": 7, "serve": 7, "outer": 6, "sft": 6, "policy": 5, "agent": 5,
        "pool": 4, "inner": 3, "job": 2, "sandbox": 1,
        "tasks": 0, "models": 0, "ledger": 0, "config": 0, "text": 0}
SIBLINGS = {frozenset({"policy", "agent"})}  # an episode calls a policy; a policy speaks tools
HIDDEN = "nestor.tasks.hidden"
# The trusted scorer and `nestor eval`: nothing that renders a prompt, writes a workspace or
# runs agent code.
HIDDEN_READERS = {"inner/evaluate.py", "inner/contamination.py", "inner/run.py", "cli/common.py"}


def imports(package: Path) -> list[tuple[str, str, int]]:
    """(file relative to the package, imported module, line) for every absolute import of the
    package's own modules; `from nestor import x` counts as importing nestor.x."""
    name, out = package.name, []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package).as_posix()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                mods = ([f"{name}.{a.name}" for a in node.names] if node.module == name
                        else [node.module])
            else:
                continue
            out += [(rel, m, node.lineno) for m in mods if m.startswith(f"{name}.")]
    return out


def room(rel: str) -> str:
    return rel.split("/")[0].removesuffix(".py")


def order_violations(package: Path) -> list[str]:
    bad = []
    for rel, module, line in imports(package):
        src, dst = room(rel), module.split(".")[1]
        if src == "__init__" or src == dst:
            continue
        for r in (src, dst):
            if r not in RANK:
                bad.append(f"{rel}:{line}: room {r!r} has no place in the order; add it to RANK "
                           "and to docs/architecture.md")
        if src not in RANK or dst not in RANK:
            continue
        up = RANK[dst] > RANK[src] or (RANK[dst] == RANK[src] != 0
                                       and frozenset({src, dst}) not in SIBLINGS)
        if up:
            bad.append(f"{rel}:{line}: {src} imports {module}, which is not below it")
    return bad


def hidden_readers(package: Path) -> set[str]:
    return {rel for rel, module, _ in imports(package)
            if module == HIDDEN or module.startswith(HIDDEN + ".")}


@pytest.fixture
def made_up(tmp_path):
    pkg = tmp_path / "nestor"
    for rel, text in {"job/probe.py": "from nestor.sandbox import run\n",
                      "sandbox/run.py": "def f():\n    from nestor.job import probe\n",
                      "agent/prompt.py": "from nestor import tasks\nimport nestor.tasks.hidden\n",
                      "sft/x.py": "from nestor.outer.loop import go\n"}.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(text)
    return pkg


def test_the_checker_catches_an_upward_import_a_sibling_and_a_hidden_reader(made_up):
    bad = order_violations(made_up)
    assert len(bad) == 2, bad
    assert bad[0].startswith("sandbox/run.py:2: sandbox imports nestor.job")  # lazy, still up
    assert "sft imports nestor.outer.loop" in bad[1]  # one rank, not siblings
    assert hidden_readers(made_up) == {"agent/prompt.py"}


def test_imports_point_down_the_rooms_order():
    assert order_violations(NESTOR) == []


def test_only_the_trusted_scorer_and_nestor_eval_import_the_hidden_eval():
    readers = hidden_readers(NESTOR)
    assert readers, "no module imports the hidden eval: has it moved? update HIDDEN"
    assert readers <= HIDDEN_READERS, f"{sorted(readers - HIDDEN_READERS)} import {HIDDEN}"
