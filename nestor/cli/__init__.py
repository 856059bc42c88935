"""`nestor ...`: one typer app assembled from one small module per command group.

Heavy imports (torch, verifiers, ray) happen inside commands, so `nestor --help` stays fast.
"""

import typer

from nestor.cli import tasks

app = typer.Typer(no_args_is_help=True, add_completion=False,
                  help="nestor: an agent that writes RL training jobs, trained by their results.")
app.add_typer(tasks.app, name="tasks")

# Each command group registers here as it lands (one module per group in nestor/cli/).
for _name in ("models", "evaluate", "job", "pool", "bench", "episode", "train", "report", "runs",
              "serve", "pods"):
    try:
        _mod = __import__(f"nestor.cli.{_name}", fromlist=["register"])
    except ModuleNotFoundError as _exc:
        if _exc.name != f"nestor.cli.{_name}":
            raise
        continue
    _mod.register(app)
