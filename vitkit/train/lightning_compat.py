"""Every use vitkit makes of Lightning's private internals, in one place.

Lightning has no public hook for these, and its internals change between minor releases, so each
one is named here once and checked against the installed Lightning by
``tests/train/test_lightning_compat.py``, which fails, naming this module, when the installed
version is outside :data:`CHECKED_RANGE`. To support another Lightning, check each function here
against its source, then widen the range (and ``pyproject.toml``'s pin with it).

- the attribute Lightning sets on a module around every hook call (:data:`HOOK_NAME_ATTRIBUTE`);
- the trainer a module is attached to, or none (:func:`attached_trainer`);
- whether the loggers write this training step (:func:`loggers_write_this_step`) and how many
  batches of the epoch have started (:func:`batches_started`);
- the fit loop's epoch limit, changed during a run (:func:`set_max_epochs`);
- the mesh sizes ``ModelParallelStrategy`` reads in ``setup_environment`` (:func:`set_parallel_sizes`);
- the hook dispatchers of ``lightning/pytorch/trainer/call.py`` (:func:`call_callback_hooks`,
  :func:`call_module_hook`);
- where a checkpoint keeps the optimiser steps each optimisation loop took
  (:data:`AUTOMATIC_STEPS`, :data:`MANUAL_STEPS`, :func:`fit_loop_state`).
"""

from __future__ import annotations

from typing import Any

import lightning as L
from lightning.pytorch.strategies import ModelParallelStrategy
from lightning.pytorch.trainer import call

#: The Lightning releases every function here was checked against: ``(lowest, first not checked)``.
CHECKED_RANGE = ("2.6", "2.7")

#: The module attribute Lightning sets to a hook's name (or ``None``) before and after each hook call.
HOOK_NAME_ATTRIBUTE = "_current_fx_name"

#: In a checkpoint's fit-loop state (:func:`fit_loop_state`): the step-progress record of the
#: automatic optimisation loop (under its ``"optimizer"`` entry, ``"step"``), and of the manual one.
AUTOMATIC_STEPS = "epoch_loop.automatic_optimization.optim_progress"
MANUAL_STEPS = "epoch_loop.manual_optimization.optim_step_progress"


def attached_trainer(module: L.LightningModule) -> L.Trainer | None:
    """The trainer running ``module``, or ``None`` outside one (where ``module.trainer`` raises)."""
    return module._trainer


def loggers_write_this_step(trainer: L.Trainer) -> bool:
    """Whether the loggers write the metrics of the training step under way: Lightning's own rule
    (every ``log_every_n_steps`` optimiser steps, and the step on which the run stops)."""
    return trainer._logger_connector.should_update_logs


def batches_started(trainer: L.Trainer) -> int:
    """How many training batches of the current epoch have started (the one under way included)."""
    return trainer.fit_loop.epoch_loop.batch_progress.current.ready


def set_max_epochs(trainer: L.Trainer, epochs: int) -> None:
    """Make the running fit stop after ``epochs`` epochs (``Trainer(max_epochs=)`` once it has started)."""
    trainer.fit_loop.max_epochs = epochs


def set_parallel_sizes(strategy: ModelParallelStrategy, *, data_parallel: int, tensor_parallel: int) -> None:
    """The device mesh ``strategy`` builds in its ``setup_environment``: ``data_parallel`` x
    ``tensor_parallel`` processes (its ``"auto"`` sizes otherwise guess them from the nodes)."""
    strategy._data_parallel_size = data_parallel
    strategy._tensor_parallel_size = tensor_parallel


def call_callback_hooks(trainer: Any, hook: str, *args: Any) -> None:
    """Lightning's dispatch of ``hook`` to every callback of ``trainer``."""
    call._call_callback_hooks(trainer, hook, *args)


def call_module_hook(trainer: Any, hook: str, *args: Any, pl_module: Any) -> None:
    """Lightning's dispatch of ``hook`` to the module ``pl_module``."""
    call._call_lightning_module_hook(trainer, hook, *args, pl_module=pl_module)


def fit_loop_state(checkpoint: dict[str, Any]) -> dict[str, Any] | None:
    """A checkpoint's fit-loop state (``checkpoint["loops"]["fit_loop"]``), or ``None`` where it has none."""
    loops = checkpoint.get("loops")
    fit = loops.get("fit_loop") if isinstance(loops, dict) else None
    return fit if isinstance(fit, dict) else None
