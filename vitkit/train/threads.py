"""Whether a run's CPU threads will have the cores to themselves.

torch's intra-op threads wait for each other at the end of every parallel region, so one thread
that shares its core with another job makes every step wait for it: on a 2-core machine with one
other job, a Fashion-MNIST step ran 9x slower with 2 threads than with 1. This module
reads, before a run starts, the cores this process may use (``os.sched_getaffinity``: a container's
or ``taskset``'s limit, not the machine's count) and the load other processes put on them (the
1-minute load average), and words the advice.
"""

from __future__ import annotations

import os

#: Load (runnable processes, 1-minute average) above which other work is said to share the cores.
BUSY_LOAD = 0.5


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity where the OS reports one, else every CPU)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        return os.cpu_count() or 1


def other_load() -> float | None:
    """The 1-minute load average (runnable processes, this one's not yet started work included);
    ``None`` where the OS reports none."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def thread_advice(threads: int, cores: int, load: float | None) -> str | None:
    """One ``note:`` line when ``threads`` CPU threads would not have ``cores`` cores to
    themselves under ``load`` (see :func:`other_load`), else ``None``."""
    if threads > cores:
        return (
            f"note: {threads} CPU threads on the {cores} cores this process may use (os.sched_getaffinity): "
            f"threads would wait for each other every step; set trainer.num_threads={cores} or lower."
        )
    if threads > 1 and load is not None and load > BUSY_LOAD and threads + load > cores + BUSY_LOAD:
        return (
            f"note: other work keeps about {load:.1f} of the {cores} usable cores busy (load average), and the run "
            f"asks for {threads} threads: on a shared machine trainer.num_threads=1 is often several times faster "
            "(docs/train.md, shared machines)."
        )
    return None
