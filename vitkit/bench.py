"""Side-by-side timing: interleaved repetitions, medians, ratios.

Timing two implementations one after the other lets drift (thermal, other processes, allocator
state) favour one of them; alternating them in pairs and taking medians cancels most of it.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def interleaved_times(
    candidates: dict[str, Callable[[], object]], repeats: int = 5, warmup: int = 1
) -> dict[str, list[float]]:
    """Run every candidate ``warmup`` times, then ``repeats`` rounds of one call each, alternating
    the order every round. Returns the wall-clock seconds of each candidate's timed calls."""
    for call in candidates.values():
        for _ in range(warmup):
            call()
    names = list(candidates)
    times: dict[str, list[float]] = {name: [] for name in names}
    for round_index in range(repeats):
        order = names if round_index % 2 == 0 else names[::-1]
        for name in order:
            start = time.perf_counter()
            candidates[name]()
            times[name].append(time.perf_counter() - start)
    return times


def median_ratio(times: dict[str, list[float]], slower: str, faster: str) -> float:
    """Median over rounds of ``time[slower] / time[faster]`` (the speed-up of ``faster``)."""
    return statistics.median(a / b for a, b in zip(times[slower], times[faster]))
