"""Keep freed memory in the process instead of handing it back to the OS after every operator.

On the CPU, torch allocates each activation with ``malloc``. glibc serves a large block (above its
mmap threshold, 128 KiB to start with) with a fresh ``mmap`` and unmaps it when freed, so the next
forward pass touches new pages again: a page fault every 4 KiB of every large tensor, every step.
Raising the mmap and trim thresholds lets glibc reuse the freed blocks of one step in the next, as
jemalloc or tcmalloc would (the usual ``LD_PRELOAD`` advice for PyTorch on CPUs). Measured on a
2-core AMD EPYC (``docs/benchmarks.md``, "The allocator"): ViT-S/16's float32 forward 1.16x
faster, the ViT-S/4 training step 1.09x (float32) and 1.04x (bfloat16).

The cost is memory the process no longer returns: its resident size stays at its peak, which a
training or inference process reaches again every step anyway. The ``vitkit`` command calls
:func:`keep_freed_memory` for every subcommand; a script calls it once, at its start. Set
``VITKIT_KEEP_FREED_MEMORY=0`` to leave glibc's defaults.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

#: Environment variable that, set to ``0``, leaves glibc's malloc settings as they are.
ENV = "VITKIT_KEEP_FREED_MEMORY"
#: ``mallopt`` parameters (glibc's ``malloc.h``).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
#: Blocks up to this size come from the heap and are reused once freed (glibc refuses more than
#: half its heap size on some versions; :func:`keep_freed_memory` then falls back to the largest
#: value it documents, 32 MiB on 64-bit systems).
MMAP_THRESHOLD = 1 << 30
FALLBACK_MMAP_THRESHOLD = 32 << 20
#: Free memory at the top of the heap kept rather than trimmed (glibc's ``int`` maximum).
TRIM_THRESHOLD = (1 << 31) - 1


def keep_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds (see the module docstring) for this process.

    Returns:
        whether the settings were applied: ``False`` without glibc (macOS, Windows, musl), or
        with ``VITKIT_KEEP_FREED_MEMORY=0``.
    """
    if os.environ.get(ENV, "1") == "0":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
    except (OSError, TypeError):
        return False
    if not hasattr(libc, "gnu_get_libc_version"):  # glibc only: musl has a mallopt that ignores these
        return False
    mallopt = libc.mallopt
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    threshold_set = mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) or mallopt(M_MMAP_THRESHOLD, FALLBACK_MMAP_THRESHOLD)
    return bool(threshold_set) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
