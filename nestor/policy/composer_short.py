"""The composer's short-form jobs: the dataset as code in `load()`, not as a data file.

A composer job's data file is hundreds of rows (~5,000 BPE tokens): too long for a small LM
to type, so demonstrations of it teach nothing an LM can do. In the short form (docs/job-format.md)
the same rows are made by a few lines of Python inside the job's taskset, from a seeded
generator: the composer renders its chosen program (programs.py) and payload structure as
source. `program_source` maps every library program to an expression over the payload's field
variables; a test checks each expression against the program itself.
"""

from __future__ import annotations

import json

from nestor.policy.programs import Explanation, Structure
from nestor.tasks import Example

V = '"aeiou"'
# word -> word, over `{x}`
TRANSFORM_SRC = {
    "identity": "{x}",
    "reverse": "{x}[::-1]",
    "sort": '"".join(sorted({x}))',
    "dedupe": '"".join(dict.fromkeys({x}))',
    "shift+1": '"".join(chr((ord(c) - 96) % 26 + 97) for c in {x})',
    "shift-1": '"".join(chr((ord(c) - 98) % 26 + 97) for c in {x})',
    "double": '"".join(c + c for c in {x})',
    "upper": "{x}.upper()",
    "vowels_only": '"".join(c for c in {x} if c in ' + V + ")",
    "drop_vowels": '"".join(c for c in {x} if c not in ' + V + ")",
}
SUMMARY_SRC = {  # word -> answer
    "length": "str(len({x}))",
    "count_vowels": "str(sum(c in " + V + " for c in {x}))",
    "count_distinct": "str(len(set({x})))",
    "first": "{x}[:1]",
    "last": "{x}[-1:]",
}
PAIR_INT_SRC = {
    "add": "str({a} + {b})", "subtract": "str({a} - {b})", "subtract_rev": "str({b} - {a})",
    "absdiff": "str(abs({a} - {b}))", "max": "str(max({a}, {b}))", "min": "str(min({a}, {b}))",
    "multiply": "str({a} * {b})", "concat": "str({a}) + str({b})",
}
ONE_INT_SRC = {
    "succ": "str({n} + 1)", "pred": "str({n} - 1)", "twice": "str(2 * {n})",
    "square": "str({n} * {n})", "digit_sum": "str(sum(map(int, str({n}))))",
    "reverse_digits": "str({n})[::-1]",
}
LETTER_WORD_SRC = {
    "count_letter": "str({s}.count({c}))", "remove_letter": '{s}.replace({c}, "")',
    "index_of": "str({s}.find({c}))",
}


def program_source(name: str, kinds: tuple[str, ...]) -> str | None:
    """The program `name` (programs.library's naming: "f", or "g∘f" = g(f(x))) as a Python
    expression over the field variables v0, v1; None for a name outside the table."""
    if kinds == ("word",):
        outer, _, inner = name.rpartition("∘")
        if not outer:
            src = TRANSFORM_SRC.get(name) or SUMMARY_SRC.get(name)
            return None if src is None else src.format(x="v0")
        first = TRANSFORM_SRC.get(inner)
        second = TRANSFORM_SRC.get(outer) or SUMMARY_SRC.get(outer)
        if first is None or second is None:
            return None
        return second.format(x=f"({first.format(x='v0')})")
    table, names = {("int", "int"): (PAIR_INT_SRC, {"a": "v0", "b": "v1"}),
                    ("int",): (ONE_INT_SRC, {"n": "v0"}),
                    ("word", "word"): (LETTER_WORD_SRC, {"c": "v0", "s": "v1"})}.get(
                        kinds, ({}, {}))
    src = table.get(name)
    return None if src is None else src.format(**names)


def _field_lines(structure: Structure) -> list[str]:
    out = []
    for i, f in enumerate(structure.fields):
        if f.kind == "int":
            out.append(f"v{i} = rng.randint({f.lo}, {f.hi})")
        else:
            out.append(f'v{i} = "".join(rng.choice({f.alphabet!r}) for _ in '
                       f"range(rng.randint({f.lo}, {f.hi})))")
    ints = [i for i, f in enumerate(structure.fields) if f.kind == "int"]
    if len(ints) == 2 and structure.ordered:
        out.append(f"v{ints[0]}, v{ints[1]} = max(v{ints[0]}, v{ints[1]}), "
                   f"min(v{ints[0]}, v{ints[1]})")
    if len(ints) == 2 and structure.distinct:
        out.append(f"if v{ints[0]} == v{ints[1]}:\n            continue")
    return out


def _prompt_expr(exp: Explanation, structure: Structure, framing: str, title: str) -> str:
    parts = [exp.fmt.prefix] + list(structure.parts) + [exp.fmt.suffix]
    body = "".join(p.replace("{", "{{").replace("}", "}}") if isinstance(p, str)
                   else f"{{v{p}}}" for p in parts)
    text = json.dumps(body)  # a string literal; then made an f-string
    if framing == "titled":
        text = json.dumps(f"{title}: ".replace("{", "{{").replace("}", "}}"))[:-1] + text[1:]
    elif framing == "marker":
        text = text[:-1] + '\\nAnswer:"'
    return "f" + text


def rows_source(examples: list[Example], exp: Explanation, *, source: str, n_rows: int,
                widen: bool, framing: str, title: str, seed: int) -> tuple[str, str]:
    """(source of a `rows()` generator yielding (prompt, answer) pairs, a note on how). The
    worked examples as given when the source is `given` or no program explains them."""
    program = exp.program
    kinds = tuple(f.kind for f in exp.structure.fields) if exp.structure else ()
    answer = program_source(program.name, kinds) if program is not None else None
    if source == "given" or answer is None or exp.structure is None:
        pairs = [(_framed(e.prompt, framing, title), e.answer) for e in examples]
        note = "the worked examples as given" + (
            "" if source == "given" else " (no program explains them)")
        return (f"def rows():\n    pairs = {pairs!r}\n    for i in range({n_rows}):\n"
                f"        yield pairs[i % len(pairs)]\n"), note
    structure = exp.structure.widened() if widen else exp.structure
    # `augmented` (near copies of the examples) is drawn afresh in code, like `resampled`:
    # the ranges read off the examples already keep the inputs close to them.
    lines = [f"def rows():\n    rng = random.Random({seed})\n    made = 0\n"
             f"    while made < {n_rows}:"]
    lines += [f"        {line}" for line in _field_lines(structure)]
    lines += [f"        yield {_prompt_expr(exp, structure, framing, title)}, {answer}",
              "        made += 1"]
    return "\n".join(lines) + "\n", f"{n_rows} rows drawn in code via program `{program.name}`"


def _framed(prompt: str, framing: str, title: str) -> str:
    from nestor.policy.programs import frame

    return frame(prompt, framing, title)
