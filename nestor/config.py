"""User-level settings shared by every command, from `nestor.toml` in the cwd (optional) and the
environment. Run configs (the outer loop) and job configs live with their own rooms."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

from pydantic import BaseModel, Field, ValidationError

# What TRL's GRPOConfig, prime-rl or verifiers call a key that nestor spells otherwise.
SYNONYMS = {
    "num_generations": "group_size", "rollouts_per_example": "group_size",
    "lr": "learning_rate", "max_completion_length": "max_new_tokens",
    "max_tokens": "max_new_tokens", "per_device_train_batch_size": "prompts_per_step",
    "batch_size": "prompts_per_step", "beta": "kl_coef", "epsilon": "clip_ratio",
    "max_grad_norm": "grad_clip", "num_iterations": "updates_per_step", "lora_r": "lora_rank",
    "model": "base_model", "model_name": "base_model", "model_name_or_path": "base_model",
    "num_train_steps": "max_steps", "total_steps": "max_steps",
}


def _fields_at(model: type[BaseModel], loc: tuple) -> set[str]:
    """The field names of the (nested) model that holds the key at `loc`."""
    for part in loc[:-1]:
        info = model.model_fields.get(str(part))
        ann = info.annotation if info is not None else None
        if not (isinstance(ann, type) and issubclass(ann, BaseModel)):
            return set()
        model = ann
    return set(model.model_fields)


def did_you_mean(key: str, known: set[str]) -> str:
    """` (did you mean `group_size`?)` for a TRL-style or misspelt key, else ""."""
    import difflib

    guess = SYNONYMS.get(key)
    if guess not in known:
        close = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.75)
        guess = close[0] if close else None
    return f" (did you mean `{guess}`?)" if guess else ""


def validation_problems(exc: ValidationError, model: type[BaseModel] | None = None) -> str:
    """A pydantic error as one actionable line: `field.path: message; ...`; an unknown key of
    `model` gets the nestor name of a TRL-style key or the closest field's."""
    def one(e: dict) -> str:
        where = ".".join(map(str, e["loc"])) or "(top)"
        hint = did_you_mean(str(e["loc"][-1]), _fields_at(model, e["loc"])) \
            if model is not None and e["loc"] and e["type"] == "extra_forbidden" else ""
        return f"{where}: {e['msg']}{hint}"

    return "; ".join(one(e) for e in exc.errors())


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

