"""`python -m nestor.cli.main ...` runs the CLI (used where the console script is not on PATH)."""

from nestor.cli import app

if __name__ == "__main__":
    app()
