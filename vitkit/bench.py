"""Side-by-side timing: interleaved repetitions, medians, ratios.

Timing two implementations one after the other lets drift (thermal, other processes, allocator
state) favour one of them; alternating them in pairs and taking medians cancels most of it.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable


def interleaved_times(
    candidates: dict[str, Callable[[], object]],
    repeats: int = 5,
    warmup: int = 1,
    *,
    budget_s: float = math.inf,
    min_repeats: int = 1,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, list[float]]:
    """Run every candidate ``warmup`` times, then ``repeats`` rounds of one call each, alternating
    the order every round. Rounds stop early, after at least ``min_repeats``, once all calls
    (warm-up included) have taken ``budget_s``. Returns the seconds of each candidate's timed calls."""
    started = clock()
    for call in candidates.values():
        for _ in range(warmup):
            call()
    names = list(candidates)
    times: dict[str, list[float]] = {name: [] for name in names}
    for round_index in range(repeats):
        if round_index >= min_repeats and clock() - started >= budget_s:
            break
        order = names if round_index % 2 == 0 else names[::-1]
        for name in order:
            start = clock()
            candidates[name]()
            times[name].append(clock() - start)
    return times


def median_ratio(times: dict[str, list[float]], slower: str, faster: str) -> float:
    """Median over rounds of ``time[slower] / time[faster]`` (the speed-up of ``faster``)."""
    return statistics.median(a / b for a, b in zip(times[slower], times[faster]))
