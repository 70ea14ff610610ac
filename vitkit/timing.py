"""Side-by-side timing: interleaved repetitions, medians, ratios; and where one call's time goes.

Timing two implementations one after the other lets drift (thermal, other processes, allocator
state) favour one of them; alternating them in pairs and taking medians cancels most of it.
"""

from __future__ import annotations

import math
import statistics
import time
from collections import Counter
from collections.abc import Callable, Hashable
from typing import Any

from torch.utils._python_dispatch import TorchDispatchMode


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


class OpClock(TorchDispatchMode):
    """While active, adds each ATen operator call's wall time, read around the call, to
    ``seconds[key]`` and counts it in ``calls[key]``; ``key(func, args)`` names the call (default:
    the operator, as ``"aten.mm"``) or returns ``None`` to leave it out."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter,
                 key: Callable[[Any, tuple], Hashable | None] | None = None) -> None:
        super().__init__()
        self.clock = clock
        self.key = key or (lambda func, args: str(func.overloadpacket))
        self.seconds: Counter[Hashable] = Counter()
        self.calls: Counter[Hashable] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        started = self.clock()
        out = func(*args, **(kwargs or {}))
        ended = self.clock()
        name = self.key(func, args)
        if name is not None:
            self.seconds[name] += ended - started
            self.calls[name] += 1
        return out


def op_wall_times(call: Callable[[], object], clock: Callable[[], float] = time.perf_counter) -> tuple[float, Counter[Hashable]]:
    """One run of ``call``: its wall seconds and the wall seconds of each ATen operator it ran
    (forward and backward, as ``aten.mm``), read around each call.

    Unlike ``torch.profiler``'s self CPU times, which on a 2-core CPU inflated a ViT training step
    from 1.6 s to 2.3-2.8 s and put much of the excess on elementwise operators (GELU's backward at
    9% of the step, 2.5% by this clock), the operators' times here sum to nearly the call's
    own, so their shares say what bounds it."""
    timer = OpClock(clock)
    started = clock()
    with timer:
        call()
    return clock() - started, timer.seconds
