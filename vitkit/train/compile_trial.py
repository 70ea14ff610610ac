"""``trainer.compile: auto``: keep ``torch.compile`` only where it makes the run's own steps faster.

Whether Inductor's graph beats eager PyTorch depends on the machine, not on the model alone: on a
2-core AMD EPYC (AVX512-BF16) the compiled ViT-S/4 bf16 training step ran 1.10x faster, on an Intel
Xeon with AMX the same step 1.85x slower. So, as the attention kernel is chosen
(:mod:`vitkit.train.kernel_trial`), :class:`CompileChooser` times whole training steps of the
compiled and the eager model in A/B pairs on the run's own batches and keeps the faster, once the
attention kernel of the step's key has been chosen (the kernel trial is paused meanwhile, so its
drift watch does not read the trial's steps). The compiled model must be
:data:`COMPILE_MARGIN` faster: ties stay eager, which has no recompilation to fear.

``trainer.compile: true`` goes the same way without the pairs (``always``): the model is compiled
once the kernel is chosen and kept compiled. Compiling from the first step instead would compile a
graph for each kernel the kernel trial times (two training graphs, twice the compilation; the
likely reason, not confirmed on a GPU, why a compiled run on one sat at step 7 after 70 s).

The model is compiled in place (``nn.Module.compile``: parameter names, and so checkpoints, stay
as they are) and switched per step by setting its compiled call aside and back. Validation, test
and prediction run it eager: the compiled graph is the training step's. Compiling evaluation too
would cost up to three more compilations in a run (no-grad mode and inference mode are guards of
the graph, and a split's last, smaller batch may ask for a dynamic batch size; the tiny test recipe
showed two): on a CPU 2-3 s each for a 2-block model, on a GPU the likely cause of the stall a compiled run showed at its
first validation. The first
compiled step pays the compilation (untimed, reported as ``compile_s``). Under DDP rank 0's
timings decide (a broadcast), so every rank makes the same choice at the same step.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info
from torch import nn

from ..schema import RecipeError
from .kernel_trial import MIN_PAIRS, Round, TrainingKernelChooser, step_key, training_device, wait_for_device

OPTIONS = ("eager", "compiled")
#: The compiled step must be this much faster (median balanced eager / compiled ratio) to be kept.
COMPILE_MARGIN = 0.05


class CompileChooser(Callback):
    """Chooses between the compiled and the eager model on the run's training steps (see the
    module docstring).

    Args:
        kernels: the run's attention-kernel chooser: the trial waits for its choice and pauses it.
        clock: seconds as a float (default ``time.perf_counter``; tests inject a fake clock).
        compile_model: compiles a model in place (default ``nn.Module.compile``; tests inject a
            cheap stand-in).
        always: keep the compiled model without timing it (``trainer.compile: true``).
    """

    def __init__(
        self, kernels: TrainingKernelChooser, clock: Callable[[], float] | None = None,
        compile_model: Callable[[nn.Module], None] | None = None, always: bool = False,
    ) -> None:
        self.kernels = kernels
        self.always = always
        self.clock = clock if clock is not None else time.perf_counter
        self.compile_model = compile_model if compile_model is not None else nn.Module.compile
        self.model: nn.Module | None = None
        self.compiled_call: Callable[..., Any] | None = None
        self.round: Round | None = None
        self.compile_s: float | None = None
        self.choice: str | None = None
        self.reason: str | None = None  # why the choice was made without a trial
        self._pending: dict[str, float] = {}
        self._step: tuple[str, float] | None = None

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit" or self.model is not None or self.choice is not None:
            return
        if self.compile_model is nn.Module.compile and training_device(pl_module).type == "cpu" and not has_cxx_compiler():
            if self.always:
                raise RecipeError("trainer.compile=true on the CPU needs a C++ compiler for Inductor (g++ or clang++, "
                                  "or $CXX); install one, or set trainer.compile=auto (eager without one) or false.")
            self.choice, self.reason = "eager", "no C++ compiler for Inductor on the CPU"
            rank_zero_info(f"note: trainer.compile=auto trains eager: {self.reason} (install g++ to let it measure).")
            return
        self.model = pl_module.step_model  # the bfloat16 copy under trainer.precision=bf16-true
        self.compile_model(self.model)
        self.compiled_call = self.model._compiled_call_impl
        self._use("eager")

    def _use(self, option: str) -> None:
        """Run the model compiled or eager from the next call on."""
        assert self.model is not None
        self.model._compiled_call_impl = self.compiled_call if option == "compiled" else None

    def _next_option(self) -> str:
        """The option of the next trial step: compiled first (its compilation, untimed), then the
        pairs, eager first in even pairs and compiled first in odd ones."""
        assert self.round is not None
        if self.compile_s is None:
            return "compiled"
        order = OPTIONS if len(self.round.pairs) % 2 == 0 else OPTIONS[::-1]
        return next(option for option in order if option not in self._pending)

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int) -> None:
        if self.choice is not None or self.model is None or not self.kernels.settled(step_key(batch)):
            return
        if self.round is None:
            self.round = Round(trainer.global_step, "attention kernel chosen", options=OPTIONS, margin=COMPILE_MARGIN)
            self.kernels.paused = not self.always
        option = self._next_option()
        self._use(option)
        wait_for_device(pl_module)
        self._step = (option, self.clock())

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self._step is None:
            return
        option, started = self._step
        self._step = None
        wait_for_device(pl_module)
        seconds = self.clock() - started
        if self.compile_s is None:
            self.compile_s = seconds
            if self.always:
                self.choice = "compiled"
            return
        self._pending[option] = seconds
        if len(self._pending) < len(OPTIONS):
            return
        assert self.round is not None
        self.round.pairs.append(self._pending)
        self._pending = {}
        if len(self.round.pairs) < MIN_PAIRS:
            return
        self.round.pairs = trainer.strategy.broadcast(self.round.pairs, src=0)
        self.round.decide()
        self.choice = self.round.kernel
        self._use(self.choice)
        if self.choice == "eager":
            self.compiled_call = None  # the compiled graphs are not needed any more
        self.kernels.paused = False

    def _evaluate_eager(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.model is not None:
            self._use("eager")

    def _train_as_chosen(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Back to the training state: the choice, or eager until it is made (a trial step sets
        its own option)."""
        if self.model is not None:
            self._use(self.choice or "eager")

    on_validation_start = on_test_start = on_predict_start = _evaluate_eager
    on_validation_end = on_test_end = on_predict_end = _train_as_chosen

    def report(self) -> dict[str, Any]:
        """``choice`` (``None``: the run ended before the trial did, or before the kernel was
        chosen), the compiled step that paid the compilation (``compile_s``) and the trial's pairs
        (``round``; none with ``always``)."""
        return {"choice": self.choice, "compile_s": None if self.compile_s is None else round(self.compile_s, 3),
                "round": None if self.round is None else self.round.to_json(),
                **({"reason": self.reason} if self.reason else {})}


def has_cxx_compiler() -> bool:
    """Whether Inductor's CPU backend finds a C++ compiler (``$CXX``, or one on the ``PATH``)."""
    return any(shutil.which(name) for name in (os.environ.get("CXX", ""), "g++", "c++", "clang++") if name)

