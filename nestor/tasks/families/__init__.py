"""Built-in task families. Each module declares one `FAMILY` (public part only)."""

BUILTIN_MODULES = (
    "nestor.tasks.families.strings",
    "nestor.tasks.families.arithmetic",
    "nestor.tasks.families.counting",
    "nestor.tasks.families.formatting",
)
