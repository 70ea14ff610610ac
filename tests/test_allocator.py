"""keep_freed_memory: glibc's thresholds raised, so a freed large block stays in the process for the
next allocation instead of being unmapped (and faulted in anew)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from vitkit.allocator import ENV

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")

# A child process frees a 64 MiB tensor and reads glibc's mallinfo2: the bytes free in its heap
# (fordblks) hold the block when it was kept; with glibc's defaults the block was an mmap of its
# own, unmapped by the free, and the heap's free bytes stay small.
CHILD = """
import ctypes, torch
import vitkit

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                     "fsmblks", "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = MallInfo2
applied = vitkit.keep_freed_memory()
block = torch.empty(16 << 20)  # 64 MiB of float32
block.fill_(1.0)
del block
print(applied, libc.mallinfo2().fordblks)
"""


def free_heap_bytes(keep: str) -> tuple[str, int]:
    done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, check=True,
                          env={"PATH": "", ENV: keep})
    applied, count = done.stdout.split()
    return applied, int(count)


def test_a_freed_block_stays_in_the_heap_and_the_variable_turns_it_off() -> None:
    applied, kept = free_heap_bytes("1")
    if applied != "True":
        pytest.skip("not glibc")
    default_applied, default = free_heap_bytes("0")
    assert default_applied == "False"
    assert kept >= 64 << 20
    assert default < 32 << 20
