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
    path = path or settings_file()
    if path is not None and path.is_file():
        with path.open("rb") as fh:
            return Settings.model_validate(tomllib.load(fh).get("nestor", {}))
    return Settings()


def settings_file() -> Path | None:
    """./nestor.toml, unless the cwd is a job's directory: a job's files are not the user's
    settings (its nestor.toml could name plugin files or a pool job function to import, a
    pre-score cache or base-model weights of its own). Then None: defaults only."""
    return None if looks_like_a_job(Path.cwd()) else Path("nestor.toml")


def looks_like_a_job(directory: Path) -> bool:
    """A job's directory, or most of one: config.toml beside an env/ that is not a virtualenv
    (a project whose venv is called env/ keeps its settings). nestor reads no settings from it."""
    env = directory / "env"
    return (directory / "config.toml").exists() and env.is_dir() and \
        not (env / "pyvenv.cfg").exists()

