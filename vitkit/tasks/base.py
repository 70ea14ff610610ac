"""The contract between the training loop and a training objective.

:class:`vitkit.train.ViTModule` (the LightningModule) owns what every objective shares: the model,
the optimiser and its schedule, gradient clipping, the weight EMA, checkpoints, the stop on a
non-finite loss and the export of ``model.safetensors``. A :class:`Task` owns the objective alone:
what a training step minimises, what evaluation measures, and the parts of its own that train with
the model (MAE's decoder, DINO's projection head and teacher). Those parts are the task's children:
their parameters join the optimiser and checkpoints hold them under ``task.*``, but the exported
model file holds a model only (for MAE and DINO, the encoder that fine-tuning starts from): the
trained one, or the one the task releases instead (:meth:`Task.exported_model`: DINO's teacher).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import nn
from torch.utils.data import Dataset


@dataclass
class StepOutput:
    """What a task returns for one batch.

    Attributes:
        loss: the scalar to minimise (training) or the batch's loss (evaluation).
        metrics: other scalars to log, by name without the stage (``"acc1"``, ``"knn_acc1"``). A
            training step's metric may be a function of no arguments that computes it: the
            training loop calls it only on the steps it logs (``trainer.log_every``), so the
            other steps do not pay for it.
        batch_size: images in the batch (the weight of its metrics in the epoch's mean).
    """

    loss: torch.Tensor
    batch_size: int
    metrics: dict[str, torch.Tensor | Callable[[], torch.Tensor]] = field(default_factory=dict)


class Task(nn.Module):
    """One training objective for a ViT (see the module docstring for who owns what).

    Subclasses set :attr:`name` (the recipe's ``task.name``) and :attr:`progress_metric`, and
    implement :meth:`training_step` and :meth:`evaluation_step`; the hooks have defaults.
    """

    #: The recipe's ``task.name``.
    name: ClassVar[str]
    #: The evaluation metric shown in the progress bar (besides the loss).
    progress_metric: ClassVar[str] = "loss"

    def prepare(self, model: nn.Module) -> None:
        """Called once with the model before training (e.g. switch on a distillation head). A task
        never keeps the model as a child (its parameters would be optimised twice)."""

    def on_fit_start(self, device: torch.device) -> None:
        """Called when fitting starts, with the training device (move what is not a child there)."""

    def training_step(self, model: nn.Module, batch: Any) -> StepOutput:
        """The loss of one training batch, computed with ``model`` (in training mode)."""
        raise NotImplementedError

    def evaluation_step(self, model: nn.Module, batch: Any, stage: str) -> StepOutput:
        """Loss and metrics of one ``"val"`` or ``"test"`` batch, computed with ``model`` (the
        weights to evaluate: the EMA copy when enabled), in evaluation mode and without gradients."""
        raise NotImplementedError

    def after_optimizer_step(self, model: nn.Module, step: int, total_steps: int) -> None:
        """Called after each optimiser step (DINO's teacher follows the student here)."""

    def set_epochs(self, epochs: int) -> None:
        """Called when the run's length is set after training started (a time budget's plan, as
        many epochs as the time allows): schedules counted in the run's epochs follow it."""

    def training_data(self, dataset: Dataset) -> Dataset:
        """The training split as this task reads it (DINO: each image as its multi-crop views);
        by default the split as the data section builds it."""
        return dataset

    def exported_model(self, model: nn.Module) -> nn.Module:
        """The encoder to release in ``model.safetensors``, given the evaluated ``model`` (the EMA
        copy when enabled): by default ``model`` itself; DINO's teacher backbone."""
        return model
