"""What to teach: task families, their public specs and (privately) their hidden evals.

Public API only. `nestor.tasks.hidden` is deliberately not imported here.
"""

from nestor.tasks.base import Example, Family, TaskDef, TaskSpec, normalise, render_spec
from nestor.tasks.registry import TaskError, TaskRef, TaskRegistry

__all__ = ["Example", "Family", "TaskDef", "TaskError", "TaskRef", "TaskRegistry", "TaskSpec",
           "normalise", "render_spec"]
