"""Walk every shell block of the docs in order, as a new user would, and run it.

    .venv/bin/python benchmarks/docs_walk.py            # run the walk (tens of minutes on a CPU)
    .venv/bin/python benchmarks/docs_walk.py --plan     # print what would run or be skipped

The README first, then the docs in the README's map order. A block is a fenced ```bash / ```sh
block, or an untagged one whose first line is a command; lines that are not commands (a
block's sample output) are left out. Commands run one after another in one fresh temporary
directory (its own NESTOR_CACHE too), so results accumulate as they would for a user:
`nestor job init DIR` makes the job later commands use, `runs/episode-…` is the episode
directory an earlier command wrote. Placeholders get the walk's values (DIR, ID, JOB_DIR, …),
`[optional]` parts are dropped, and heavy commands get small caps (`--steps 1`,
`--max-steps 2`, `--episodes 1`). A command that needs a GPU, a cluster, an API key, or that
would take more than a few minutes here, is skipped with its reason listed.

A command fails when it exits non-zero (1 is expected for a job in examples/jobs/bad-*) or
when its output holds a traceback or a leaked-semaphore warning. The last line is one JSON
object: commands, ran, passed, failed (with each failure's command and output tail), skipped
(with reasons), wall_s.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> str:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return str(sock.getsockname()[1])


PORT = _free_port()
# the README's map order: what a reader meets first runs first
DOCS = ["README.md", "docs/architecture.md", "docs/tasks.md", "docs/models.md",
        "docs/job-format.md", "docs/sandbox.md", "docs/inner.md", "docs/pool.md",
        "docs/agent.md", "docs/outer.md", "docs/report.md", "docs/agents.md", "docs/lm-arc.md",
        "docs/cluster.md"]
COMMAND = re.compile(r"^(nestor|make|\.venv/bin/python|python|curl|export|pip|uv)(?=\s|$)")
FAILED_OUTPUT = re.compile(r"Traceback \(most recent call last\)|leaked semaphore")

# (pattern, reason): a command matching one is listed, not run
SKIP = [
    (r"^make test\b", "the test suite itself (`make test`), not a walk step"),
    (r"^(pip|uv) ", "an install step (the walk runs in the installed .venv)"),
    (r"API_KEY", "needs an API key"),
    (r"openai:gpt|api\.openai\.com", "needs an OpenAI API key"),
    (r"openai:my-model", "needs an endpoint serving `my-model` (the serve block below runs one)"),
    (r"--backend ray|\bray start\b", "needs a Ray cluster"),
    (r"qwen3-|Qwen/Qwen3", "needs a Qwen3 checkpoint and a GPU"),
    (r"--device cuda", "needs a GPU"),
    (r"^nestor pods\b", "rents GPU pods (needs a RunPod key)"),
    (r"--model smollm2-135m.*episode run|episode run.*--model smollm2-135m",
     "an smollm2-135m agent on a CPU: 18 min per episode (docs/agents.md)"),
    (r"benchmarks/arc\.py", "the arc: 6-12 min a seed, run on its own"),
    (r"^nestor sft\b.*smollm2|lm:smollm2|configs/lm-arc\.toml",
     "the SmolLM2 warm start or RL: 45-90 min of SFT, ~10 min an RL step on a CPU (docs/lm-arc.md)"),
    (r"benchmarks/lm_arc\.py", "the LM arc: hours on a CPU, run on its own (docs/lm-arc.md)"),
    (r"benchmarks/repair_eval\.py --agent lm", "the LM agent repairing slipped jobs: ~10 min to an hour on a CPU, run on its own"),
    (r"benchmarks/repair_rl\.py", "RL on the LM agent's repairs: ~3 min a step on a CPU, needs a warm start's adapter"),
    (r"benchmarks/clone_accuracy\.py", "scores the LM arc's warm starts: needs their adapters (hours of SFT)"),
    (r"benchmarks/(loop_stop|lm_arc_report|lora_drift|lm_train_precision|repair_compare)\.py", "reads the LM arc's recorded runs: needs its run directories (hours)"),
    (r"gpu_check\.py.*smollm2", "the SmolLM2 agent's check, for a GPU with the lm-arc warm start"),
]

# (pattern, replacement): caps on heavy commands and values for placeholders
REWRITE = [
    (r"^make quickstart\b.*", "nestor quickstart --steps 1"),
    (r"^(nestor (?:train|quickstart)\b(?!.*--steps).*)", r"\1 --steps 1"),
    (r"^(nestor job train\b(?!.*--max-steps).*)", r"\1 --max-steps 2"),
    (r"--max-steps \d+", "--max-steps 2"),
    (r"--episodes \d+", "--episodes 1"),
    (r"--secrets \d+", "--secrets 2 --tasks reverse"),  # contamination_refusals.py
    (r"^(nestor eval\b(?!.*--n ).*)", r"\1 --n 20"),
    (r"^(nestor models pretrain\b.*--model (\S+).*)", r"\1 --steps 2 --out pretrained-\2"),
    (r"^(nestor pool run\b.*)", r"\1 --timeout 300"),
    (r"^(\.venv/bin/python benchmarks/gpu_check\.py\b.*)", r"\1 --steps 2 --n 20"),
    (r"--task ID\b", "--task length"),  # the good job the walk trains is good-length's
    (r"tasks show ID\b", "tasks show reverse"),
]


@dataclass
class Step:
    doc: str
    line: int
    text: str  # as written in the doc (comment stripped, continuations joined)
    command: str = ""  # what runs, after rewrites and placeholders
    skip: str = ""  # the reason it is not run
    background: bool = False  # `cmd &`: a server the block's next commands talk to
    result: dict = field(default_factory=dict)


def _strip_comment(line: str) -> str:
    """The line without a trailing `# comment` (a # inside quotes stays)."""
    quote = None
    for i, ch in enumerate(line):
        if ch in "'\"" and quote in (None, ch):
            quote = None if quote else ch
        elif ch == "#" and quote is None and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line.rstrip()


def blocks(doc: str) -> list[tuple[int, list[str]]]:
    """(first line number, lines) of each shell block of `doc`."""
    out, lines = [], (ROOT / doc).read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        m = re.match(r"^```(\w*)\s*$", lines[i])
        if not m:
            i += 1
            continue
        lang, start = m.group(1), i + 1
        end = next((j for j in range(start, len(lines)) if lines[j].startswith("```")), len(lines))
        body = lines[start:end]
        first = next((x.strip() for x in body if x.strip()), "")
        if lang in ("bash", "sh", "shell", "console") or (lang == "" and COMMAND.match(first)):
            out.append((start + 1, body))
        i = end + 1
    return out


def commands(doc: str) -> list[Step]:
    steps = []
    for start, body in blocks(doc):
        pending, at = "", start
        for n, raw in enumerate(body):
            line = _strip_comment(raw) if not pending else raw.rstrip()
            if not pending:
                at = start + n
            if line.endswith("\\"):
                pending += line[:-1].strip() + " "
                continue
            text = (pending + _strip_comment(line).strip()).strip()
            pending = ""
            if text and COMMAND.match(text):
                steps.append(Step(doc, at, text))
    return steps


def plan(step: Step, ctx: dict[str, str]) -> Step:
    """Decide what runs: a skip reason, or the command with caps and placeholder values."""
    for pattern, reason in SKIP:
        if re.search(pattern, step.text):
            step.skip = reason
            return step
    cmd = step.text
    if cmd.endswith("&"):
        step.background, cmd = True, cmd[:-1].strip()
    cmd = re.sub(r"\s\[[^\]]*\](\.\.\.)?", "", cmd)  # `[--json]`, `[--model M]...`: optional
    for pattern, repl in REWRITE:
        cmd = re.sub(pattern, repl, cmd)
    values = {"JOB_DIR...": ctx["good_job"], "JOB_DIR": ctx["good_job"], "RUN_DIR": ctx["run"],
              "runs/episode-…": ctx["episode_dir"], "DIR": "walk-job", "ID": ctx["episode_id"]}
    for name, value in values.items():
        cmd = re.sub(rf"(?<![\w/.-]){re.escape(name)}(?![\w/-])", value, cmd)
    port = ctx.get("port", "8000")  # a free port: the machine may be shared
    cmd = re.sub(r"(--port |localhost:|127\.0\.0\.1:)8000\b", rf"\g<1>{port}", cmd)
    if cmd.startswith(".venv/bin/python"):
        cmd = f"{sys.executable}{cmd[len('.venv/bin/python'):]}"
        cmd = re.sub(r"\s(benchmarks/\S+)", lambda m: f" {ROOT / m.group(1)}", cmd)
    left = re.findall(r"(?<![\w-])[A-Z][A-Z_]{1,}(?![\w-])", cmd)
    if left or "…" in cmd or "..." in cmd:
        step.skip = f"a placeholder the walk has no value for: {(left or ['…'])[0]}"
    step.command = cmd
    return step


def _context(cwd: Path) -> dict[str, str]:
    """Placeholder values from what earlier commands left in the walk's directory."""
    runs = sorted((cwd / "runs").glob("*")) if (cwd / "runs").is_dir() else []
    episodes = [p for p in runs if p.name.startswith("episode-")]
    trained = [p for p in runs if (p / "metrics.jsonl").is_file()]
    episode_id = "ID"
    if episodes and (episodes[-1] / "episodes").is_dir():
        ids = sorted(p.name for p in (episodes[-1] / "episodes").iterdir())
        episode_id = ids[0] if ids else "ID"
    return {"good_job": str(ROOT / "examples" / "jobs" / "good-length"), "port": PORT,
            "episode_dir": str(episodes[-1].relative_to(cwd)) if episodes else "runs/episode-…",
            "episode_id": episode_id,
            "run": str(trained[-1].relative_to(cwd)) if trained else "RUN_DIR"}


def _wait_for_server(cmd: str, timeout_s: float = 300.0) -> bool:
    import httpx

    port = re.search(r"--port (\d+)", cmd)
    url = f"http://127.0.0.1:{port.group(1) if port else 8000}/v1/models"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return True
        except httpx.TransportError:
            time.sleep(1.0)
    return False


def run(steps_by_doc: list[tuple[str, list[Step]]], cwd: Path, timeout_s: float) -> list[Step]:
    env = {**os.environ, "NESTOR_CACHE": str(cwd / ".cache"), "OMP_NUM_THREADS": "1",
           "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
           "PYTHONPATH": f"{ROOT}:{os.environ.get('PYTHONPATH', '')}".rstrip(":")}
    done: list[Step] = []
    for _doc, steps in steps_by_doc:
        servers: list[subprocess.Popen] = []
        try:
            for step in steps:
                plan(step, _context(cwd))
                done.append(step)
                if step.skip:
                    print(f"skip  {step.doc}:{step.line}  {step.text}  ({step.skip})", flush=True)
                    continue
                print(f"run   {step.doc}:{step.line}  {step.command}", flush=True)
                t0 = time.monotonic()
                if step.background:
                    log = (cwd / f"server-{len(servers)}.log").open("wb")
                    servers.append(subprocess.Popen(step.command, shell=True, cwd=cwd, env=env,
                                                    stdout=log, stderr=subprocess.STDOUT,
                                                    start_new_session=True))
                    ok = _wait_for_server(step.command)
                    step.result = {"rc": 0 if ok else 1, "wall_s": round(time.monotonic() - t0, 1),
                                   "tail": "" if ok else "the server did not answer"}
                    continue
                try:
                    proc = subprocess.run(step.command, shell=True, cwd=cwd, env=env,
                                          capture_output=True, text=True, timeout=timeout_s)
                    rc, output = proc.returncode, proc.stdout + proc.stderr
                except subprocess.TimeoutExpired as exc:
                    rc, output = 124, f"timed out after {timeout_s:.0f} s: {exc}"
                allowed = {0, 1} if "examples/jobs/bad-" in step.command else {0}
                bad = FAILED_OUTPUT.search(output)
                step.result = {"rc": rc, "wall_s": round(time.monotonic() - t0, 1),
                               "ok": rc in allowed and not bad, "tail": output[-1500:]}
                print(f"      rc {rc} in {step.result['wall_s']} s"
                      f"{'' if step.result['ok'] else '  FAILED'}", flush=True)
        finally:
            for server in servers:  # a doc's servers end with its blocks
                os.killpg(server.pid, signal.SIGTERM)
                server.wait(timeout=30)
    for step in done:
        if step.background and step.result:
            step.result["ok"] = step.result["rc"] == 0
    return done


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--plan", action="store_true", help="List the steps; run nothing.")
    ap.add_argument("--docs", nargs="*", default=DOCS, help="Docs to walk, in order.")
    ap.add_argument("--timeout", type=float, default=1200.0, help="Cap per command, seconds.")
    ap.add_argument("--keep", type=Path, help="Walk in this directory (kept) instead of a temp.")
    args = ap.parse_args()
    steps_by_doc = [(doc, commands(doc)) for doc in args.docs]
    t0 = time.monotonic()
    if args.plan:
        ctx = {"good_job": str(ROOT / "examples/jobs/good-length"), "episode_dir":
               "runs/episode-<ts>", "episode_id": "<episode id>", "run": "runs/<run>"}
        done = [plan(s, ctx) for _, steps in steps_by_doc for s in steps]
        for s in done:
            print(f"{'skip' if s.skip else 'run '}  {s.doc}:{s.line}  "
                  f"{s.skip and s.text or s.command}{f'  ({s.skip})' if s.skip else ''}")
    else:
        if args.keep:
            args.keep.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="nestor-docs-walk-") as tmp:
            done = run(steps_by_doc, (args.keep or Path(tmp)).resolve(), args.timeout)
    ran = [s for s in done if not s.skip]
    failed = [s for s in ran if not s.result.get("ok")]
    print(json.dumps({
        "commands": len(done), "ran": len(ran), "passed": len(ran) - len(failed),
        "failed": [{"where": f"{s.doc}:{s.line}", "command": s.command, "rc": s.result.get("rc"),
                    "tail": s.result.get("tail", "")[-600:]} for s in failed] if not args.plan
        else [],
        "skipped": [{"where": f"{s.doc}:{s.line}", "command": s.text, "why": s.skip}
                    for s in done if s.skip],
        "wall_s": round(time.monotonic() - t0, 1)}))
    if failed and not args.plan:
        sys.exit(1)


if __name__ == "__main__":
    main()
