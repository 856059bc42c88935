"""`nestor sft`: a supervised warm start of the LM agent from demonstrations (LoRA behaviour
cloning on the assistant's tokens), the step before `nestor train`'s RL (docs/agents.md)."""

from __future__ import annotations

import time
import tomllib
from pathlib import Path

import typer

from nestor.cli.common import JsonOpt, console, fail, print_json


def register(root: typer.Typer) -> None:
    root.command("sft")(sft)


def sft(
    demos: str = typer.Option(..., "--demos", help="composer:N (the composer writes N "
                              "short-form jobs per task), a run directory, or a .jsonl of "
                              "OpenAI-format transcripts."),
    model: str = typer.Option("smollm2-135m", "--model", help="Registry name or local path of "
                              "the chat LM."),
    out: Path = typer.Option(None, "--out", help="Output directory (adapter/, checkpoint/, "
                             "demos.jsonl, sft.json); default runs/sft-<timestamp>."),
    config: Path = typer.Option(None, "--config", help="TOML of SFTConfig keys "
                                "(nestor/sft/trainer.py); flags override it."),
    steps: int = typer.Option(None, "--steps", help="Optimizer steps."),
    lr: float = typer.Option(None, "--lr", help="Learning rate."),
    val_fraction: float = typer.Option(None, "--val-fraction", help="Share of demos held out "
                                       "and scored every eval_every steps (loss, token "
                                       "accuracy)."),
    tasks: str = typer.Option(None, "--tasks", help="composer:N: comma-separated task ids."),
    min_reward: float = typer.Option(None, "--min-reward", help="Keep demos with reward ≥ x."),
    best_of_group: bool = typer.Option(None, "--best-of-group/--all-of-group",
                                       help="Keep only the best demo of each group."),
    slips_per_job: int = typer.Option(None, "--slips-per-job", help="composer:N: replay each "
                                      "job that passed first try with K different LM slips "
                                      "and their repairs (0-7): demos of reading the report."),
    train_demos: bool = typer.Option(False, "--train-demos", help="composer:N: train each "
                                     "valid job on a local pool, so demos have rewards."),
    resume: bool = typer.Option(False, "--resume", help="Continue DIR's run from its last "
                                "checkpoint (and its demos.jsonl)."),
    json_out: bool = JsonOpt,
) -> None:
    """Warm-start the LM agent: behaviour cloning of demonstrations into a LoRA adapter."""
    from pydantic import ValidationError
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from nestor.sft.demos import DemoError
    from nestor.sft.run import run_sft
    from nestor.sft.trainer import SFTConfig

    raw: dict = {}
    if config is not None:
        try:
            raw = tomllib.loads(config.read_text(encoding="utf-8"))
        except (OSError, tomllib.TOMLDecodeError) as exc:
            fail(f"{config}: {exc}")
    raw.update({"demos": demos, "model": model})
    for key, value in (("steps", steps), ("learning_rate", lr), ("val_fraction", val_fraction),
                       ("min_reward", min_reward), ("best_of_group", best_of_group),
                       ("slips_per_job", slips_per_job)):
        if value is not None:
            raw[key] = value
    if tasks:
        raw["tasks"] = [t.strip() for t in tasks.split(",") if t.strip()]
    try:
        cfg = SFTConfig(**raw)
    except ValidationError as exc:
        fail(f"bad sft config: {exc}")
    out = out or Path("runs") / f"sft-{time.strftime('%Y%m%d-%H%M%S')}"
    if out.exists() and any(out.iterdir()) and not resume:
        fail(f"{out} is not empty; pass --resume to continue it, or another --out")
    pool = None
    if train_demos:
        from nestor.pool.local import LocalPool

        pool = LocalPool()
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[info]}"),
                  TimeElapsedColumn(), console=console, disable=json_out) as progress:
        demo_bar = progress.add_task("demos", total=None, info="")
        bar = progress.add_task("sft", total=cfg.steps, info="", visible=False)

        def on_demo(d) -> None:
            progress.update(demo_bar, advance=1, info=f"{d.task}: passed={d.passed}")

        def on_step(h: dict) -> None:
            val = (f", held out {h['val_loss']:.3f} / {h['val_token_accuracy']:.1%}"
                   if "val_loss" in h else "")
            progress.update(bar, completed=h["step"], visible=True,
                            info=f"loss {h['loss']:.3f}, token accuracy "
                                 f"{h['token_accuracy']:.1%}{val}")

        try:
            summary = run_sft(cfg, out, resume=resume, pool=pool, on_demo=on_demo,
                              on_step=on_step)
        except (DemoError, ValueError, FileNotFoundError) as exc:
            fail(str(exc))
        finally:
            if pool is not None:
                pool.shutdown()
    if json_out:
        print_json(summary)
        return
    console.print(f"{summary['demos_kept']} of {summary['demos_read']} demos, "
                  f"{summary['sequences']} sequences, {summary['target_tokens']:,} target tokens; "
                  f"loss {summary['loss_first']:.3f} → {summary['loss_last']:.3f} over "
                  f"{summary['steps']} steps")
    if summary["token_accuracy_last"] is not None:
        console.print(f"token accuracy (last third of steps): "
                      f"{summary['token_accuracy_last']:.1%}")
    if summary["val_loss"] is not None:
        console.print(f"held out ({summary['demos_held_out']} demos): loss "
                      f"{summary['val_loss']:.3f}, token accuracy "
                      f"{summary['val_token_accuracy']:.1%}")
    typer.echo(f"adapter: {summary['adapter']}  (use: [policy] adapter = \"{out}\", or "
               f"nestor bench agents lm:{cfg.model} --adapter {out})")
