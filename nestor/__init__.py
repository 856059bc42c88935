import os as _os
import sys as _sys

__version__ = '0.1.0'


def _drop_cwd_from_path() -> None:
    """The trusted side never imports from the directory it was started in: nestor is often
    started inside a job's directory, where a job's `torch.py` would import as the library.
    `python -m nestor...` puts that directory first on sys.path (sys.argv[0] is "-m" while
    the module is being found): drop it, any '' entry (the cwd, whatever it is), and any job's
    directory (config.toml beside env/: e.g. the driver's cwd, which Ray puts on its workers'
    path). The `nestor` console script adds none of these. (`python -m` still finds a
    `nestor.py` in the cwd before this runs: there, use `nestor` or `python -P -m ...`.)"""
    if _sys.argv[:1] == ["-m"] and _sys.path and _sys.path[0] in ("", _os.getcwd()):
        del _sys.path[0]
    _sys.path[:] = [p for p in _sys.path if p != "" and not _job_like(p)]


def _job_like(path: str) -> bool:
    """config.toml beside an env/ that is not a virtualenv: a job's directory, or most of one
    (nestor.config.looks_like_a_job)."""
    env = _os.path.join(path, "env")
    return _os.path.isfile(_os.path.join(path, "config.toml")) and _os.path.isdir(env) \
        and not _os.path.exists(_os.path.join(env, "pyvenv.cfg"))


_drop_cwd_from_path()
