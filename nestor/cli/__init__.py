"""`nestor ...`: one typer app assembled from one small module per command group.

Heavy imports (torch, verifiers, ray) happen inside commands, so `nestor --help` stays fast.
"""

import os

import click
import typer
import typer.rich_utils

from nestor.cli import tasks


def _one_line_error(exc: click.ClickException) -> None:
    """Usage mistakes in the same one-line `error:` style as the commands' own (typer's default
    is a boxed panel), with where to look next."""
    if type(exc).__name__ == "NoArgsIsHelpError":  # the help text was already printed
        return
    ctx = getattr(exc, "ctx", None)
    hint = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
    click.echo(f"error: {exc.format_message()}{hint}", err=True)


typer.rich_utils.rich_format_error = _one_line_error  # looked up at call time by typer.core


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            typer.echo(f"nestor {version('nestor')}")
        except PackageNotFoundError:
            typer.echo("nestor (not installed: running from a source tree)")
        raise typer.Exit()


app = typer.Typer(no_args_is_help=True, add_completion=False,
                  help="nestor: an agent that writes RL training jobs, trained by their results.")


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="Print nestor's version and exit.")) -> None:
    """nestor: an agent that writes RL training jobs, trained by their results."""
    import sys

    from nestor.cli.quiet import quiet_console

    # Relative entries (a PYTHONPATH of ":foo" or "."): the cwd, which may be a job's dir.
    sys.path[:] = [p for p in sys.path if os.path.isabs(p)]

    quiet_console()


app.add_typer(tasks.app, name="tasks")

# Each command group registers here as it lands (one module per group in nestor/cli/).
for _name in ("models", "evaluate", "job", "pool", "bench", "episode", "train", "report", "runs",
              "serve", "pods", "sft"):
    try:
        _mod = __import__(f"nestor.cli.{_name}", fromlist=["register"])
    except ModuleNotFoundError as _exc:
        if _exc.name != f"nestor.cli.{_name}":
            raise
        continue
    _mod.register(app)
