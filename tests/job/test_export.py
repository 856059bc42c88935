"""Every prime-rl export against the schema recorded from prime-rl's own classes.

prime-rl cannot be installed here (not on PyPI, GPU wheels), so nestor/job/prime_rl_schema.json
holds the type and bounds of each key we write, taken by benchmarks/prime_rl_check.py
--write-schema from the commit it names; that script also runs prime-rl's real `rl --dry-run`
on the same exports where a checkout is at hand."""

import json
import math
import shutil
import tomllib
from pathlib import Path

import pytest
import tomli_w

from nestor.inner.prime_rl import render_config, visible_gpus
from nestor.job.config import JobConfig
from nestor.job.export import (
    CARRIED,
    HF_REPOS,
    NOT_CARRIED,
    RENDERERS,
    launch_env,
    to_prime_rl,
    to_prime_rl_toml,
)
from nestor.job.layout import LayoutError, read_layout

ROOT = Path(__file__).resolve().parents[2]
GOOD = ROOT / "examples" / "jobs" / "good-reverse"
SCHEMA = json.loads((ROOT / "nestor" / "job" / "prime_rl_schema.json").read_text())
TYPES = {"bool": bool, "int": int, "float": (int, float), "str": str, "Path": str}


def leaves(d: dict, prefix: str = ""):
    for k, v in d.items():
        if isinstance(v, dict):
            yield from leaves(v, f"{prefix}{k}.")
        elif isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
            for x in v:
                yield from leaves(x, f"{prefix}{k}[].")
        else:
            yield f"{prefix}{k}", v


def schema_problems(rl: dict) -> list[str]:
    problems = []
    for path, value in leaves(rl):
        field = SCHEMA["keys"].get(path)
        if field is None:
            problems.append(f"{path}: no such key in prime-rl {SCHEMA['prime_rl_commit'][:7]}")
            continue
        ann = field["annotation"]
        if "enum" in field:
            if value not in field["enum"]:
                problems.append(f"{path}={value!r} not one of {field['enum']}")
            continue
        allowed = tuple(t for name, t in TYPES.items() if name in ann)
        if isinstance(value, bool) and "bool" not in ann or not isinstance(value, allowed):
            problems.append(f"{path}={value!r} is not {ann}")
            continue
        for bound, ok in (("ge", value.__ge__), ("gt", value.__gt__), ("le", value.__le__),
                          ("lt", value.__lt__)):
            if bound in field and not ok(field[bound]):
                problems.append(f"{path}={value!r} breaks {bound} {field[bound]}")
    return problems


def make_job(tmp_path: Path, extra: str = "") -> Path:
    job = Path(shutil.copytree(GOOD, tmp_path / "job",
                               ignore=shutil.ignore_patterns("__pycache__")))
    keys = {line.split("=")[0].strip() for line in extra.splitlines()}
    kept = [ln for ln in (job / "config.toml").read_text().splitlines()
            if ln.split("=")[0].strip() not in keys]
    (job / "config.toml").write_text("\n".join(kept) + "\n" + extra)
    return job


VARIANTS = [
    ("", 1),
    ("", 2),
    ("lora_rank = 8\nlora_alpha = 16\n", 1),
    ("grad_clip = 0.0\nweight_decay = 0.05\nskip_zero_variance = false\nseed = 7\n", 1),
    *((f'base_model = "{m}"\n', 1) for m in HF_REPOS),
    *((f'base_model = "{m}"\nlora_rank = 16\n', 4) for m in HF_REPOS),
]


@pytest.mark.parametrize("extra,gpus", VARIANTS)
def test_every_export_fits_prime_rls_recorded_schema(tmp_path, extra, gpus):
    job = make_job(tmp_path, extra)
    cli = tomllib.loads(to_prime_rl_toml(job, gpus=gpus))
    pool = tomllib.loads(tomli_w.dumps(render_config(job, tmp_path / "out", "/models/base",
                                                     gpus=gpus)))
    for rl in (cli, pool):
        assert schema_problems(rl) == []
        # a complete run: rl starts vLLM, weights reach it on disk, on the worker's GPUs
        assert "inference" in rl and rl["weight_broadcast"] == {"type": "filesystem"}
        dep = rl["deployment"]
        assert dep["num_infer_gpus"] == 1 and dep["num_train_gpus"] == max(1, gpus - 1)
        assert ("gpu_memory_utilization" in rl["inference"]["vllm"]) == (gpus == 1)
        assert rl["orchestrator"]["max_off_policy_steps"] == 0  # on-policy like ours
        assert rl["orchestrator"]["renderer"]["name"] != "auto"  # local paths never resolve
    assert pool["model"]["name"] == "/models/base"


def test_qwen3_renderers_are_prime_rls_own():
    assert {HF_REPOS[m]: r for m, r in RENDERERS.items()} == SCHEMA["renderer_map"]


def test_knobs_carried_are_written_and_the_rest_listed(tmp_path):
    fields = set(JobConfig.model_fields)
    assert set(CARRIED) | set(NOT_CARRIED) == fields and not set(CARRIED) & set(NOT_CARRIED)
    assert all(key in SCHEMA["keys"] for key in CARRIED.values())
    job = make_job(tmp_path, "grad_clip = 0.0\nweight_decay = 0.05\nlora_rank = 4\n"
                             "skip_zero_variance = false\nseed = 7\n")
    written = dict(leaves(to_prime_rl(job)))
    assert written["trainer.optim.weight_decay"] == 0.05
    assert written["trainer.optim.max_norm"] == math.inf  # no clipping, as grad_clip = 0
    assert written["orchestrator.train.filter_zero_advantages"] is False
    assert written["inference.vllm.seed"] == 7 and written["trainer.model.lora.rank"] == 4
    assert all(CARRIED[k] in written for k in CARRIED)
    text = to_prime_rl_toml(job)
    assert all(f"#   {k}=" in text for k in NOT_CARRIED)


def test_default_export_keeps_our_weight_decay_not_prime_rls(tmp_path):
    rl = to_prime_rl(make_job(tmp_path))
    assert rl["trainer"]["optim"]["weight_decay"] == 0.0  # prime-rl's default would be 0.01
    assert rl["trainer"]["optim"]["max_norm"] == 1.0


def test_one_gpu_is_given_to_the_launcher_twice():
    assert launch_env(1, "3") == {"CUDA_VISIBLE_DEVICES": "3,3"}
    assert launch_env(1, None) == {"CUDA_VISIBLE_DEVICES": "0,0"}
    assert launch_env(2, "0,1") == {}
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "2,5"}) == 2
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "4"}) == 1


@pytest.mark.parametrize("name", ["lean", "harbor", "textarena", "nemo_gym", "openenv"])
def test_a_package_named_like_a_verifiers_builtin_is_refused(tmp_path, name):
    job = make_job(tmp_path)
    (job / "env" / "reverse_job").rename(job / "env" / name)
    text = (job / "env" / "pyproject.toml").read_text().replace("reverse-job", name)
    (job / "env" / "pyproject.toml").write_text(text)
    with pytest.raises(LayoutError, match="built into verifiers"):
        read_layout(job)


def test_an_upper_case_package_is_refused(tmp_path):
    job = make_job(tmp_path)
    (job / "env" / "reverse_job").rename(job / "env" / "Reverse_job")
    with pytest.raises(LayoutError, match="lower-case"):
        read_layout(job)


def test_cli_export_writes_for_the_gpus_asked(tmp_path):
    from typer.testing import CliRunner

    from nestor.cli import app

    job, out = make_job(tmp_path), tmp_path / "rl.toml"
    result = CliRunner().invoke(app, ["job", "export", str(job), "--prime-rl", str(out),
                                      "--skip-validation"])
    assert result.exit_code == 0, result.output
    assert "CUDA_VISIBLE_DEVICES=0,0 rl @ rl.toml" in out.read_text()
    result = CliRunner().invoke(app, ["job", "export", str(job), "--prime-rl", str(out),
                                      "--gpus", "3", "--skip-validation"])
    assert result.exit_code == 0, result.output
    rl = tomllib.loads(out.read_text())
    assert rl["deployment"] == {"type": "single_node", "num_train_gpus": 2, "num_infer_gpus": 1}
    assert "gpu_memory_utilization" not in rl["inference"]["vllm"]
