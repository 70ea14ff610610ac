"""Pick the faster attention kernel by timing it on synthetic tensors, like ``torch.backends.cudnn.benchmark``.

This measurement is for calls that are not repeated steps (one-off inference, explain calls,
evaluation): a training run chooses its kernel on its own steps instead
(:class:`vitkit.train.kernel_trial.KernelTrial`).

Which of SDPA and the explicit kernel wins depends on the machine (CPU model, its bfloat16
support, the GPU), the dtype, whether a backward follows, the head width and the sequence length;
no fixed rule holds everywhere. The first call for a new :class:`AutotuneKey` times both kernels on
synthetic tensors of the call's shape, a few interleaved rounds each (forward alone in inference,
forward + backward when gradients flow), and keeps the one with the better best time, preferring
SDPA unless the explicit kernel is at least :data:`EXPLICIT_MARGIN` faster, so that noise does not
flip the choice and ties go to the kernel timm uses. Shapes are bucketed to powers of two, so a
run needs a handful of measurements. Choices live in memory and, opt-in
(``VITKIT_AUTOTUNE_CACHE=path`` or :meth:`Autotuner.set_cache_path`), in a JSON file that later
processes read instead of measuring.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import platform
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, NamedTuple

import torch

from ..files import atomic_write, read_regular_text
from ..timing import interleaved_times

#: ``kernel(q, k, v, allowed, dropout_p, scale)``: the contract of the kernels in :mod:`.attention`.
Kernel = Callable[..., Any]

#: The explicit kernel must be this much faster (time ratio SDPA / explicit) to be chosen: attention
#: timed alone does not predict the whole step (measurements in docs/benchmarks.md).
EXPLICIT_MARGIN = 0.5
#: Environment variable naming the JSON file of measured choices (unset: memory only).
CACHE_ENV = "VITKIT_AUTOTUNE_CACHE"
#: The synthetic scores ``[BH, N, M]`` hold at most this many elements (batch x heads shrinks).
MEASURE_ELEMENTS = 1 << 22
#: Soft limit on one key's measurement: rounds stop after three once it is spent.
MEASURE_BUDGET_S = 0.25
MEASURE_ROUNDS = 7
CACHE_FORMAT = 1


def bucket(n: int) -> int:
    """``n`` rounded to the nearest power of two in log scale (197 -> 256, 65 -> 64, 50 -> 64)."""
    low = 1 << (max(n, 1).bit_length() - 1)  # the power of two at or below n
    return low if n * n < 2 * low * low else 2 * low  # n < low * sqrt(2): nearer to low in log scale


@functools.cache
def cpu_model() -> str:
    """The CPU's marketing name (``/proc/cpuinfo`` on Linux), else what ``platform`` knows."""
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def device_name(device: torch.device) -> str:
    """The hardware behind ``device``: the CPU model and torch's thread count, or the GPU's name."""
    if device.type == "cpu":
        return f"{cpu_model()} ({torch.get_num_threads()} threads)"
    if device.type == "cuda":
        return _gpu_name(torch.cuda.current_device() if device.index is None else device.index)
    return device.type


@functools.cache
def _gpu_name(index: int) -> str:
    """``torch.cuda.get_device_name(index)``, looked up once (keys are built on every ``"auto"`` call)."""
    return torch.cuda.get_device_name(index)


class AutotuneKey(NamedTuple):
    """What decides the faster kernel. Sizes are :func:`bucket` ed; ``training``: a backward follows.
    (A named tuple: it is built and hashed on every attention call.)"""

    device: str
    dtype: str
    training: bool
    head_dim: int
    queries: int
    keys: int
    batch_heads: int
    masked: bool
    dropout: bool

    @classmethod
    def of(cls, q: torch.Tensor, k: torch.Tensor, masked: bool, dropout_p: float) -> AutotuneKey:
        """The key of a call with queries ``q`` ``[B, H, N, d]`` and keys ``k`` ``[B, H, M, d]``."""
        return cls(
            device=device_name(q.device),
            dtype=str(q.dtype).removeprefix("torch."),
            training=torch.is_grad_enabled() and q.requires_grad,
            head_dim=q.shape[-1],
            queries=bucket(q.shape[-2]),
            keys=bucket(k.shape[-2]),
            batch_heads=bucket(q.shape[0] * q.shape[1]),
            masked=masked,
            dropout=dropout_p > 0.0,
        )

    def to_text(self) -> str:
        """One line that names the key in the cache file, with the torch version (kernels change)."""
        return f"torch {torch.__version__} | " + " | ".join(f"{name}={value}" for name, value in self._asdict().items())


@dataclass(frozen=True)
class AutotuneChoice:
    """A key's kernel and the measurement behind it: each kernel's best time in milliseconds per
    call, their ratio (SDPA / explicit: > 1 means explicit is faster), the measurement's wall time,
    the measured shape ``[BH, N, M, d]``, and ``source``: ``"measured"`` here or ``"cache"``."""

    kernel: str
    sdpa_ms: float
    explicit_ms: float
    speedup: float
    cost_ms: float
    shape: tuple[int, int, int, int]
    source: str = "measured"


class Autotuner:
    """Measures and remembers the faster kernel per :class:`AutotuneKey`.

    Args:
        kernels: ``{"sdpa": ..., "explicit": ...}`` with the contract of :mod:`.attention`.
        clock: seconds as a float (tests inject a fake clock).
    """

    def __init__(self, kernels: Mapping[str, Kernel], clock: Callable[[], float] = time.perf_counter) -> None:
        self.kernels = kernels
        self.clock = clock
        self.choices: dict[AutotuneKey, AutotuneChoice] = {}
        self._cache_path: Path | None = None
        self._cache_path_set = False
        self._disk: dict[str, dict[str, Any]] | None = None
        self._asked: set[AutotuneKey] | None = None

    def set_cache_path(self, path: str | os.PathLike | None) -> None:
        """Read and write measured choices in the JSON file ``path`` (``None``: memory only). This
        overrides ``VITKIT_AUTOTUNE_CACHE``."""
        resolved = None if path is None else Path(path).expanduser().resolve()  # a later chdir does not move it
        self._cache_path, self._cache_path_set, self._disk = resolved, True, None

    def cached(self, key: AutotuneKey) -> str | None:
        """The kernel chosen for ``key`` earlier (in memory or in the cache file), without measuring."""
        if self._asked is not None:
            self._asked.add(key)
        if key not in self.choices:
            stored = self._read_disk().get(key.to_text())
            if stored is not None:
                self.choices[key] = _choice_from_json(stored)
        choice = self.choices.get(key)
        return None if choice is None else choice.kernel

    def choose(self, q: torch.Tensor, k: torch.Tensor, masked: bool, dropout_p: float, scale: float) -> str:
        """The faster kernel for this call's key; measured now if no choice is known yet."""
        key = AutotuneKey.of(q, k, masked, dropout_p)
        kernel = self.cached(key)
        if kernel is None:
            self.choices[key] = self.measure(key, q, k, dropout_p, scale)
            self._write_disk(key)
            kernel = self.choices[key].kernel
        return kernel

    def measure(self, key: AutotuneKey, q: torch.Tensor, k: torch.Tensor, dropout_p: float, scale: float) -> AutotuneChoice:
        """Time every kernel on synthetic tensors shaped like ``q`` ``[B, H, N, d]`` and ``k``
        ``[B, H, M, d]`` (batch x heads shrunk to :data:`MEASURE_ELEMENTS` scores), leaving the
        global RNG, autograd's saved-tensor hooks and the caller's tensors untouched."""
        started = self.clock()
        num_queries, num_keys, head_dim = q.shape[-2], k.shape[-2], q.shape[-1]
        batch_heads = min(q.shape[0] * q.shape[1], max(1, MEASURE_ELEMENTS // (num_queries * num_keys)))
        rng_devices = [q.device] if q.device.type != "cpu" else []
        with torch.random.fork_rng(rng_devices, device_type=q.device.type), _plain_saved_tensors():
            calls = {
                name: _timed_call(kernel, (batch_heads, num_queries, num_keys, head_dim), q, key, dropout_p, scale)
                for name, kernel in self.kernels.items()
            }
            times = interleaved_times(
                calls, repeats=MEASURE_ROUNDS, min_repeats=3, budget_s=MEASURE_BUDGET_S, clock=self.clock
            )
        sdpa_s, explicit_s = min(times["sdpa"]), min(times["explicit"])  # best of: robust to preemption
        return AutotuneChoice(
            kernel="explicit" if sdpa_s >= (1.0 + EXPLICIT_MARGIN) * explicit_s else "sdpa",
            sdpa_ms=1e3 * sdpa_s,
            explicit_ms=1e3 * explicit_s,
            speedup=sdpa_s / explicit_s,
            cost_ms=1e3 * (self.clock() - started),
            shape=(batch_heads, num_queries, num_keys, head_dim),
        )

    @contextlib.contextmanager
    def recording(self) -> Iterator[set[AutotuneKey]]:
        """Collect, in the yielded set, every key asked for inside the block (a benchmark learns
        which keys its cell used, and so which kernels ran, without rebuilding the keys)."""
        outer, self._asked = self._asked, set()
        try:
            yield self._asked
        finally:
            asked, self._asked = self._asked, outer
            if outer is not None:
                outer |= asked

    def report(self) -> list[dict[str, Any]]:
        """Every choice held, one JSON-ready row per key: the key's fields, then the choice's."""
        return [{**key._asdict(), **asdict(choice), "shape": list(choice.shape)} for key, choice in self.choices.items()]

    def cache_path(self) -> Path | None:
        """The cache file in use: the one set with :meth:`set_cache_path`, else ``$VITKIT_AUTOTUNE_CACHE``."""
        if self._cache_path_set:
            return self._cache_path
        env = os.environ.get(CACHE_ENV)
        return Path(env) if env else None

    def _read_disk(self) -> dict[str, dict[str, Any]]:
        """The cache file's entries, read once; a missing file is empty, a corrupt one is ignored
        with a warning (and never overwritten)."""
        if self._disk is None:
            self._disk = {}
            path = self.cache_path()
            if path is not None and path.exists():
                self._disk = _load_entries(path) or {}
        return self._disk

    def _write_disk(self, key: AutotuneKey) -> None:
        """Add ``key``'s choice to the cache file (merged with what other processes wrote since)."""
        path = self.cache_path()
        if path is None:
            return
        entries = _load_entries(path) if path.exists() else {}
        if entries is None:
            return
        entries[key.to_text()] = {**asdict(self.choices[key]), "source": "cache"}
        text = json.dumps({"vitkit_autotune": CACHE_FORMAT, "entries": entries}, indent=1, sort_keys=True)
        atomic_write(path, lambda tmp: Path(tmp).write_text(text + "\n"))
        self._disk = entries


def _load_entries(path: Path) -> dict[str, dict[str, Any]] | None:
    """The entries of the cache file ``path``; ``None`` (with a warning) if it is unreadable or
    not a regular file (a FIFO is refused without blocking, and never replaced)."""
    try:
        data = json.loads(read_regular_text(path))
        entries = data["entries"]
        if data.get("vitkit_autotune") != CACHE_FORMAT or not isinstance(entries, dict):
            raise ValueError(f"format {data.get('vitkit_autotune')!r}, expected {CACHE_FORMAT}")
        for entry in entries.values():
            _choice_from_json(entry)
        return entries
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        warnings.warn(
            f"attention autotune cache {path} is unreadable ({error}); measuring instead and leaving the "
            f"file as it is. Delete it or point {CACHE_ENV} at another file.",
            stacklevel=2,
        )
        return None


def _choice_from_json(entry: dict[str, Any]) -> AutotuneChoice:
    choice = AutotuneChoice(**{**entry, "shape": tuple(entry["shape"])})
    if choice.kernel not in ("sdpa", "explicit"):
        raise ValueError(f"unknown kernel {choice.kernel!r}")
    return choice


def _timed_call(
    kernel: Kernel,
    shape: tuple[int, int, int, int],
    like: torch.Tensor,
    key: AutotuneKey,
    dropout_p: float,
    scale: float,
) -> Callable[[], None]:
    """One synchronised call of ``kernel`` on fresh tensors of ``shape`` ``[BH, N, M, d]`` (as
    ``[BH, 1, n, d]``), with a backward when ``key.training``."""
    batch_heads, num_queries, num_keys, head_dim = shape
    options = dict(device=like.device, dtype=like.dtype, requires_grad=key.training)
    q = torch.randn(batch_heads, 1, num_queries, head_dim, **options)
    k, v = (torch.randn(batch_heads, 1, num_keys, head_dim, **options) for _ in range(2))
    allowed = torch.ones(num_queries, num_keys, dtype=torch.bool, device=like.device) if key.masked else None
    synchronize = getattr(torch, like.device.type).synchronize

    def call() -> None:
        out = kernel(q, k, v, allowed, dropout_p, scale)
        out = out[0] if isinstance(out, tuple) else out
        if key.training:
            torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
        synchronize()

    return call


def _plain_saved_tensors() -> torch.autograd.graph.saved_tensors_hooks:
    """Identity saved-tensor hooks: the measurement's backward must not go through an enclosing
    activation checkpoint's hooks, which would count or recompute its tensors."""
    return torch.autograd.graph.saved_tensors_hooks(lambda tensor: tensor, lambda tensor: tensor)
