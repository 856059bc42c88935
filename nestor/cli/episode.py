"""`nestor episode run|list|show`: one outer-loop episode, and reading the ledger of past ones."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from nestor.cli.common import (
    JsonOpt,
    TasksModuleOpt,
    console,
    default_out,
    fail,
    out_console,
    pre_post,
    print_json,
    registry,
    require_sandbox,
    shown,
)

app = typer.Typer(no_args_is_help=True, help="Agent episodes: write, validate, train, reward.")
RunDirOpt = typer.Option(None, "--out", "--run-dir", help="Where everything goes "
                         "(ledger.sqlite, episodes/); default runs/episode-<timestamp>.")
ReadRunDirOpt = typer.Option(..., "--run-dir", help="Run directory holding ledger.sqlite "
                             "(required).")


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="episode")


def _make_policy(kind: str, checkpoint: Path | None, seed: int, budget: int, model: str,
                 max_new_tokens: int = 512):
    if kind == "composer":
        from nestor.policy.composer import Composer, ComposerConfig

        policy = Composer(ComposerConfig(seed=seed, token_budget=budget))
        if checkpoint is not None:
            if not checkpoint.is_file():
                fail(f"composer checkpoint {checkpoint} not found")
            policy.load(checkpoint)
        return policy
    if kind == "lm":
        from nestor.policy.lm import LMPolicy

        policy = LMPolicy.from_pretrained(model, max_new_tokens=max_new_tokens, seed=seed)
        if checkpoint is not None:
            policy.load(checkpoint)
        return policy
    if kind in ("tinker", "tinker-local"):
        from nestor.policy.tinker import TinkerPolicyError, make_tinker_policy

        try:
            return make_tinker_policy(model, local=kind == "tinker-local", seed=seed,
                                      max_new_tokens=max_new_tokens, checkpoint=checkpoint)
        except TinkerPolicyError as exc:
            fail(str(exc))
    fail(f"unknown policy {kind!r}; choose composer, lm, tinker or tinker-local")


@app.command("run")
def run(
    task: str = typer.Option(..., "--task", help="Task id (see `nestor tasks list`)."),
    policy: str = typer.Option("composer", "--policy", help="composer, lm, tinker (Tinker's "
                               "API, $TINKER_API_KEY) or tinker-local (its offline stand-in)."),
    run_dir: Path | None = RunDirOpt,
    difficulty: int = typer.Option(0, "--difficulty", min=0, max=3),
    budget: int = typer.Option(150_000, "--budget", min=1000,
                               help="Sampled-token cap of the inner job."),
    timeout: float = typer.Option(600.0, "--timeout", min=1.0, help="Inner job wall cap, s."),
    attempts: int = typer.Option(3, "--attempts", min=1, max=10, help="Submits allowed."),
    max_turns: int = typer.Option(12, "--max-turns", min=1, max=200),
    seed: int = typer.Option(0, "--seed", min=0, help="Policy sampling seed."),
    checkpoint: Path | None = typer.Option(None, "--checkpoint", help="Policy weights to load."),
    model: str = typer.Option("tiny-m", "--model", help="The lm or tinker policy's model."),
    max_new_tokens: int = typer.Option(512, "--max-new-tokens", min=16, max=8192,
                                       help="lm, tinker: token cap per turn (a dataset file "
                                       "needs hundreds)."),
    prompt_style: str = typer.Option("full", "--prompt-style", help="full, compact (one "
                                     "worked job; for small-context models like smollm2-135m) "
                                     "or short (no worked job; a warm-started model)."),
    train: bool = typer.Option(True, "--train/--no-train",
                               help="Send a validated job to the pool (else stop there)."),
    workers: int = typer.Option(1, "--workers", min=1, help="Local pool workers."),
    tasks_module: list[str] | None = TasksModuleOpt,
    json_: bool = JsonOpt,
) -> None:
    """Run one episode and print its reward, components, attempts, result and end reason."""
    from nestor.agent.episode import EpisodeConfig, run_episode
    from nestor.ledger import Ledger, LedgerError
    from nestor.tasks import TaskError

    try:
        spec = registry(tasks_module).get(task).spec(difficulty)
    except TaskError as exc:
        fail(str(exc))
    run_dir = run_dir or default_out("episode")
    require_sandbox()
    if prompt_style not in ("full", "compact", "short"):
        fail(f"--prompt-style {prompt_style!r}: choose full, compact or short")
    pol = _make_policy(policy, checkpoint, seed, budget, model, max_new_tokens)
    cfg = EpisodeConfig(max_turns=max_turns, max_attempts=attempts, token_budget=budget,
                        job_timeout_s=timeout, difficulty=difficulty, prompt_style=prompt_style)
    try:
        ledger = Ledger(run_dir)
    except LedgerError as exc:
        fail(str(exc))
    pool = None
    if train:
        from nestor.pool.base import PoolError, make_pool
        from nestor.pool.config import PoolConfigError, load_pool_config

        try:
            pool = make_pool(load_pool_config(workers=workers))
        except (PoolError, PoolConfigError) as exc:
            fail(str(exc))
    try:
        with console.status(f"episode on {task}: writing…") as status:
            rec = run_episode(_Narrated(pol, status, max_turns), spec, pool, ledger, cfg)
    finally:
        if pool is not None:
            pool.shutdown()
        ledger.close()
    out = {**rec.summary(), "run_dir": str(run_dir)}
    if json_:
        print_json(out)
        return
    _print_summary(out)


class _Narrated:
    """The policy, with a progress line per turn (what it did last, what it does now): a spinner
    on a terminal, plain lines in a CI log. Everything else is the policy's own."""

    def __init__(self, policy, status, max_turns: int):
        self._policy, self._status, self._max = policy, status, max_turns
        self._turn = 0

    def __getattr__(self, name: str):
        return getattr(self._policy, name)

    def act(self, obs):
        last = next((m for m in reversed(obs.messages) if m.role == "tool"), None)
        if last is not None and last.content.startswith("validation"):
            _progress(self._status, last.content.splitlines()[0])
        turn = self._policy.act(obs)
        self._turn += 1
        calls = [c.name for c in turn.message.tool_calls]
        doing = "validating" if "submit" in calls else "working"
        _progress(self._status, f"turn {self._turn}/{self._max}: "
                                f"{', '.join(calls) or 'no tool call'} ({doing}…)")
        return turn


def _progress(status, line: str) -> None:
    """`line` quotes the agent (its tool names, the probe's report): always `shown`."""
    if console.is_terminal:
        status.update(shown(line))
    else:
        console.print(shown(line), highlight=False)


def _print_summary(out: dict) -> None:
    c = out["components"]
    con = out_console(soft_wrap=True)  # lines stay whole in logs and narrow terminals
    con.print(f"episode {out['episode_id']} on [bold]{out['task']}[/bold]: "
              f"end [bold]{out['end_reason']}[/bold] after {out['attempts']} attempt(s)")
    terms = " + ".join(f"{k.removeprefix('weighted_')} {v:+.4f}" for k, v in c.items()
                       if k.startswith("weighted_") and v)
    con.print(f"reward {out['reward']:.4f} = {terms or '0'} (preset {c.get('preset', '?')}; "
              f"uplift {c.get('improvement', 0.0):+.3f}, validation "
              f"{c.get('validation_efficiency', 0.0):.3f}"
              f"{'' if c.get('trained') else ', job did not train: no validation/speed pay'})")
    if out["result"]:
        r = out["result"]
        con.print(f"job {r['status']}: {pre_post(r['pre_score'], r['post_score'])} "
                  f"in {r['wall_s']:.1f}s", highlight=False)
    con.print(f"run dir: {out['run_dir']}")


def _open(run_dir: Path):
    from nestor.ledger import Ledger, LedgerError

    try:
        return Ledger(run_dir, readonly=True)
    except LedgerError as exc:
        fail(str(exc))


@app.command("list")
def list_(run_dir: Path = ReadRunDirOpt, json_: bool = JsonOpt) -> None:
    """Episodes in a run's ledger (including ones a killed run left unfinished)."""
    with _open(run_dir) as ledger:
        rows = ledger.episodes()
    keep = ("id", "task_id", "policy", "policy_version", "status", "end_reason", "reward",
            "attempts")
    rows = [{k: r[k] for k in keep} for r in rows]
    if json_:
        print_json(rows)
        return
    table = Table(*keep)
    table.columns[0].no_wrap = True  # the id is what `episode show` needs: never cut it
    table.columns[0].min_width = max((len(r["id"]) for r in rows), default=2)
    for r in rows:
        table.add_row(*("" if r[k] is None else shown(r[k]) for k in keep))
    out_console().print(table)


@app.command("show")
def show(episode_id: str = typer.Argument(..., help="An id from `nestor episode list`."),
         run_dir: Path = ReadRunDirOpt, json_: bool = JsonOpt) -> None:
    """One episode: its transcript, validation reports, job result and where its files are."""
    with _open(run_dir) as ledger:
        try:
            ep = ledger.episode(episode_id)
        except KeyError:
            fail(f"no episode {episode_id!r} in {run_dir}; see `nestor episode list`")
    folder = run_dir / "episodes" / episode_id
    ep["paths"] = {"workspace": str(folder / "workspace"),
                   "job": str(folder / "job") if (folder / "job").is_dir() else None,
                   "attempts": [str(p) for p in sorted(folder.glob("attempt-*"))]}
    if json_:
        print_json(ep)
        return
    con = out_console()
    reward = "–" if ep["reward"] is None else f"{ep['reward']:.4f}"
    # everything from the ledger but numbers is agent- or job-derived: `shown`, never raw
    con.print(f"[bold]{shown(ep['id'])}[/bold] {shown(ep['task_id'])} · {shown(ep['status'])} · "
              f"end {shown(ep['end_reason'] or '–')} · reward {reward}", highlight=False)
    for t in ep["turns"]:
        calls = "; ".join(f"{c['name']}({_args(c.get('arguments'))})" for c in t["tool_calls"])
        con.print(f"[cyan]── {shown(t['role'])}[/cyan]" + (f"  [dim]calls: {shown(calls)}[/dim]"
                                                            if calls else ""), highlight=False)
        if t["content"]:
            con.print(shown(t["content"]), highlight=False, soft_wrap=True)
    for job in ep["jobs"]:
        r = job["result"]
        if r:
            con.print(f"job {shown(job['id'])}: {shown(r['status'])}, "
                      f"{pre_post(r.get('pre_score'), r.get('post_score'))} in "
                      f"{r.get('wall_s', 0):.1f} s", highlight=False)
    # soft_wrap: paths and transcript lines are copied and pasted, so rich must not break them
    con.print(f"workspace: {ep['paths']['workspace']}", highlight=False, markup=False,
              soft_wrap=True)
    con.print(f"job:       {ep['paths']['job'] or '– (no job passed validation)'}",
              highlight=False, markup=False, soft_wrap=True)


def _args(arguments) -> str:
    """A tool call's arguments in one short line (file contents are in the job files)."""
    if not isinstance(arguments, dict):
        return ""
    parts = []
    for key, value in arguments.items():
        text = str(value)
        parts.append(f"{key}={text if len(text) <= 40 else f'<{len(text):,} chars>'}")
    return ", ".join(parts)
