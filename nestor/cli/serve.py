"""`nestor serve --model tiny-m|PATH --port P`: OpenAI-compatible chat completions."""

from __future__ import annotations

import typer

from nestor.cli.common import console, fail


def serve(
    model: str = typer.Option("tiny-m", "--model", help="Registry name or checkpoint directory."),
    host: str = typer.Option("127.0.0.1", "--host"),
    port: int = typer.Option(8000, "--port", min=1, max=65535),
    max_tokens: int = typer.Option(256, "--max-tokens", min=1, help="Cap on tokens per reply."),
) -> None:
    """Serve a local model at http://HOST:PORT/v1/chat/completions (with tool calls).

    Logs one line per request on stderr: the request, the reply's size or the error returned."""
    import uvicorn

    from nestor.models.registry import ModelNotFoundError
    from nestor.serve import create_app

    try:
        app = create_app(model, max_tokens=max_tokens,
                         log=lambda line: console.print(line, highlight=False, markup=False,
                                                        soft_wrap=True))
    except ModelNotFoundError as exc:
        fail(str(exc))
    console.print(f"serving {model} at http://{host}:{port}/v1")
    uvicorn.run(app, host=host, port=port, log_level="warning")


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)
