"""The contract between the training loop and a training objective.

:class:`vitkit.train.ViTModule` (the LightningModule) owns what every objective shares: the model,
the optimiser and its schedule, gradient clipping, the weight EMA, checkpoints, the stop on a
non-finite loss and the export of ``model.safetensors``. A :class:`Task` owns the objective alone:
what a training step minimises, what evaluation measures, and the parts of its own that train with
the model (MAE's decoder, DINO's projection head and teacher). Those parts are the task's children:
their parameters join the optimiser and checkpoints hold them under ``task.*``; the exported model
file holds a model only (for MAE and DINO, the encoder that fine-tuning starts from): the trained
one, or the one the task releases instead (:meth:`Task.exported_model`: DINO's teacher), and the
parts the task releases beside it (:meth:`Task.released_parts`) go to files of their own.

A task is registered under the name a recipe gives (:func:`~vitkit.tasks.register_task`) and states
what the run needs to know about it as data (its class attributes): its options
(:attr:`Task.Options`, the recipe's ``task.<name>`` section), whether it reads the labels, whether
it releases a headless encoder, the metrics it logs, monitors and summarises, and the recipe options
it refuses (:meth:`Task.check_recipe`, :meth:`Task.conflicts`). The trainer never asks for its name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import torch
from torch import nn
from torch.utils.data import Dataset

from ..models import ViTConfig
from ..schema import Config

if TYPE_CHECKING:  # the trainer loads Lightning; a task only names its callback type
    from lightning.pytorch.callbacks import Callback


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


@dataclass
class NoOptions(Config):
    """The options of a task that takes none: its recipe section ``task.<name>`` stays empty."""


@dataclass
class TaskSetup:
    """What :meth:`Task.from_recipe` builds a task from, besides its options.

    Attributes:
        model: the :class:`~vitkit.models.ViTConfig` of the model the task trains (its width, patch
            grid and prefix tokens; ``num_classes`` 0 for a task that releases an encoder).
        extra: the metadata exported with the model (``mean``, ``std``, ``class_names``, ...).
        recipe: the whole resolved recipe (:class:`vitkit.train.RecipeConfig`), for a task that reads
            other sections (classification's ``optim`` regularisers, ``distill`` and ``trainer.tta``).
        epochs: the run's planned epochs (``trainer.max_epochs``), for schedules counted in epochs.
    """

    model: ViTConfig
    extra: dict[str, Any]
    recipe: Any
    epochs: int


class Task(nn.Module):
    """One training objective for a ViT (see the module docstring for who owns what).

    Subclasses are registered with :func:`~vitkit.tasks.register_task` (which sets :attr:`name`),
    implement :meth:`training_step` and :meth:`evaluation_step`, and override the capabilities and
    hooks below that differ from the defaults (a supervised task on the model's classifier).
    """

    #: The recipe's ``task.name`` (set by :func:`~vitkit.tasks.register_task`).
    name: ClassVar[str]
    #: The options dataclass of the recipe's ``task.<name>`` section (a :class:`~vitkit.schema.Config`:
    #: its defaults and range checks are written once, there).
    Options: ClassVar[type[Config]] = NoOptions
    #: Whether the task learns from the data's labels. One that does not refuses the options only
    #: labels give meaning to (Mixup, distillation, test-time augmentation, a pretrained classifier's
    #: head, freezing).
    uses_labels: ClassVar[bool] = True
    #: Whether the model is a headless encoder (``num_classes`` 0) released for fine-tuning: the run
    #: measures its features' k-NN accuracy and prints the command that fine-tunes it.
    releases_encoder: ClassVar[bool] = False
    #: The validation metrics ``trainer.monitor`` may select ``best.ckpt`` by, each with whether it
    #: is minimised or maximised (``last``, the latest weights, is always allowed).
    monitors: ClassVar[dict[str, Literal["min", "max"]]] = {"val/loss": "min"}
    #: The metric of :attr:`monitors` that a recipe without ``trainer.monitor`` selects by (or
    #: ``last``: the latest weights).
    monitor: ClassVar[str] = "val/loss"
    #: ``summary.json``'s entries, each a logged validation or test metric (``{"test_acc": "test/acc1"}``).
    summary_metrics: ClassVar[dict[str, str]] = {}
    #: The evaluation metric shown in the progress bar (besides the loss).
    progress_metric: ClassVar[str] = "loss"
    #: The file name of the figure :meth:`figure_rows` draws after the run's test (``None``: none).
    figure: ClassVar[str | None] = None
    #: Whether ``trainer.precision: bf16-true`` can train it: its training step runs the model alone,
    #: so a bfloat16 copy of the model is all it needs (a task with layers of its own on the model's
    #: features would feed them bfloat16 features).
    pure_bf16: ClassVar[bool] = False

    # ------------------------------------------------------------------ the recipe, before building
    @classmethod
    def check_model(cls, options: Config, model: ViTConfig) -> None:
        """Refuse ``options`` the model built from the recipe cannot take (a crop not a multiple of
        its patch, parts too large), before any work starts.

        Raises:
            FieldError: keyed by the recipe key to change (``task.<name>.<option>``, ``model.<field>``).
        """

    @classmethod
    def check_recipe(cls, options: Config, recipe: Any) -> None:
        """Refuse recipe options (of :class:`vitkit.train.RecipeConfig` ``recipe``) this task cannot
        train with, beside :meth:`conflicts`' list.

        Raises:
            FieldError: keyed by the recipe key to change.
        """

    @classmethod
    def conflicts(cls, options: Config, recipe: Any) -> list[str]:
        """The options ``recipe`` sets that this task cannot take, each as ``key=value`` with why
        (``"optim.ema=true (the teacher is the average DINO keeps)"``), refused in one line together
        with the labelled options of a task that does not use labels (:attr:`uses_labels`)."""
        return []

    @classmethod
    def notes(cls, options: Config, epochs: int) -> list[str]:
        """Remarks on ``options`` for a run of ``epochs`` epochs (a schedule as long as the run),
        each printed as a ``note:`` line before training."""
        return []

    @classmethod
    def from_recipe(cls, options: Config, setup: TaskSetup) -> Task:
        """The task for a run: by default ``cls(setup.model, options)``.

        Raises:
            FieldError: options the model cannot take, keyed by the recipe key.
        """
        return cls(setup.model, options)

    @classmethod
    def step_images(cls, options: Config, batch_size: int) -> float:
        """The work of one training step of ``batch_size`` samples, in images trained by a forward
        and a backward pass (an image only forwarded counts half): a time budget
        (:mod:`vitkit.train.time_budget`) prices an evaluated image from it. By default ``batch_size``."""
        return float(batch_size)

    # ------------------------------------------------------------------------------- the hooks
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

    def split_data(self, dataset: Dataset, split: Literal["train", "val", "test"]) -> Dataset:
        """The data section's ``split`` as this task reads it: by default as built, ``(image [C, H,
        W], label)`` pairs. A task wraps it to read other views (DINO: each training image as its
        multi-crop views) or other targets (a dense task: per-patch classes computed from the image)."""
        return dataset

    def summary(self, metric: Callable[[str], float | None]) -> dict[str, Any]:
        """``summary.json``'s entries of this task: each of :attr:`summary_metrics` as ``metric``
        reads it (the logged value, ``None`` where that loop did not run)."""
        return {key: metric(name) for key, name in self.summary_metrics.items()}

    def callbacks(self) -> list[Callback]:
        """Lightning callbacks the run adds for this task (none by default)."""
        return []

    def figure_rows(self, model: nn.Module, images: torch.Tensor) -> dict[str, torch.Tensor]:
        """The rows of :attr:`figure`, as ``[B, C, H, W]`` images by row name, for test ``images``
        ``[B, C, H, W]`` and the evaluated ``model``."""
        raise NotImplementedError

    def exported_model(self, model: nn.Module) -> nn.Module:
        """The encoder to release in ``model.safetensors``, given the evaluated ``model`` (the EMA
        copy when enabled): by default ``model`` itself; DINO's teacher backbone."""
        return model

    def released_parts(self) -> dict[str, nn.Module]:
        """The task's own trained parts released beside the model, each written to
        ``<name>.safetensors`` in the run directory (a dense task's head; none by default)."""
        return {}
