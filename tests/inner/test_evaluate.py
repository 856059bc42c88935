import json

import pytest
from typer.testing import CliRunner

from nestor.cli import app
from nestor.inner import evaluate as ev
from nestor.models.registry import ModelNotFoundError, load_model
from nestor.models.sampler import sample
from nestor.tasks import TaskError, TaskRegistry
from nestor.tasks.hidden import EvalItem, HiddenEval, hidden_eval


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny-s")


@pytest.fixture()
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("NESTOR_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    return tmp_path / "cache"


def test_wilson_interval():
    assert ev.wilson(0, 20)[0] == 0.0 and ev.wilson(0, 20)[1] > 0.1
    assert ev.wilson(20, 20)[1] == 1.0 and ev.wilson(20, 20)[0] < 0.9
    lo, hi = ev.wilson(50, 200)
    assert lo < 0.25 < hi and hi - lo < 0.13


def test_score_counts_exactly_what_the_model_says(tiny):
    model, tok = tiny
    real = hidden_eval(TaskRegistry().get("reverse"), n=20)
    prompts = [ev.chat_prompt_ids(tok, item.prompt) for item in real.items]
    replies = sample(model, prompts, real.max_new_tokens, eos_id=tok.eos_token_id,
                     pad_id=tok.pad_token_id, greedy=True).texts
    # Items whose answers are the model's own replies score 1; perturbed answers score 0.
    right = tuple(EvalItem(i.input, i.prompt, r) for i, r in zip(real.items, replies, strict=True))
    wrong = tuple(EvalItem(i.input, i.prompt, r + "#") for i, r in zip(real.items, replies,
                                                                        strict=True))
    half = right[:10] + wrong[10:]
    assert ev.score_model(model, tok, HiddenEval("reverse", 0, right, 12)).accuracy == 1.0
    result = ev.score_model(model, tok, HiddenEval("reverse", 0, half, 12), batch_size=7)
    assert result.accuracy == 0.5 and result.n == 20
    assert result.ci95[0] < 0.5 < result.ci95[1]


def test_evaluate_caches_pre_scores(tiny, cache_dir):
    first = ev.evaluate("tiny-s", ["max"], n=20)
    files = list((cache_dir / "prescores").glob("*.json"))
    assert len(files) == 1 and first[0].n == 20 and first[0].task == "max"
    files[0].write_text(json.dumps({**first[0].model_dump(), "accuracy": 0.123}))
    assert ev.pre_score("tiny-s", "max", n=20).accuracy == 0.123  # served from the cache
    assert ev.evaluate("tiny-s", ["max"], n=20, use_cache=False)[0] == first[0]
    ev.evaluate("tiny-s", ["max"], n=21)  # another n is another key
    assert len(list((cache_dir / "prescores").glob("*.json"))) == 2
    files[0].write_text("{not json")  # a corrupt entry is recomputed, not an error
    assert ev.pre_score("tiny-s", "max", n=20) == first[0]


def test_pre_score_cache_is_keyed_by_what_changes_a_score(cache_dir, monkeypatch):
    import transformers

    from nestor.models.registry import resolve_model_dir

    def path(**kw):
        return ev.cache_path("tiny-s", resolve_model_dir("tiny-s"), "max", 0, 20, **kw)

    assert path() == path()
    assert path(dtype="bfloat16") != path()
    assert "cpu" in ev.score_key("cpu")
    before = path()
    monkeypatch.setattr(transformers, "__version__", "0.0.0-other")  # another library build
    assert path() != before


def test_the_thread_count_is_not_in_the_key_because_it_changes_no_score(tiny):
    """Workers score under one thread, `nestor eval` under all: one cached pre-score serves
    both only if their greedy replies agree token for token."""
    import torch

    model, tok = tiny
    item_prompts = [ev.chat_prompt_ids(tok, i.prompt)
                    for i in hidden_eval(TaskRegistry().get("reverse"), n=40).items]
    replies, before = {}, torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            replies[threads] = sample(model, item_prompts, 12, eos_id=tok.eos_token_id,
                                      pad_id=tok.pad_token_id, greedy=True).texts
    finally:
        torch.set_num_threads(before)
    assert replies[1] == replies[2]


def test_bad_names_raise_clear_errors(cache_dir):
    with pytest.raises(TaskError, match="unknown task"):
        ev.evaluate("tiny-s", ["nope"], n=20)
    with pytest.raises(ModelNotFoundError, match="unknown model"):
        ev.evaluate("tiny-xl", ["max"], n=20)


def test_cli_eval_json_and_errors(cache_dir):
    runner = CliRunner()
    out = runner.invoke(app, ["eval", "--model", "tiny-s", "--task", "length", "--n", "20",
                              "--json"])
    assert out.exit_code == 0, out.output
    payload = json.loads(out.stdout)
    assert payload["model"] == "tiny-s"
    (row,) = payload["results"]
    assert row["task"] == "length" and row["n"] == 20 and len(row["ci95"]) == 2
    for args in (["--model", "tiny-xl", "--task", "length"], ["--model", "tiny-s", "--task", "x"]):
        bad = runner.invoke(app, ["eval", *args])
        assert bad.exit_code == 2
        assert "error:" in bad.output and "Traceback" not in bad.output
        assert len(bad.output.strip().splitlines()) == 1


def test_cli_eval_tasks_flag_as_bench_and_each_result_once(cache_dir):
    # `--tasks a,b` as `bench agents --tasks` takes it; each task's result is printed once (the
    # table), not also as a progress line
    out = CliRunner().invoke(app, ["eval", "--model", "tiny-s", "--tasks", "length,vowels",
                                   "--n", "10"])
    assert out.exit_code == 0, out.output
    for task in ("length", "vowels"):
        assert sum(line.split("│")[1].strip() == task for line in out.output.splitlines()
                   if line.count("│") > 2) == 1, out.output
        assert f"{task}:" not in out.output  # the old `task: acc [lo, hi] n=` progress line
