"""Run prime-rl's own `rl --dry-run` loader on every config nestor would hand it.

    .venv/bin/python benchmarks/prime_rl_check.py --prime-rl ~/prime-rl
    .venv/bin/python benchmarks/prime_rl_check.py --prime-rl ~/prime-rl --python /tmp/prl-venv/bin/python
    .venv/bin/python benchmarks/prime_rl_check.py --prime-rl ~/prime-rl --write-schema nestor/job/prime_rl_schema.json

For each example job under examples/jobs/good-* and each variant (every bundled base model,
LoRA or full fine-tune, gradient clipping off, one GPU or two) it renders both forms, the
`nestor job export --prime-rl` text and the pool's `render_config`, and loads each with
prime-rl's `rl` entry point (`rl @ file --dry-run`, which validates the whole RLConfig and
writes the resolved sub-configs) in prime-rl's own interpreter: `--python`, else the
checkout's `.venv/bin/python`. The job's env/ is put on that interpreter's path, as
`pip install -e env/` would. prime-rl's sources are taken from the checkout
(`packages/prime-rl-configs/src` and `src`), so the slim config deps suffice: pydantic,
prime-pydantic-config, renderers, verifiers, tomli, tomli-w, psutil, setproctitle.

`--write-schema` records, from prime-rl's classes themselves, the type and bounds of every key
nestor writes and the renderer names, with the checkout's commit (tests/job/test_export.py
holds every export to that file where prime-rl cannot be installed). The last line printed is
one JSON object; the exit code is 1 when any export was refused.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import tomli_w

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from nestor.inner.prime_rl import render_config  # noqa: E402
from nestor.job.export import HF_REPOS, to_prime_rl_toml  # noqa: E402

VARIANTS = {  # name -> (config.toml lines appended, gpus)
    "as-is": ("", 1),
    "two-gpus": ("", 2),
    "lora": ("lora_rank = 8\nlora_alpha = 16\n", 1),
    "no-clip": ("grad_clip = 0.0\nweight_decay = 0.05\nskip_zero_variance = false\n", 1),
    **{f"model-{m}": (f'base_model = "{m}"\n', 1) for m in HF_REPOS},
}

# Runs inside prime-rl's interpreter: argv = [json list of [toml path, env dir, out dir]].
LOADER = r"""
import json, os, sys, traceback
from prime_rl.configs.rl import RLConfig
from prime_rl.entrypoints.rl import rl
from prime_rl.utils.config import cli
results = []
for path, env_dir, out in json.loads(sys.argv[1]):
    sys.path.insert(0, env_dir)
    os.chdir(out)
    try:
        rl(cli(RLConfig, args=["@", path, "--dry-run"]))
        written = sorted(str(p.relative_to(out)) for p in __import__("pathlib").Path(out).rglob("*.json"))
        results.append({"file": path, "ok": bool(written), "written": written})
    except BaseException as exc:
        results.append({"file": path, "ok": False,
                        "error": "".join(traceback.format_exception_only(type(exc), exc))[-1500:]})
    sys.path.remove(env_dir)
print("RESULTS " + json.dumps(results))
"""

# Runs inside prime-rl's interpreter: argv = [json list of dotted key paths]; prints the schema.
SCHEMA = r"""
import json, sys, typing, annotated_types
from pydantic import BaseModel
from prime_rl.configs.rl import RLConfig
import verifiers.v1 as vf
from renderers.base import MODEL_RENDERER_MAP

def members(ann):
    args = typing.get_args(ann)
    if typing.get_origin(ann) is typing.Annotated:
        return members(args[0])
    if args and typing.get_origin(ann) in (typing.Union, __import__("types").UnionType):
        return [m for a in args for m in members(a)]
    return [ann]

def pick(ann, wanted_type):
    models = [m for m in members(ann) if isinstance(m, type) and issubclass(m, BaseModel)]
    for m in models:
        t = m.model_fields.get("type")
        if wanted_type is None or (t is not None and t.default == wanted_type):
            return m
    return models[0] if models else None

def field_of(path, types):
    cls, info = RLConfig, None
    parts = path.replace("[]", "").split(".")
    for i, name in enumerate(parts):
        if cls is not None and name == "env" and "source" in parts[:i]:
            cls = vf.SingleAgentEnvConfig  # prime-rl narrows env to the taskset's; its default
            info = None
            continue
        info = cls.model_fields[name]
        prefix = ".".join(parts[:i + 1])
        cls = pick(info.annotation, types.get(prefix))
        if cls is None and typing.get_origin(info.annotation) is list:
            cls = pick(typing.get_args(info.annotation)[0], types.get(prefix))
    out = {"annotation": str(info.annotation).replace("typing.", "")}
    for m in info.metadata:
        for bound in ("ge", "gt", "le", "lt"):
            if hasattr(m, bound) and getattr(m, bound) is not None:
                out[bound] = getattr(m, bound)
    lits = [a for m in members(info.annotation) if typing.get_origin(m) is typing.Literal
            for a in typing.get_args(m)]
    if lits:
        out["enum"] = lits
    return out

paths, types = json.loads(sys.argv[1])
names = sorted(set(MODEL_RENDERER_MAP.values()) | {"default", "auto"})
schema = {p: field_of(p, types) for p in paths if p != "orchestrator.renderer.name"}
schema["orchestrator.renderer.name"] = {"annotation": "str", "enum": names}  # `name` discriminates
print("SCHEMA " + json.dumps({"keys": schema, "renderer_map": {k: v for k, v in MODEL_RENDERER_MAP.items() if k in sys.argv[2].split(",")}},
                            default=str))
"""


def key_paths(d: dict, prefix: str = "") -> dict[str, object]:
    """Dotted path -> value of every leaf; a list of tables becomes `name[]`."""
    out: dict[str, object] = {}
    for k, v in d.items():
        p = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(key_paths(v, p + "."))
        elif isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
            for x in v:
                out.update(key_paths(x, p + "[]."))
        else:
            out[p] = v
    return out


def exports(work: Path) -> list[dict]:
    """Every (job, variant, form) as a file, with the job's env dir."""
    rows = []
    for job in sorted((ROOT / "examples" / "jobs").glob("good-*")):
        for name, (extra, gpus) in VARIANTS.items():
            dst = work / f"{job.name}--{name}"
            shutil.copytree(job, dst / "job", ignore=shutil.ignore_patterns("__pycache__"))
            cfg = dst / "job" / "config.toml"
            keep = [ln for ln in cfg.read_text().splitlines()
                    if ln.split("=")[0].strip() not in {e.split("=")[0].strip()
                                                        for e in extra.splitlines()}]
            cfg.write_text("\n".join(keep) + "\n" + extra)
            env = str((dst / "job" / "env").resolve())
            for form in ("cli", "pool"):
                out = dst / form
                out.mkdir()
                if form == "cli":
                    text = to_prime_rl_toml(dst / "job", gpus=gpus)
                else:
                    text = tomli_w.dumps(render_config(dst / "job", out / "outputs",
                                                       "/models/base", gpus=gpus))
                (out / "rl.toml").write_text(text)
                rows.append({"job": job.name, "variant": name, "form": form,
                             "file": str(out / "rl.toml"), "env": env, "out": str(out)})
    return rows


def prime_python(prime_rl: Path, python: str | None) -> str:
    if python:
        return python
    venv = prime_rl / ".venv" / "bin" / "python"
    return str(venv) if venv.exists() else sys.executable


def run_in_prime(python: str, prime_rl: Path, code: str, *args: str, timeout: float) -> str:
    paths = [prime_rl / "packages" / "prime-rl-configs" / "src", prime_rl / "src"]
    env = {"PYTHONPATH": ":".join(str(p) for p in paths), "PATH": "/usr/bin:/bin",
           "HOME": str(Path.home()), "PRIME_LOG_LEVEL": "warning"}
    done = subprocess.run([python, "-c", code, *args], env=env, capture_output=True, text=True,
                          timeout=timeout)
    if done.returncode != 0:
        sys.exit(f"prime-rl's interpreter failed (exit {done.returncode}):\n"
                 + done.stderr[-3000:])
    return done.stdout


def commit_of(prime_rl: Path) -> str:
    try:
        return subprocess.run(["git", "-C", str(prime_rl), "rev-parse", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"


def write_schema(prime_rl: Path, python: str, out: Path, work: Path) -> dict:
    paths: dict[str, object] = {}
    for row in exports(work):
        text = Path(row["file"]).read_text()
        import tomllib

        paths.update(key_paths(tomllib.loads(text)))
    types = {p.rsplit(".", 1)[0]: v for p, v in paths.items() if p.endswith(".type")}
    stdout = run_in_prime(python, prime_rl, SCHEMA, json.dumps([sorted(paths), types]),
                          ",".join(HF_REPOS.values()), timeout=600)
    schema = json.loads(stdout.split("SCHEMA ", 1)[1])
    schema = {"prime_rl_commit": commit_of(prime_rl), **schema}
    out.write_text(json.dumps(schema, indent=1, sort_keys=True) + "\n")
    return {"schema": str(out), "keys": len(schema["keys"])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prime-rl", type=Path, required=True, help="a prime-rl checkout")
    ap.add_argument("--python", help="prime-rl's interpreter (default: its .venv, else this one)")
    ap.add_argument("--write-schema", type=Path, help="record the schema of nestor's keys here")
    ap.add_argument("--timeout", type=float, default=1800)
    args = ap.parse_args()
    python = prime_python(args.prime_rl, args.python)
    with tempfile.TemporaryDirectory(prefix="nestor-prl-check-") as tmp:
        if args.write_schema:
            print(json.dumps(write_schema(args.prime_rl, python, args.write_schema, Path(tmp))))
            return
        rows = exports(Path(tmp))
        stdout = run_in_prime(python, args.prime_rl, LOADER,
                              json.dumps([[r["file"], r["env"], r["out"]] for r in rows]),
                              timeout=args.timeout)
        results = json.loads(stdout.split("RESULTS ", 1)[1])
    failed = []
    for row, res in zip(rows, results, strict=True):
        mark = "ok" if res["ok"] else "REFUSED"
        print(f"{mark:8} {row['job']} {row['variant']} ({row['form']})", file=sys.stderr)
        if not res["ok"]:
            print("   " + res.get("error", "wrote no resolved configs").strip(), file=sys.stderr)
            failed.append({k: row[k] for k in ("job", "variant", "form")} | {
                "error": res.get("error", "")})
    print(json.dumps({"prime_rl_commit": commit_of(args.prime_rl), "checked": len(rows),
                      "accepted": len(rows) - len(failed), "refused": failed}))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
