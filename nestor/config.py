"""User-level settings shared by every command, from `nestor.toml` in the cwd (optional) and the
environment. Run configs (the outer loop) and job configs live with their own rooms."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

from pydantic import BaseModel, Field, ValidationError


def validation_problems(exc: ValidationError) -> str:
    """A pydantic error as one actionable line: `field.path: message; ...`."""
    return "; ".join(f"{'.'.join(map(str, e['loc'])) or '(top)'}: {e['msg']}"
                     for e in exc.errors())


class Settings(BaseModel):
    task_modules: list[str] = Field(
        default_factory=list, description="Extra task-family modules to load, e.g. ['my_pkg.tasks'].")
    cache_dir: Path = Field(
        default_factory=lambda: Path(os.environ.get("NESTOR_CACHE", Path.home() / ".cache" / "nestor")),
        description="Where cached pre-scores and other derived data live.")
    model_paths: dict[str, Path] = Field(
        default_factory=dict, description="Registry name -> local directory of HF weights.")


def load_settings(path: Path | None = None) -> Settings:
    path = path or Path("nestor.toml")
    if path.is_file():
        with path.open("rb") as fh:
            return Settings.model_validate(tomllib.load(fh).get("nestor", {}))
    return Settings()
