import json
import shutil
from pathlib import Path

from typer.testing import CliRunner

from nestor.cli import app
from nestor.tasks import TaskRegistry
from nestor.tasks.hidden import hidden_eval

runner = CliRunner()


def test_list_json_includes_heldout():
    out = runner.invoke(app, ["tasks", "list", "--json", "--include-heldout"])
    assert out.exit_code == 0
    rows = json.loads(out.stdout)
    assert {"id", "family", "title", "heldout"} <= set(rows[0])
    assert len(rows) >= 12 and len({r["family"] for r in rows}) >= 4
    assert len({r["family"] for r in rows if r["heldout"]}) == 1
    plain = json.loads(runner.invoke(app, ["tasks", "list", "--json"]).stdout)
    assert not any(r["heldout"] for r in plain)


def test_show_never_prints_hidden_items():
    reg = TaskRegistry()
    for ref in reg.tasks(include_heldout=True):
        printed = runner.invoke(app, ["tasks", "show", ref.id, "--json"]).stdout
        printed += runner.invoke(app, ["tasks", "show", ref.id]).stdout
        spec = json.loads(runner.invoke(app, ["tasks", "show", ref.id, "--json"]).stdout)
        assert spec["id"] == ref.id and spec["examples"]
        for item in hidden_eval(ref).items:
            # prompts print delimited: as JSON strings and as Markdown code spans
            assert f'"{item.prompt}"' not in printed and f"`{item.prompt}`" not in printed


def test_show_unknown_task_is_one_line_exit_2():
    out = runner.invoke(app, ["tasks", "show", "no-such-task"])
    assert out.exit_code == 2
    assert "unknown task 'no-such-task'" in out.output
    assert "Traceback" not in out.output


FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def test_outside_module_shows_up(monkeypatch):
    # an absolute entry: the CLI drops relative ones (they mean the cwd, maybe a job's dir)
    monkeypatch.syspath_prepend(str(FIXTURES))
    out = runner.invoke(app, ["tasks", "list", "--json", "--tasks-module", "my_tasks"])
    assert out.exit_code == 0, out.output
    assert "echo" in {r["id"] for r in json.loads(out.stdout)}


def test_module_named_by_file_loads_without_touching_sys_path(monkeypatch, tmp_path):
    import sys

    shutil.copy(FIXTURES / "my_tasks.py", tmp_path / "my_tasks.py")
    monkeypatch.chdir(tmp_path)
    before = list(sys.path)
    out = runner.invoke(app, ["tasks", "list", "--json", "--tasks-module", "./my_tasks.py"])
    assert out.exit_code == 0, out.output
    assert "echo" in {r["id"] for r in json.loads(out.stdout)}
    assert str(tmp_path) not in sys.path and set(sys.path) <= set(before)


def test_a_module_file_travels_as_an_absolute_path(monkeypatch, tmp_path):
    from nestor.tasks.registry import module_ref

    monkeypatch.chdir(tmp_path)
    assert module_ref("./plugins/my_tasks.py") == str(tmp_path / "plugins" / "my_tasks.py")
    assert module_ref("my_pkg.my_tasks") == "my_pkg.my_tasks"


def test_module_is_not_searched_in_the_cwd(monkeypatch, tmp_path):
    shutil.copy(FIXTURES / "my_tasks.py", tmp_path / "cwd_only_tasks.py")
    monkeypatch.chdir(tmp_path)
    out = runner.invoke(app, ["tasks", "list", "--json", "--tasks-module", "cwd_only_tasks"])
    assert out.exit_code == 2 and "No module named 'cwd_only_tasks'" in out.output


def test_broken_module_is_one_line_error():
    out = runner.invoke(app, ["tasks", "list", "--tasks-module", "tests.fixtures.broken_tasks"])
    assert out.exit_code == 2
    assert "tests.fixtures.broken_tasks" in out.output and "malformed" in out.output
    assert len(out.output.strip().splitlines()) == 1
