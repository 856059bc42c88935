"""Cost-aware placement: which worker type a job should go to.

Rank the types that can run the job's base model by expected dollars per job: the measured matrix
entry where there is one; otherwise price per hour times the slowest measured time for that model
(an unmeasured type is assumed no faster than any measured one); with no measurement for the model
at all, price per hour alone. The job goes to the first type in that order with a free worker.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from nestor.pool.config import WorkerType
from nestor.pool.cost import CostMatrix


def expected_dollars(wtype: WorkerType, base_model: str | None, types: Sequence[WorkerType],
                     matrix: CostMatrix | None) -> float:
    if matrix is not None and base_model is not None:
        entry = matrix.get(wtype.name, base_model)
        if entry is not None:
            return entry.dollars
        measured = [e.seconds for t in types if (e := matrix.get(t.name, base_model))]
        if measured:
            return wtype.price_per_hour * max(measured) / 3600.0
    return wtype.price_per_hour  # same scale for every type of this model: only order matters


def rank_types(base_model: str | None, types: Sequence[WorkerType],
               matrix: CostMatrix | None) -> list[WorkerType]:
    """Types that can run `base_model`, cheapest first (ties: more workers first, then name)."""
    able = [t for t in types if t.runs(base_model)]
    return sorted(able, key=lambda t: (expected_dollars(t, base_model, types, matrix),
                                       -t.max_workers, t.name))


def choose(ranked: Sequence[WorkerType], free: Mapping[str, int],
           pinned: str | None = None) -> WorkerType | None:
    """The cheapest ranked type with a free worker (only `pinned` if given); None = wait."""
    for t in ranked:
        if (pinned is None or t.name == pinned) and free.get(t.name, 0) > 0:
            return t
    return None
