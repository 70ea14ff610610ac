"""Choose a training run's attention kernel on the run's own steps.

Attention timed alone, once, on synthetic tensors (:mod:`vitkit.kernels.autotune`) does not
predict the whole step, and a measurement made during a load spike would decide the whole run.
A training run repeats the same step thousands of times, so it can measure the real thing: during
its first steps :class:`TrainingKernelChooser` runs whole training steps with SDPA and with the
explicit kernel in A/B pairs, on the run's own batches, and :class:`KernelTrial` chooses by the
pairs' time ratios. The measurement costs only the slower kernel's extra time, and the device
synchronisations of the timed steps; once a key's choice is final its steps are neither timed nor
synchronised.

A pair's two steps run back to back, so a slow period slows both and cancels in their ratio. The
order alternates (AB, BA, ...) over an even number of pairs, and each AB pair's ratio is combined
with the next BA pair's (their geometric mean), so a penalty on whichever step runs first cancels
exactly; the median over these balanced ratios decides, so one disturbed pair does not. Ties
(within :data:`EXPLICIT_MARGIN`) keep SDPA. A choice on weak evidence (a wide spread of the
ratios) is measured again later. On the CPU, a choice whose step time drifts far from what it was
when the choice was made (the load the choice saw has gone, or arrived) is measured again too:
there the clock alone reads a step's time. On a GPU it would need a synchronisation every step,
which drains the launch queue, so the drift watch is off there and a choice is final once made.

Under DDP, rank 0's timings decide: at each decision the evidence is broadcast from rank 0, so
every rank runs the same kernel at every step (the ranks' keys agree step by step: training
batches drop the last partial batch and the distributed sampler gives each rank as many).
"""

from __future__ import annotations

import math
import statistics
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple, TypeVar

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback

from ..layers import AttentionBase

KERNELS = ("sdpa", "explicit")
#: Timed A/B pairs per measurement round: even, half AB and half BA, so that an order effect cancels.
MIN_PAIRS = 6
#: Explicit must be this much faster (median balanced SDPA / explicit step-time ratio) to be
#: chosen, so equal kernels keep SDPA, timm's kernel. Whole steps are timed, so the margin can be small.
EXPLICIT_MARGIN = 0.05
#: Evidence is weak when the balanced ratios' interquartile range exceeds this share of their median.
SPREAD_LIMIT = 0.25
#: A choice on weak evidence is measured again this many steps after it was made.
RECHECK_AFTER_STEPS = 50
#: Steps of the chosen kernel per drift window (CPU only): their median is compared with the step
#: time at the choice at the end of each window.
DRIFT_WINDOW = 10
#: The step time has drifted when a window's median differs from the one at the choice by this share.
DRIFT_LIMIT = 0.3
#: Measurement rounds per key at most (the first included): the cost stays bounded.
MAX_ROUNDS = 4
#: Steps before a key's first choice: one untimed warm-up step per kernel (lazy initialisation,
#: oneDNN primitive creation, compilation under ``torch.compile``), then the timed pairs.
STEPS_TO_CHOOSE = len(KERNELS) + 2 * MIN_PAIRS

#: How a step is timed: ``"synchronized"`` (a measured step: the device is waited for before and
#: after), ``"clock"`` (a drift-watch step on the CPU: the clock alone), ``None``: not at all.
Timing = Literal["synchronized", "clock"] | None
T = TypeVar("T")


def _same(value: T) -> T:
    """One process's agreement with itself: its own evidence."""
    return value


@dataclass
class Round:
    """One measurement round of a key: at which step it started and why, its A/B pairs (seconds
    per step and option; even pairs ran the first option first, odd ones the second) and, once
    complete, what they showed. The options are the attention kernels unless given (the compile
    trial's eager and compiled model, :mod:`vitkit.train.compile_trial`): the first is kept on a
    tie, the second must be ``margin`` faster."""

    step: int
    reason: str
    pairs: list[dict[str, float]] = field(default_factory=list)
    median_s: dict[str, float] = field(default_factory=dict)
    ratio: float | None = None  # median balanced first / second ratio: > 1 means the second is faster
    spread: float | None = None  # interquartile range of the balanced ratios / their median
    kernel: str | None = None  # the option chosen
    options: tuple[str, str] = KERNELS
    margin: float = EXPLICIT_MARGIN

    def decide(self) -> None:
        """Choose from the pairs: each AB pair's ratio and the next BA pair's, combined by their
        geometric mean (a first-in-pair penalty multiplies one by ``1 + p`` and divides the other,
        so it cancels), then the median over these balanced ratios."""
        first, second = self.options
        ratios = [pair[first] / pair[second] for pair in self.pairs]
        balanced = [math.sqrt(ab * ba) for ab, ba in zip(ratios[0::2], ratios[1::2])]
        quartiles = statistics.quantiles(balanced, n=4, method="inclusive")
        self.ratio = statistics.median(balanced)
        self.spread = (quartiles[2] - quartiles[0]) / self.ratio
        self.median_s = {name: statistics.median(pair[name] for pair in self.pairs) for name in self.options}
        self.kernel = second if self.ratio >= 1.0 + self.margin else first

    def to_json(self) -> dict[str, Any]:
        first, second = self.options
        return {
            "step": self.step,
            "reason": self.reason,
            "pairs": [{name: round(pair[name], 6) for name in self.options} for pair in self.pairs],
            "median_s": {name: round(value, 6) for name, value in self.median_s.items()},
            f"median_ratio_{first}_over_{second}": None if self.ratio is None else round(self.ratio, 4),
            "spread": None if self.spread is None else round(self.spread, 4),
            "kernel" if self.options == KERNELS else "choice": self.kernel,
        }


@dataclass
class _KeyState:
    rounds: list[Round]
    warmup: list[str] = field(default_factory=lambda: list(KERNELS))
    pair: dict[str, float] = field(default_factory=dict)
    kernel: str | None = None  # the current choice
    reference_s: float = 0.0  # the chosen kernel's median step time at the choice
    recheck_at: int | None = None
    window: list[float] = field(default_factory=list)  # the drift window's step times so far
    steps: Counter[str] = field(default_factory=Counter)  # steps run with each kernel

    @property
    def measuring(self) -> bool:
        return self.rounds[-1].kernel is None


class KernelTrial:
    """Which kernel each training step runs, per step key (the batch's shape), from the timings of
    the steps before it. Pure bookkeeping: the caller times the steps, as :meth:`timing` says.

    Per key: two warm-up steps (one per kernel), then :data:`MIN_PAIRS` A/B pairs; the choice is
    made after :data:`STEPS_TO_CHOOSE` steps. It is measured again :data:`RECHECK_AFTER_STEPS`
    steps later when the spread was above :data:`SPREAD_LIMIT` and, with ``watch_drift``, when a
    window of :data:`DRIFT_WINDOW` steps' median moves more than :data:`DRIFT_LIMIT` from the step
    time at the choice; at most :data:`MAX_ROUNDS` rounds per key. The control flow depends on step
    counts and on the values that pass through :meth:`record`'s ``agree`` only, so processes that
    agree on those make the same choices at the same steps.

    Args:
        watch_drift: watch the chosen kernel's step times for drift (on the CPU, where reading
            them costs nothing; off on a GPU, where it would cost a synchronisation every step).
    """

    def __init__(self, watch_drift: bool = True) -> None:
        self.watch_drift = watch_drift
        self.keys: dict[str, _KeyState] = {}

    def kernel_for(self, key: str, step: int) -> str:
        """The kernel the next step of ``key`` (the run's step ``step``) runs."""
        state = self.keys.setdefault(key, _KeyState(rounds=[Round(step, "first steps")]))
        if not state.measuring and state.recheck_at is not None and step >= state.recheck_at:
            self._start_round(state, step, f"weak evidence: spread {state.rounds[-1].spread:.2f} > {SPREAD_LIMIT}")
        if not state.measuring:
            kernel = state.kernel
        elif state.warmup:
            kernel = state.warmup[0]
        else:
            order = KERNELS if len(state.rounds[-1].pairs) % 2 == 0 else KERNELS[::-1]
            kernel = next(name for name in order if name not in state.pair)
        state.steps[kernel] += 1
        return kernel

    def timing(self, key: str) -> Timing:
        """How the step :meth:`kernel_for` just gave ``key`` its kernel for is timed (and then
        :meth:`record` ed): ``None`` once the key's choice is final, or until its re-measurement."""
        state = self.keys[key]
        if state.measuring:
            return "synchronized"
        if self.watch_drift and len(state.rounds) < MAX_ROUNDS:
            return "clock"
        return None

    def is_final(self, key: str) -> bool:
        """``key`` has a kernel that no later step will measure again."""
        state = self.keys[key]
        return not state.measuring and state.recheck_at is None and self.timing(key) is None

    def record(self, key: str, kernel: str, seconds: float, step: int, agree: Callable[[T], T] = _same) -> None:
        """The step ``step`` of ``key`` ran ``kernel`` and took ``seconds``. The evidence of each
        decision (a round's pairs, a drift window's median) passes through ``agree`` first: under
        DDP a broadcast from rank 0, called by every rank at the same step."""
        state = self.keys[key]
        if self.timing(key) is None:
            return
        if not state.measuring:
            self._watch_drift(state, seconds, step, agree)
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
            current.pairs = agree(current.pairs)
            current.decide()
            state.kernel, state.reference_s = current.kernel, current.median_s[current.kernel]
            state.window = []
            weak = current.spread > SPREAD_LIMIT and len(state.rounds) < MAX_ROUNDS
            state.recheck_at = step + RECHECK_AFTER_STEPS if weak else None

    def _watch_drift(self, state: _KeyState, seconds: float, step: int, agree: Callable[[T], T]) -> None:
        state.window.append(seconds)
        if len(state.window) < DRIFT_WINDOW:
            return
        now, state.window = agree(statistics.median(state.window)), []
        if abs(now / state.reference_s - 1.0) > DRIFT_LIMIT:
            self._start_round(
                state, step + 1, f"drift: {state.kernel} steps took {1e3 * now:.1f} ms, {1e3 * state.reference_s:.1f} ms at the choice"
            )

    @staticmethod
    def _start_round(state: _KeyState, step: int, reason: str) -> None:
        state.rounds.append(Round(step, reason))
        state.pair, state.recheck_at, state.window = {}, None, []

    def report(self) -> list[dict[str, Any]]:
        """One JSON-ready row per key: the current kernel (``None``: still measuring), whether it is
        final (no step is timed any more), the timed pairs, when and why it was measured again,
        what the measurement cost (``ab_extra_s``: the seconds each pair's slower step took beyond
        its faster one, summed; warm-up steps are not counted), how many steps ran each kernel, and
        every round's evidence."""
        rows = []
        for key, state in self.keys.items():
            pairs = [pair for measured in state.rounds for pair in measured.pairs]
            rows.append({
                "key": key,
                "final_kernel": state.kernel,
                "final": self.is_final(key),
                "pairs": len(pairs),
                "remeasured": [{"step": measured.step, "reason": measured.reason} for measured in state.rounds[1:]],
                "ab_extra_s": round(sum(max(pair.values()) - min(pair.values()) for pair in pairs), 4),
                "steps": dict(state.steps),
                "rounds": [measured.to_json() for measured in state.rounds],
            })
        return rows


def step_key(batch: Any) -> str:
    """A training step's key: the shape of its input batch (``"128x1x28x28"``; of each view,
    joined by ``+``, for a list of crops); steps of one key do the same work, so their times compare."""
    images = batch[0] if isinstance(batch, (tuple, list)) else batch
    views = images if isinstance(images, (tuple, list)) else [images]  # DINO's crops: one key for all of them
    return "+".join("x".join(str(size) for size in view.shape) for view in views)


class _Step(NamedTuple):
    """The training step under way: its key, kernel, global step, timing and clock at its start."""

    key: str
    kernel: str
    step: int
    timing: Timing
    started: float


class TrainingKernelChooser(Callback):
    """Sets the kernel of every ``"auto"`` attention module before each training step, as
    :class:`KernelTrial` says, and times the steps it asks for (from the batch's start to its end:
    forward, backward, optimiser step) with ``clock``. Modules pinned to a kernel (``attn_impl`` or
    ``VITKIT_ATTN_IMPL``) are left alone; outside training steps the modules are ``"auto"`` again
    (evaluation batches use the synthetic measurement). Under DDP rank 0's timings decide
    (broadcast with ``trainer.strategy.broadcast``), and at the end of training every rank's steps
    per kernel are gathered into :meth:`report` (``ranks``).

    A run that asked for determinism (``trainer.deterministic=true``) passes ``pin="sdpa"``: its
    ``"auto"`` modules run SDPA for the whole run, training and evaluation alike, nothing is timed,
    and a seed gives the same weights on the same machine whatever else runs on it (timings would
    decide which steps each kernel trains, and the two kernels round differently).

    Args:
        clock: seconds as a float (default ``time.perf_counter``; tests inject a fake clock).
        watch_drift: see :class:`KernelTrial`; ``None``: on the CPU only (decided at the start of
            training, from the module's device).
        pin: a kernel that every ``"auto"`` module runs for the whole run instead of a measured one.
    """

    def __init__(
        self, clock: Callable[[], float] | None = None, watch_drift: bool | None = None, pin: str | None = None
    ) -> None:
        if pin is not None and pin not in KERNELS:
            raise ValueError(f"pin must be one of {KERNELS}, got {pin!r}.")
        self.clock = clock if clock is not None else time.perf_counter
        self.pin = pin
        self.watch_drift = watch_drift
        self.trial = KernelTrial()
        self.modules: list[AttentionBase] = []
        self.ranks: list[dict[str, Any]] = []
        self._step: _Step | None = None
        #: While set (by :class:`~vitkit.train.compile_trial.CompileChooser`, whose trial steps
        #: differ in more than the kernel), a key with a choice runs it untimed: no drift window
        #: sees those steps.
        self.paused = False

    def settled(self, key: str) -> bool:
        """``key`` has a kernel (not being measured now), or no module is ``"auto"``."""
        return not self.modules or (key in self.trial.keys and not self.trial.keys[key].measuring)

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        # the module's own, and its bfloat16 copy's (trainer.precision=bf16-true), which the steps run
        step_model = getattr(pl_module, "step_model", pl_module)
        modules = dict.fromkeys([*pl_module.modules(), *step_model.modules()])
        self.modules = [m for m in modules if isinstance(m, AttentionBase) and m.attn_impl == "auto"]
        if self.pin is not None:
            ema = getattr(pl_module, "ema", None)  # kept outside the module's children (DDP), evaluated too
            for module in [*self.modules, *(ema.modules() if isinstance(ema, torch.nn.Module) else ())]:
                if isinstance(module, AttentionBase) and module.attn_impl == "auto":
                    module.attn_impl = self.pin
            self.modules = []

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.trial.watch_drift = training_device(pl_module).type == "cpu" if self.watch_drift is None else self.watch_drift

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int) -> None:
        if not self.modules:
            return
        key, step = step_key(batch), trainer.global_step
        paused = self.paused and self.settled(key)
        kernel = self.trial.keys[key].kernel if paused else self.trial.kernel_for(key, step)
        for module in self.modules:
            module.attn_impl = kernel
        timing = None if paused else self.trial.timing(key)
        if timing == "synchronized":
            wait_for_device(pl_module)
        self._step = _Step(key, kernel, step, timing, self.clock() if timing else 0.0)

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self._step is None:
            return
        key, kernel, step, timing, started = self._step
        if timing == "synchronized":
            wait_for_device(pl_module)
        if timing:
            self.trial.record(key, kernel, self.clock() - started, step, agree=lambda value: trainer.strategy.broadcast(value, src=0))
        for module in self.modules:
            module.attn_impl = "auto"
        self._step = None

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.world_size > 1 and self.modules and torch.distributed.is_initialized():
            mine = {key: dict(state.steps) for key, state in self.trial.keys.items()}
            gathered: list[Any] = [None] * trainer.world_size
            torch.distributed.all_gather_object(gathered, mine)
            self.ranks = [{"rank": rank, "steps": steps} for rank, steps in enumerate(gathered)]

    def report(self) -> dict[str, Any]:
        """``{"pinned": ...}`` when no module was ``"auto"``, else ``{"keys": KernelTrial.report()}``,
        with ``"ranks"`` under DDP: the steps each rank ran with each kernel, per key."""
        if self.pin is not None:
            return {"pinned": f"{self.pin} for the whole run (trainer.deterministic: no kernel is timed)"}
        if not self.modules:
            return {"pinned": "every attention module has a fixed kernel (attn_impl or VITKIT_ATTN_IMPL)"}
        return {"keys": self.trial.report(), **({"ranks": self.ranks} if self.ranks else {})}


def training_device(pl_module: L.LightningModule) -> torch.device:
    """The module's device (a plain ``nn.Module``, as in tests, is on the CPU)."""
    return getattr(pl_module, "device", torch.device("cpu"))


def wait_for_device(pl_module: L.LightningModule) -> None:
    """Wait for queued GPU work, so the clock reads when the step's work is done."""
    device = training_device(pl_module)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
