"""Workspace file tools: confinement, quotas, exact edits, and errors instead of exceptions."""

import json
import os
import stat

import pytest

from nestor.sandbox.workspace import TOOL_NAMES, TOOL_SCHEMAS, Workspace, WorkspaceQuota


@pytest.fixture
def ws(tmp_path):
    (tmp_path / "outside.txt").write_text("secret outside the workspace")
    return Workspace(tmp_path / "job", WorkspaceQuota(max_files=4, max_file_bytes=1000,
                                                      max_total_bytes=1500))


def snapshot(root):
    return sorted((str(p.relative_to(root)), p.is_symlink() or p.read_bytes())
                  for p in root.rglob("*") if p.is_symlink() or p.is_file())


def test_schemas_are_openai_function_tools():
    assert TOOL_NAMES == ("list_files", "read_file", "write_file", "edit_file", "delete_file",
                          "submit")
    for schema in TOOL_SCHEMAS:
        assert schema["type"] == "function"
        fn = schema["function"]
        assert fn["description"] and fn["parameters"]["type"] == "object"
        assert set(fn["parameters"]["required"]) == set(fn["parameters"]["properties"])
        json.dumps(schema)
    edit = next(s["function"] for s in TOOL_SCHEMAS if s["function"]["name"] == "edit_file")
    assert list(edit["parameters"]["properties"]) == ["path", "old_string", "new_string"]


def test_write_read_list_delete_round_trip(ws):
    assert ws.call("write_file", {"path": "env/pkg/mod.py", "content": "x = 1\n"}) == \
        "ok: wrote 6 bytes to env/pkg/mod.py"
    assert ws.call("read_file", {"path": "./env//pkg/mod.py"}) == "x = 1\n"
    listing = ws.call("list_files", {})
    assert "env/pkg/mod.py (6 bytes)" in listing and "1/4 files, 6/1500 bytes" in listing
    assert ws.call("delete_file", {"path": "env/pkg/mod.py"}) == "ok: deleted env/pkg/mod.py"
    assert not (ws.root / "env").exists()  # emptied directories are pruned
    assert "(no files yet)" in ws.list_files()


def test_written_files_are_readable_by_the_sandbox_user(ws):
    old = os.umask(0o077)
    try:
        ws.write_file("env/a.py", "pass\n")
    finally:
        os.umask(old)
    assert stat.S_IMODE((ws.root / "env" / "a.py").stat().st_mode) == 0o644
    assert stat.S_IMODE((ws.root / "env").stat().st_mode) == 0o755


@pytest.mark.parametrize("path, expected", [
    ("../outside.txt", "'..' is not allowed"),
    ("env/../../outside.txt", "'..' is not allowed"),
    ("/etc/passwd", "absolute paths are not allowed"),
    ("~/.bashrc", "absolute paths are not allowed"),
    ("env\\x.py", "use '/'"),
    ("bad\x00name", "NUL byte"),
    ("a" * 300, "longer than 200 characters"),
    ("a" * 90 + ".py", "longer than 80 characters"),
    ("/".join(["d"] * 12) + "/f", "nested deeper"),
    ("", "path is empty"),
    (".", "names the job directory itself"),
    ("my file.py", "characters outside"),
    ("..." , "characters outside"),
])
def test_bad_paths_are_errors(ws, tmp_path, path, expected):
    before = snapshot(tmp_path)
    for tool, args in [("read_file", {}), ("write_file", {"content": "pwned"}),
                       ("delete_file", {})]:
        out = ws.call(tool, {"path": path, **args})
        assert out.startswith("error: ") and expected in out, (tool, out)
    assert snapshot(tmp_path) == before


def test_symlinks_on_the_path_are_refused(ws, tmp_path):
    ws.write_file("env/a.py", "x")
    os.symlink(tmp_path / "outside.txt", ws.root / "link.txt")
    os.symlink(tmp_path, ws.root / "dirlink")
    os.symlink(tmp_path, ws.root / "env" / "inner")
    for path in ["link.txt", "dirlink/outside.txt", "env/inner/outside.txt"]:
        for tool, args in [("read_file", {}), ("write_file", {"content": "pwned"}),
                           ("edit_file", {"old_string": "secret", "new_string": "pwned"})]:
            out = ws.call(tool, {"path": path, **args})
            assert out.startswith("error: ") and "symlink" in out, (tool, path, out)
    assert (tmp_path / "outside.txt").read_text() == "secret outside the workspace"
    assert "link.txt (symlink: not allowed, delete it)" in ws.list_files()
    # deleting the link removes the link, never its target
    assert ws.delete_file("link.txt") == "ok: deleted link.txt"
    assert (tmp_path / "outside.txt").exists()


def test_special_files_are_refused(ws):
    os.mkfifo(ws.root / "pipe")
    assert "special file" in ws.read_file("pipe")  # and it does not block
    assert "special file" in ws.write_file("pipe", "x")
    ws.write_file("env/a.py", "x")
    assert "is a directory" in ws.read_file("env")
    assert "is a file, not a directory" in ws.write_file("env/a.py/b.py", "x")


def test_quotas(ws):
    assert "limit per file is 1000 bytes" in ws.write_file("big.txt", "x" * 1001)
    for i in range(3):
        assert ws.write_file(f"f{i}.txt", "x" * 400).startswith("ok")
    out = ws.write_file("f3.txt", "x" * 400)
    assert "would hold 1600 bytes (limit 1500)" in out
    assert ws.write_file("f0.txt", "y" * 500).startswith("ok")  # overwriting counts the delta
    assert ws.write_file("f3.txt", "x").startswith("ok")
    assert "already holds 4 files (limit 4)" in ws.write_file("f4.txt", "x")
    assert not (ws.root / "f4.txt").exists() and not (ws.root / "big.txt").exists()
    assert "1000 bytes" in ws.edit_file("f0.txt", "y" * 500, "z" * 1200)
    assert ws.read_file("f0.txt") == "y" * 500


def test_edit_file_needs_exactly_one_match(ws):
    ws.write_file("env/r.py", "def f():\n    return 0\n\ndef g():\n    return 0\n")
    out = ws.edit_file("env/r.py", "return 0", "return 1")
    assert out.startswith("error: ") and "occurs 2 times" in out
    out = ws.edit_file("env/r.py", "return 2", "return 1")
    assert out.startswith("error: ") and "not found" in out
    assert "old_string is empty" in ws.edit_file("env/r.py", "", "x")
    before = ws.read_file("env/r.py")
    out = ws.edit_file("env/r.py", "def g():", "def g():")  # a no-op "repair" is told so
    assert out.startswith("error: ") and "change nothing" in out
    assert ws.read_file("env/r.py") == before
    out = ws.edit_file("env/r.py", "def g():\n    return 0", "def g():\n    return 1")
    assert out == "ok: replaced 1 occurrence at line 4 of env/r.py"
    assert ws.read_file("env/r.py").endswith("def g():\n    return 1\n")
    assert "does not exist" in ws.edit_file("env/none.py", "a", "b")


def test_call_never_raises_on_bad_tool_calls(ws):
    cases = [("nope", {}), ("read_file", None), ("read_file", "{not json"),
             ("read_file", {"pth": "a"}), ("read_file", {"path": 3}), ("read_file", [1, 2]),
             ("write_file", {"path": "a.txt"}), ("submit", {}),
             ("write_file", {"path": "a.txt", "content": "\ud800"}),
             ("read_file", {"path": "missing.txt"})]
    for name, args in cases:
        out = ws.call(name, args)
        assert isinstance(out, str) and out.startswith("error: "), (name, args, out)
    assert ws.call("read_file", '{"path": "missing.txt"}').startswith("error: ")
    assert ws.call("write_file", json.dumps({"path": "a.txt", "content": "é"})).startswith("ok")


def test_binary_files_are_reported_not_decoded(ws):
    (ws.root / "blob.bin").write_bytes(b"\xff\xfe\x00")
    assert "not UTF-8 text" in ws.read_file("blob.bin")
