"""The composer's dataset library: infer a spec's prompt format, find a program that explains
its worked examples, and generate new labelled rows in the spec's exact format.

The composer cannot read prose. What it can do honestly is pattern-match: split each worked
example prompt into a constant frame and a payload of fields (lowercase words and integers),
try every program of a small library of character and arithmetic programs (and pairwise
compositions) on the fields, keep the programs that reproduce every example's answer, and
sample fresh payloads from ranges read off the examples. A task outside the library (the
held-out formatting family is: the library has no word-joining programs) gets no program and
its dataset falls back to the worked examples as given — weak transfer, shown honestly.
"""

from __future__ import annotations

import random
import re
import string
from collections.abc import Callable
from dataclasses import dataclass

from nestor.tasks import Example

LETTERS = string.ascii_lowercase
VOWELS = set("aeiou")
_TOKEN = re.compile(r"[a-z]+|\d+|[^a-z\d]+")


# -- prompt format ------------------------------------------------------------------------------
@dataclass(frozen=True)
class PromptFormat:
    """prompt = prefix + payload + suffix, the frame constant across the worked examples."""

    prefix: str
    suffix: str

    def payload(self, prompt: str) -> str:
        return prompt[len(self.prefix):len(prompt) - len(self.suffix)]

    def render(self, payload: str) -> str:
        return f"{self.prefix}{payload}{self.suffix}"


def _common_prefix(texts: list[str]) -> str:
    out = texts[0]
    for t in texts[1:]:
        while not t.startswith(out):
            out = out[:-1]
    return out


def _cut_to_boundary(frame: str) -> str:
    """Drop a trailing partial field ("1" in "1+2=", "12+4=") so the frame ends on a separator."""
    while frame and frame[-1].isalnum():
        frame = frame[:-1]
    return frame


def infer_format(examples: list[Example]) -> PromptFormat:
    prompts = [e.prompt for e in examples]
    prefix = _cut_to_boundary(_common_prefix(prompts))
    rest = [p[len(prefix):] for p in prompts]
    suffix = _cut_to_boundary(_common_prefix([r[::-1] for r in rest]))[::-1]
    return PromptFormat(prefix, suffix)


# -- payload structure and input sampling -------------------------------------------------------
@dataclass(frozen=True)
class Field:
    kind: str  # "word" | "int"
    lo: int  # word: length range; int: value range
    hi: int
    alphabet: str = LETTERS


@dataclass(frozen=True)
class Structure:
    """A payload as alternating literals and fields: parts[i] is a literal str or a field index."""

    parts: tuple[str | int, ...]
    fields: tuple[Field, ...]
    ordered: bool = False  # two ints, always first >= second in the examples
    distinct: bool = False  # two ints, never equal in the examples

    def parse(self, payload: str) -> list[str | int] | None:
        pattern = "".join(re.escape(p) if isinstance(p, str) else
                          ("([a-z]+)" if self.fields[p].kind == "word" else r"(\d+)")
                          for p in self.parts)
        m = re.fullmatch(pattern, payload)
        if not m:
            return None
        return [int(v) if f.kind == "int" else v for v, f in zip(m.groups(), self.fields,
                                                                  strict=True)]

    def render(self, values: list[str | int]) -> str:
        return "".join(p if isinstance(p, str) else str(values[p]) for p in self.parts)

    def sample(self, rng: random.Random) -> list[str | int]:
        while True:
            values: list[str | int] = []
            for f in self.fields:
                if f.kind == "int":
                    values.append(rng.randint(f.lo, f.hi))
                else:
                    values.append("".join(rng.choice(f.alphabet)
                                          for _ in range(rng.randint(f.lo, f.hi))))
            if self._allowed(values):
                return values

    def mutate(self, values: list[str | int], rng: random.Random) -> list[str | int]:
        """A near copy of an example's fields: one letter changed or shuffled, or a number nudged."""
        for _ in range(20):
            out = list(values)
            i = rng.randrange(len(out))
            f = self.fields[i]
            v = out[i]
            if f.kind == "int":
                out[i] = min(f.hi, max(f.lo, int(v) + rng.randint(-9, 9)))
            elif rng.random() < 0.5:
                chars = list(str(v))
                chars[rng.randrange(len(chars))] = rng.choice(f.alphabet)
                out[i] = "".join(chars)
            else:
                chars = list(str(v))
                rng.shuffle(chars)
                out[i] = "".join(chars)
            if self._allowed(out):
                return out
        return list(values)

    def widened(self) -> Structure:
        """Word fields one letter shorter and two longer than seen: more varied training inputs."""
        fields = tuple(Field(f.kind, max(1, f.lo - 1), f.hi + 2, f.alphabet) if f.kind == "word"
                       else f for f in self.fields)
        return Structure(self.parts, fields, self.ordered, self.distinct)

    def _allowed(self, values: list[str | int]) -> bool:
        ints = [v for v in values if isinstance(v, int)]
        if len(ints) == 2 and self.ordered and ints[0] < ints[1]:
            return False
        return not (len(ints) == 2 and self.distinct and ints[0] == ints[1])


def _signature(payload: str) -> list[tuple[str, str]]:
    out = []
    for tok in _TOKEN.findall(payload):
        kind = "word" if tok[0] in LETTERS else "int" if tok[0].isdigit() else "lit"
        out.append((kind, tok))
    return out


def infer_structure(payloads: list[str]) -> Structure | None:
    """One structure shared by every payload, or None (e.g. a varying number of words)."""
    sigs = [_signature(p) for p in payloads]
    shape = [k for k, _ in sigs[0]]
    if not payloads or any([k for k, _ in s] != shape for s in sigs):
        return None
    parts: list[str | int] = []
    fields: list[Field] = []
    for pos, kind in enumerate(shape):
        seen = [s[pos][1] for s in sigs]
        if kind == "lit" or len(set(seen)) == 1:  # constant across examples: part of the frame
            if kind == "lit" and len(set(seen)) > 1:
                return None
            parts.append(seen[0])
        elif kind == "int":
            top = 10 ** max(len(v) for v in seen) - 1
            parts.append(len(fields))
            fields.append(Field("int", 0, top))
        else:
            letters = sorted(set("".join(seen)))
            # a wide spread of letters means the whole alphabet; a narrow one is kept a..max
            alphabet = LETTERS if len(letters) >= 12 else LETTERS[:LETTERS.index(letters[-1]) + 1]
            parts.append(len(fields))
            fields.append(Field("word", min(map(len, seen)), max(map(len, seen)), alphabet))
    merged: list[str | int] = []
    for p in parts:  # adjacent literals merge back into one
        if merged and isinstance(p, str) and isinstance(merged[-1], str):
            merged[-1] += p
        else:
            merged.append(p)
    ints = [tuple(int(s[i][1]) for i, k in enumerate(shape) if k == "int") for s in sigs]
    two = bool(ints) and len(ints[0]) == 2 and all(len(v) == 2 for v in ints)
    return Structure(tuple(merged), tuple(fields),
                     ordered=two and all(a >= b for a, b in ints),
                     distinct=two and all(a != b for a, b in ints))


# -- the program library ------------------------------------------------------------------------
def _shift(s: str, k: int) -> str:
    return "".join(LETTERS[(LETTERS.index(c) + k) % 26] for c in s)


TRANSFORMS: dict[str, Callable[[str], str]] = {  # word -> word
    "identity": lambda s: s,
    "reverse": lambda s: s[::-1],
    "sort": lambda s: "".join(sorted(s)),
    "dedupe": lambda s: "".join(dict.fromkeys(s)),
    "shift+1": lambda s: _shift(s, 1),
    "shift-1": lambda s: _shift(s, -1),
    "double": lambda s: "".join(c + c for c in s),
    "upper": str.upper,
    "vowels_only": lambda s: "".join(c for c in s if c in VOWELS),
    "drop_vowels": lambda s: "".join(c for c in s if c not in VOWELS),
}
SUMMARIES: dict[str, Callable[[str], str]] = {  # word -> answer
    "length": lambda s: str(len(s)),
    "count_vowels": lambda s: str(sum(c in VOWELS for c in s)),
    "count_distinct": lambda s: str(len(set(s))),
    "first": lambda s: s[:1],
    "last": lambda s: s[-1:],
}
PAIR_INT: dict[str, Callable[[int, int], str]] = {
    "add": lambda a, b: str(a + b),
    "subtract": lambda a, b: str(a - b),
    "subtract_rev": lambda a, b: str(b - a),
    "absdiff": lambda a, b: str(abs(a - b)),
    "max": lambda a, b: str(max(a, b)),
    "min": lambda a, b: str(min(a, b)),
    "multiply": lambda a, b: str(a * b),
    "concat": lambda a, b: f"{a}{b}",
}
ONE_INT: dict[str, Callable[[int], str]] = {
    "succ": lambda n: str(n + 1),
    "pred": lambda n: str(n - 1),
    "twice": lambda n: str(2 * n),
    "square": lambda n: str(n * n),
    "digit_sum": lambda n: str(sum(map(int, str(n)))),
    "reverse_digits": lambda n: str(n)[::-1],
}
LETTER_WORD: dict[str, Callable[[str, str], str]] = {  # (c, s) -> answer
    "count_letter": lambda c, s: str(s.count(c)),
    "remove_letter": lambda c, s: s.replace(c, ""),
    "index_of": lambda c, s: str(s.find(c)),
}


@dataclass(frozen=True)
class Program:
    name: str
    fn: Callable[[list[str | int]], str]

    def __call__(self, values: list[str | int]) -> str:
        return self.fn(values)


def library(structure: Structure) -> list[Program]:
    """Programs applicable to this payload structure, simplest first (single programs, then
    pairwise compositions of word transforms, then transform-then-summary)."""
    kinds = tuple(f.kind for f in structure.fields)
    progs: list[Program] = []
    if kinds == ("word",):
        for n, t in TRANSFORMS.items():
            if n != "identity":
                progs.append(Program(n, lambda v, t=t: t(v[0])))
        for n, f in SUMMARIES.items():
            progs.append(Program(n, lambda v, f=f: f(v[0])))
        for n1, t1 in TRANSFORMS.items():
            for n2, t2 in TRANSFORMS.items():
                if "identity" not in (n1, n2) and n1 != n2:
                    progs.append(Program(f"{n2}∘{n1}", lambda v, a=t1, b=t2: b(a(v[0]))))
        for n1, t1 in TRANSFORMS.items():
            for n2, f in SUMMARIES.items():
                if n1 != "identity":
                    progs.append(Program(f"{n2}∘{n1}", lambda v, a=t1, f=f: f(a(v[0]))))
    elif kinds == ("int", "int"):
        progs += [Program(n, lambda v, f=f: f(int(v[0]), int(v[1]))) for n, f in PAIR_INT.items()]
    elif kinds == ("int",):
        progs += [Program(n, lambda v, f=f: f(int(v[0]))) for n, f in ONE_INT.items()]
    elif kinds == ("word", "word"):
        progs += [Program(n, lambda v, f=f: f(str(v[0]), str(v[1])))
                  for n, f in LETTER_WORD.items()]
    return progs


@dataclass(frozen=True)
class Explanation:
    """How the composer reads a spec: its frame, payload structure and consistent programs."""

    fmt: PromptFormat
    structure: Structure | None
    programs: tuple[Program, ...]  # every program reproducing every worked example

    @property
    def program(self) -> Program | None:
        return self.programs[0] if self.programs else None


def explain(examples: list[Example]) -> Explanation:
    fmt = infer_format(examples)
    payloads = [fmt.payload(e.prompt) for e in examples]
    structure = infer_structure(payloads)
    if structure is None:
        return Explanation(fmt, None, ())
    parsed = [structure.parse(p) for p in payloads]
    if any(v is None for v in parsed):
        return Explanation(fmt, structure, ())
    keep = []
    for prog in library(structure):
        try:
            if all(prog(v) == e.answer for v, e in zip(parsed, examples, strict=True)):
                keep.append(prog)
        except (ValueError, IndexError, ZeroDivisionError):
            continue
    return Explanation(fmt, structure, tuple(keep))


# -- rows ---------------------------------------------------------------------------------------
FRAMINGS = ("exact", "titled", "marker")


def frame(prompt: str, framing: str, title: str) -> str:
    """The prompt as the training row shows it. Only `exact` matches the test format."""
    if framing == "titled":
        return f"{title}: {prompt}"
    if framing == "marker":
        return f"{prompt}\nAnswer:"
    return prompt


def build_rows(examples: list[Example], *, title: str, source: str, n_rows: int,
               widen: bool, framing: str, seed: int) -> tuple[list[dict], dict]:
    """(rows, info). `source`: given (the worked examples, cycled), augmented (near copies of
    them), resampled (fresh inputs from the ranges seen). Without a program that explains the
    examples, every source falls back to the examples as given, and info says so."""
    rng = random.Random(seed)
    exp = explain(examples)
    info = {"program": exp.program.name if exp.program else None,
            "candidates": len(exp.programs), "source": source, "fallback": False}
    pairs: list[tuple[str, str]] = []
    if source != "given" and exp.program is not None and exp.structure is not None:
        structure = exp.structure.widened() if widen else exp.structure
        parsed = [structure.parse(exp.fmt.payload(e.prompt)) for e in examples]
        for i in range(n_rows):
            if source == "augmented":
                values = structure.mutate(parsed[i % len(parsed)], rng)  # type: ignore[arg-type]
            else:
                values = structure.sample(rng)
            pairs.append((exp.fmt.render(structure.render(values)), exp.program(values)))
    else:
        info["fallback"] = source != "given"
        pairs = [(examples[i % len(examples)].prompt, examples[i % len(examples)].answer)
                 for i in range(n_rows)]
    rows = [{"prompt": frame(p, framing, title), "answer": a} for p, a in pairs]
    return rows, info
