"""Choose a training run's attention kernel on the run's own steps.

Attention timed alone, once, on synthetic tensors (:mod:`vitkit.kernels.autotune`) does not
predict the whole step, and a measurement made during a load spike would decide the whole run.
A training run repeats the same step thousands of times, so it can measure the real thing: during
its first steps :class:`TrainingKernelChooser` runs whole training steps with SDPA and with the
explicit kernel in A/B pairs, on the run's own batches, and :class:`KernelTrial` chooses by the
median of the pairs' time ratios. The measurement costs only the slower kernel's extra time.

A pair's two steps run back to back, so a slow period slows both and cancels in their ratio; the
order alternates (AB, BA, ...) so neither kernel always runs first. A choice on weak evidence
(a wide spread of the ratios) is measured again later, and so is a choice whose step time
drifts far from what it was when the choice was made (the load the choice saw has gone, or
arrived): a load spike at startup does not decide the rest of the run.
"""

from __future__ import annotations

import statistics
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback

from ..layers import MultiHeadSelfAttention

KERNELS = ("sdpa", "explicit")
#: Timed A/B pairs per measurement round (the median of their ratios decides).
MIN_PAIRS = 5
#: Explicit must be this much faster (median SDPA / explicit step-time ratio) to be chosen, so
#: equal kernels keep SDPA, timm's kernel. Whole steps are timed, so the margin can be small.
EXPLICIT_MARGIN = 0.05
#: Evidence is weak when the ratios' interquartile range exceeds this share of their median.
SPREAD_LIMIT = 0.25
#: A choice on weak evidence is measured again this many steps after it was made.
RECHECK_AFTER_STEPS = 50
#: Steps of the chosen kernel whose median is compared with the step time at the choice.
DRIFT_WINDOW = 10
#: The step time has drifted when that median differs from the one at the choice by this share.
DRIFT_LIMIT = 0.3
#: Measurement rounds per key at most (the first included): the cost stays bounded.
MAX_ROUNDS = 4
#: Steps before a key's first choice: one untimed warm-up step per kernel (lazy initialisation,
#: oneDNN primitive creation, compilation under ``torch.compile``), then the timed pairs.
STEPS_TO_CHOOSE = len(KERNELS) + 2 * MIN_PAIRS


@dataclass
class Round:
    """One measurement round of a key: at which step it started and why, its A/B pairs (seconds
    per step and kernel) and, once complete, what they showed."""

    step: int
    reason: str
    pairs: list[dict[str, float]] = field(default_factory=list)
    median_s: dict[str, float] = field(default_factory=dict)
    ratio: float | None = None  # median over pairs of sdpa / explicit: > 1 means explicit is faster
    spread: float | None = None  # interquartile range of the ratios / their median
    kernel: str | None = None

    def decide(self) -> None:
        ratios = [pair["sdpa"] / pair["explicit"] for pair in self.pairs]
        quartiles = statistics.quantiles(ratios, n=4, method="inclusive")
        self.ratio = statistics.median(ratios)
        self.spread = (quartiles[2] - quartiles[0]) / self.ratio
        self.median_s = {name: statistics.median(pair[name] for pair in self.pairs) for name in KERNELS}
        self.kernel = "explicit" if self.ratio >= 1.0 + EXPLICIT_MARGIN else "sdpa"

    def to_json(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "reason": self.reason,
            "pairs": [{name: round(pair[name], 6) for name in KERNELS} for pair in self.pairs],
            "median_s": {name: round(value, 6) for name, value in self.median_s.items()},
            "median_ratio_sdpa_over_explicit": None if self.ratio is None else round(self.ratio, 4),
            "spread": None if self.spread is None else round(self.spread, 4),
            "kernel": self.kernel,
        }


@dataclass
class _KeyState:
    rounds: list[Round]
    warmup: list[str] = field(default_factory=lambda: list(KERNELS))
    pair: dict[str, float] = field(default_factory=dict)
    kernel: str | None = None  # the current choice
    reference_s: float = 0.0  # the chosen kernel's median step time at the choice
    recheck_at: int | None = None
    recent: deque[float] = field(default_factory=lambda: deque(maxlen=DRIFT_WINDOW))
    steps: Counter[str] = field(default_factory=Counter)  # steps run with each kernel

    @property
    def measuring(self) -> bool:
        return self.rounds[-1].kernel is None


class KernelTrial:
    """Which kernel each training step runs, per step key (the batch's shape), from the timings of
    the steps before it. Pure bookkeeping: the caller times the steps.

    Per key: two warm-up steps (one per kernel, untimed), then :data:`MIN_PAIRS` A/B pairs; the
    choice is made after :data:`STEPS_TO_CHOOSE` steps. It is measured again
    :data:`RECHECK_AFTER_STEPS` steps later when the spread was above :data:`SPREAD_LIMIT`, and as
    soon as :data:`DRIFT_WINDOW` steps' median moves more than :data:`DRIFT_LIMIT` from the step
    time at the choice; at most :data:`MAX_ROUNDS` rounds per key.
    """

    def __init__(self) -> None:
        self.keys: dict[str, _KeyState] = {}

    def kernel_for(self, key: str, step: int) -> str:
        """The kernel the next step of ``key`` (the run's step ``step``) runs."""
        state = self.keys.setdefault(key, _KeyState(rounds=[Round(step, "first steps")]))
        if not state.measuring and state.recheck_at is not None and step >= state.recheck_at:
            self._start_round(state, step, f"weak evidence: spread {state.rounds[-1].spread:.2f} > {SPREAD_LIMIT}")
        if not state.measuring:
            return state.kernel
        if state.warmup:
            return state.warmup[0]
        order = KERNELS if len(state.rounds[-1].pairs) % 2 == 0 else KERNELS[::-1]
        return next(name for name in order if name not in state.pair)

    def record(self, key: str, kernel: str, seconds: float, step: int) -> None:
        """The step ``step`` of ``key`` ran ``kernel`` and took ``seconds``."""
        state = self.keys[key]
        state.steps[kernel] += 1
        if not state.measuring:
            self._watch_drift(state, kernel, seconds, step)
            return
        if state.warmup:
            state.warmup.remove(kernel)
            return
        state.pair[kernel] = seconds
        if len(state.pair) < len(KERNELS):
            return
        current = state.rounds[-1]
        current.pairs.append(state.pair)
        state.pair = {}
        if len(current.pairs) >= MIN_PAIRS:
            current.decide()
            state.kernel, state.reference_s = current.kernel, current.median_s[current.kernel]
            state.recent.clear()
            weak = current.spread > SPREAD_LIMIT and len(state.rounds) < MAX_ROUNDS
            state.recheck_at = step + RECHECK_AFTER_STEPS if weak else None

    def _watch_drift(self, state: _KeyState, kernel: str, seconds: float, step: int) -> None:
        if kernel != state.kernel:
            return
        state.recent.append(seconds)
        if len(state.recent) < DRIFT_WINDOW or len(state.rounds) >= MAX_ROUNDS:
            return
        now = statistics.median(state.recent)
        if abs(now / state.reference_s - 1.0) > DRIFT_LIMIT:
            self._start_round(
                state, step + 1, f"drift: {state.kernel} steps took {1e3 * now:.1f} ms, {1e3 * state.reference_s:.1f} ms at the choice"
            )

    @staticmethod
    def _start_round(state: _KeyState, step: int, reason: str) -> None:
        state.rounds.append(Round(step, reason))
        state.pair, state.recheck_at = {}, None

    def report(self) -> list[dict[str, Any]]:
        """One JSON-ready row per key: the final kernel (``None``: still measuring), the timed
        pairs, when and why it was measured again, what the measurement cost (``ab_extra_s``: the
        seconds each pair's slower step took beyond its faster one, summed; warm-up steps are
        untimed), how many steps ran each kernel, and every round's evidence."""
        rows = []
        for key, state in self.keys.items():
            pairs = [pair for measured in state.rounds for pair in measured.pairs]
            rows.append({
                "key": key,
                "final_kernel": state.kernel,
                "pairs": len(pairs),
                "remeasured": [{"step": measured.step, "reason": measured.reason} for measured in state.rounds[1:]],
                "ab_extra_s": round(sum(max(pair.values()) - min(pair.values()) for pair in pairs), 4),
                "steps": dict(state.steps),
                "rounds": [measured.to_json() for measured in state.rounds],
            })
        return rows


def step_key(batch: Any) -> str:
    """A training step's key: the shape of its input batch (``"128x1x28x28"``); steps of one key
    do the same work, so their times compare."""
    images = batch[0] if isinstance(batch, (tuple, list)) else batch
    return "x".join(str(size) for size in images.shape)


class TrainingKernelChooser(Callback):
    """Sets the kernel of every ``"auto"`` attention module before each training step, as
    :class:`KernelTrial` says, and times the step (from the batch's start to its end: forward,
    backward, optimiser step) with ``clock``. Modules pinned to a kernel (``attn_impl`` or
    ``VITKIT_ATTN_IMPL``) are left alone; outside training steps the modules are ``"auto"`` again
    (evaluation batches use the synthetic measurement).

    Args:
        clock: seconds as a float (tests inject a fake clock).
    """

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self.clock = clock
        self.trial = KernelTrial()
        self.modules: list[MultiHeadSelfAttention] = []
        self._step: tuple[str, str, int, float] | None = None

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self.modules = [m for m in pl_module.modules() if isinstance(m, MultiHeadSelfAttention) and m.kernel_policy == "auto"]

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int) -> None:
        if not self.modules:
            return
        key, step = step_key(batch), trainer.global_step
        kernel = self.trial.kernel_for(key, step)
        for module in self.modules:
            module.kernel_policy = kernel
        _synchronize(pl_module)
        self._step = (key, kernel, step, self.clock())

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self._step is None:
            return
        _synchronize(pl_module)
        key, kernel, step, started = self._step
        self.trial.record(key, kernel, self.clock() - started, step)
        for module in self.modules:
            module.kernel_policy = "auto"
        self._step = None

    def report(self) -> dict[str, Any]:
        """``{"pinned": ...}`` when no module was ``"auto"``, else ``{"keys": KernelTrial.report()}``."""
        if not self.modules:
            return {"pinned": "every attention module has a fixed kernel (attn_impl or VITKIT_ATTN_IMPL)"}
        return {"keys": self.trial.report()}


def _synchronize(pl_module: L.LightningModule) -> None:
    """Wait for queued GPU work, so the clock reads when the step's work is done."""
    device = getattr(pl_module, "device", torch.device("cpu"))
    if device.type == "cuda":
        torch.cuda.synchronize(device)
