"""Callbacks: ``last.ckpt`` every N steps, at every epoch end and on SIGTERM, Ctrl-C handled as
SIGTERM, SIGTERM during the work after training, training throughput, a progress bar that never waits for the device, and a CUDA check
that does not reopen NVML every step.

Lightning's ``ModelCheckpoint(save_last=True)`` writes ``last.ckpt`` only when it saves a monitored
or periodic checkpoint, and its ``OnExceptionCheckpoint`` saves on any exception (a diverged run
too); :class:`LastCheckpoint` saves on its own step schedule and on a stop signal only."""

from __future__ import annotations

import contextlib
import math
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, TQDMProgressBar
from lightning.pytorch.utilities.exceptions import SIGTERMException


class LossProgressBar(TQDMProgressBar):
    """Lightning's progress bar, with the training loss of the latest logging step
    (``ViTModule.shown_loss``) in place of a per-step progress-bar metric, which Lightning would
    read as a number after every step (a host sync that stalls a GPU).

    The training bar is redrawn at most every ``min_interval_s`` seconds of ``clock``, and at an
    epoch's last batch: Lightning's own bar redraws twice after every step (``refresh_rate=1``),
    which no one reads at a hundred steps a second and which fills a log file (a SLURM or CI log
    of 400 steps of a small model held 804 redraws, 73 kB; 64 redraws, 7 kB at 0.1 s)."""

    def __init__(self, min_interval_s: float = 0.1, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.min_interval_s = min_interval_s
        self.clock = clock
        self._drawn_at = -math.inf

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        now = self.clock()
        if batch_idx + 1 >= self.total_train_batches or now - self._drawn_at >= self.min_interval_s:
            self._drawn_at = now
            super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)

    def get_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, Any]:
        metrics = super().get_metrics(trainer, pl_module)
        loss = getattr(pl_module, "shown_loss", None)
        return metrics if loss is None else {"loss": f"{loss:.4g}", **metrics}


class LastCheckpoint(Callback):
    """Keep ``path`` (``last.ckpt``) current: rewritten every ``every_n_steps`` optimiser steps
    (0: never mid-epoch), after every epoch (after validation) and when the run is stopped by
    SIGTERM, so a killed run resumes losing at most the steps since the last save. Writes go
    through the trainer's (atomic) checkpoint IO."""

    def __init__(self, path: str | Path, every_n_steps: int) -> None:
        self.path = str(path)
        self.every_n_steps = every_n_steps
        self._last_saved_step = -1

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        step = trainer.global_step
        if self.every_n_steps and step % self.every_n_steps == 0:
            self._save(trainer)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._save(trainer)

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        if isinstance(exception, SIGTERMException):
            self._save(trainer)

    def _save(self, trainer: L.Trainer) -> None:
        if trainer.sanity_checking or trainer.global_step == self._last_saved_step:
            return
        trainer.save_checkpoint(self.path, weights_only=False)
        self._last_saved_step = trainer.global_step


class CtrlCStops(Callback):
    """Ctrl-C (SIGINT) during training stops the run as SIGTERM does: at the end of the current
    step, ``last.ckpt`` saved, the resume command printed. (Lightning's own handling raises
    ``KeyboardInterrupt`` wherever the step is, saves nothing and exits 1.) A second Ctrl-C
    interrupts at once. :attr:`interrupted` says whether Ctrl-C, not SIGTERM, stopped the run.

    The handler is set when training starts, after Lightning has saved the process's handlers to
    put them back when the fit ends: so they come back after a fit that fails too (Lightning then
    calls ``on_exception`` and restores its saved handlers, but not the callbacks' ``teardown``)."""

    def __init__(self) -> None:
        self.interrupted = False
        self._previous: Any = None

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if threading.current_thread() is threading.main_thread():  # signals reach the main thread only
            self._previous = signal.signal(signal.SIGINT, self._stop)

    def _stop(self, signum: int, frame: FrameType | None) -> None:
        signal.signal(signal.SIGINT, self._previous)
        on_sigterm = signal.getsignal(signal.SIGTERM)  # Lightning's, set for the fit: stop after this step
        if not callable(on_sigterm):
            raise KeyboardInterrupt
        self.interrupted = True
        on_sigterm(signal.SIGTERM, frame)

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._restore()

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self._restore()

    def _restore(self) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None


class SigtermStopsEveryRank(Callback):
    """With several processes (DDP, FSDP), SIGTERM stops every rank at the end of the same step,
    which saves ``last.ckpt`` there (:class:`LastCheckpoint`) and exits 143, wherever the signal
    arrived: at rank 0 only (``docker stop``), at one rank, or at all.

    Lightning's handler broadcasts from inside the signal handler, wherever each rank is (a
    collective the other ranks never join: gloo then waits 90-150 s and more, and FSDP leaves a
    half-written checkpoint), and a rank the signal reached alone stops alone. This handler only
    notes the signal; after every step the ranks all-reduce the note (one scalar, as Lightning's
    own per-step broadcast of its flag) and all raise :class:`SIGTERMException` together. Ctrl-C
    (:class:`CtrlCStops`) calls it too. The handler is set when training starts, after Lightning
    saved the handlers it puts back when the fit ends."""

    def __init__(self) -> None:
        self.requested = False

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.world_size > 1 and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._request)

    def _request(self, signum: int, frame: FrameType | None) -> None:
        self.requested = True

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        if trainer.world_size > 1:
            stop = torch.tensor([float(self.requested)], device=pl_module.device)
            torch.distributed.all_reduce(stop, op=torch.distributed.ReduceOp.MAX)
            if stop.item():
                raise SIGTERMException


@contextlib.contextmanager
def sigterm_stops_at_once(enabled: bool = True) -> Iterator[None]:
    """SIGTERM stops the work of the block at once (:class:`SIGTERMException`), as it stops
    training, for the work after training: the test, the k-NN, the validation of the best weights.
    Lightning's own handler only raises a flag, which its evaluation loops read between batches,
    never after the last one nor during hooks (the k-NN's ``on_test_end``); each stage clears it.
    Lightning's handler, set for each stage, calls this one after its own. Not ``enabled`` (a run of
    several processes, whose ranks must stop together): the block runs as it is."""
    if not enabled or threading.current_thread() is not threading.main_thread():  # signals reach the main thread only
        yield
        return

    def stop(signum: int, frame: FrameType | None) -> None:
        raise SIGTERMException

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class RuntimeCudaCheck(Callback):
    """Asks the CUDA runtime, not NVML, whether CUDA is available, while the training steps run
    where the answer cannot spoil a fork.

    Lightning sets ``PYTORCH_NVML_BASED_CUDA_CHECK=1`` when imported, so that asking does not
    initialise CUDA in a process that later forks workers or ranks; torch's Adam and AdamW ask on
    every ``step`` (their graph-capture health check), and through NVML each answer opens
    ``libnvidia-ml`` anew: 0.1-0.2 ms a step on a CPU without it, 1-3% of a small model's step.
    Inside the fit's own process (ranks are launched before ``on_train_start``), the runtime's
    answer is safe when the run trains on a GPU (CUDA is initialised anyway) or when no GPU is
    visible (no fork could use one); the setting is restored when the run ends."""

    _VARIABLE = "PYTORCH_NVML_BASED_CUDA_CHECK"

    def __init__(self) -> None:
        self._changed = False

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if os.environ.get(self._VARIABLE) != "1":
            return
        if trainer.strategy.root_device.type == "cuda" or torch.cuda.device_count() == 0:
            os.environ[self._VARIABLE], self._changed = "0", True

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._restore()

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self._restore()  # Lightning tears callbacks down only after a fit that ended normally

    def _restore(self) -> None:
        if self._changed:
            os.environ[self._VARIABLE], self._changed = "1", False


class Throughput(Callback):
    """Training images per second over all devices, timing only the training batches (data
    loading included, validation excluded). The run's first batch is timed on its own
    (:attr:`first_step_seconds`: warm-up, and compilation under ``torch.compile``) and left out."""

    def __init__(self) -> None:
        self.images = 0
        self.seconds = 0.0
        self.first_step_seconds = 0.0
        self._tick: float | None = None

    @property
    def images_per_second(self) -> float:
        """Measured throughput (0 before any batch)."""
        return self.images / self.seconds if self.seconds > 0 else 0.0

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._tick = time.perf_counter()

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        now = time.perf_counter()
        if self._tick is not None:
            if self.first_step_seconds == 0.0:
                self.first_step_seconds = now - self._tick
            else:
                self.seconds += now - self._tick
                self.images += len(batch[1]) * trainer.world_size
        self._tick = now
