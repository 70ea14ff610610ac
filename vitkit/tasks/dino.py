"""Self-distillation with no labels (``task.name: dino``; Caron et al. 2021, https://arxiv.org/abs/2104.14294).

A student (the model being trained, with a :class:`DinoHead`) learns to match a teacher (an
exponential moving average of the student's backbone and head, a part of this task) across views
of one image: the teacher sees the two global crops, the student every crop (:mod:`vitkit.data.multicrop`),
and each (teacher global crop, student crop) pair of different views adds a cross-entropy term
between the teacher's centred, sharpened softmax and the student's. The teacher gets no gradient;
after each optimiser step its weights move towards the student's with a momentum raised from
``teacher_momentum`` (0.996) to 1 on a cosine over the run's steps. Centring (an EMA of the
teacher's mean output, momentum 0.9) and sharpening (teacher temperature 0.04, warmed up to up to
0.07 over the first epochs; student 0.1) keep the outputs from collapsing.

:class:`DinoHead`, :func:`dino_loss`, :func:`updated_center`, :func:`teacher_momentum` and
:func:`teacher_temperature` follow facebookresearch/dino's ``DINOHead`` (``vision_transformer.py``),
``DINOLoss`` (``main_dino.py``) and ``utils.cosine_scheduler``. DINO evaluates and releases the
teacher's backbone (:meth:`DinoTask.exported_model`); its self-attention maps segment objects
(the paper's Figure 1, ``vitkit maps``).
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Iterator
from typing import Any, ClassVar, Literal

import torch
import torch.nn.functional as F
from timm.layers import trunc_normal_
from torch import nn
from torch.nn.utils.parametrizations import weight_norm
from torch.utils.data import Dataset

from ..collective import all_reduce
from ..data.multicrop import MultiCrop, multi_crop_dataset
from ..models import ViTConfig
from ..schema import Config, FieldError
from .base import StepOutput, Task, TaskSetup
from .dino_options import DinoOptions
from .registry import register_task

#: A training batch: ``([global, global, local, ...] crops [B, C, s, s], labels)``; the labels are unused.
Batch = tuple[list[torch.Tensor], Any]


class DinoHead(nn.Module):
    """DINO's projection head: an MLP of ``layers`` linear layers (GELU between them) down to a
    ``bottleneck_dim`` bottleneck, L2-normalised, then a weight-normalised linear layer without
    bias to ``out_dim`` logits, its norms fixed at 1 with ``norm_last_layer`` (DINO's default).

    Args:
        in_dim: width of the backbone's pooled feature.
        out_dim: the output dimension ``K`` (the paper's 65536; smaller for small data).
        hidden_dim, bottleneck_dim, layers: the MLP's widths and depth (DINO's 2048, 256, 3).
        norm_last_layer: fix the last layer's weight norms (``weight_g``) at 1.
    """

    def __init__(
        self, in_dim: int, out_dim: int, *, hidden_dim: int = 2048, bottleneck_dim: int = 256, layers: int = 3,
        norm_last_layer: bool = True,
    ) -> None:
        super().__init__()
        widths = [in_dim, *[hidden_dim] * (max(layers, 1) - 1), bottleneck_dim]
        parts: list[nn.Module] = []
        for index, (width_in, width_out) in enumerate(zip(widths[:-1], widths[1:])):
            parts += [nn.Linear(width_in, width_out)] + ([nn.GELU()] if index < len(widths) - 2 else [])
        self.mlp = nn.Sequential(*parts)
        self.last_layer = weight_norm(nn.Linear(bottleneck_dim, out_dim, bias=False))
        self.norm_last_layer = norm_last_layer
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """DINO's init: truncated normal (std 0.02) weights, zero biases, weight norms 1."""
        for layer in self.mlp:
            if isinstance(layer, nn.Linear):
                trunc_normal_(layer.weight, std=0.02)
                nn.init.zeros_(layer.bias)
        weight = self.last_layer.parametrizations.weight
        with torch.no_grad():
            direction = torch.empty_like(weight.original1)
            nn.init.kaiming_uniform_(direction, a=math.sqrt(5))  # nn.Linear's own init
            weight.original1.copy_(direction)
            weight.original0.fill_(1.0)
        weight.original0.requires_grad_(not self.norm_last_layer)

    def forward(self, features: torch.Tensor, freeze_last_layer: bool = False) -> torch.Tensor:
        """``[N, in_dim]`` to ``[N, out_dim]``; ``freeze_last_layer``: the last layer gets no
        gradient (DINO's ``cancel_gradients_last_layer`` in the first epochs)."""
        x = F.normalize(self.mlp(features), dim=-1, p=2)
        weight = self.last_layer.weight
        return F.linear(x, weight.detach() if freeze_last_layer else weight)


def dino_loss(
    student: torch.Tensor, teacher: torch.Tensor, center: torch.Tensor, student_temp: float, teacher_temp: float
) -> torch.Tensor:
    """DINO's loss: the mean over every (teacher global crop ``i``, student crop ``v != i``) pair of
    the cross-entropy ``-sum softmax((t_i - center) / teacher_temp) * log_softmax(s_v / student_temp)``,
    each averaged over the batch.

    Args:
        student: ``[V * B, K]`` the student's outputs, crop-major (crop 0's ``B`` rows first);
            the first two crops are the global ones.
        teacher: ``[2 * B, K]`` the teacher's outputs on the two global crops, in the same order.
        center: ``[1, K]`` the running centre of the teacher's outputs.
    """
    teacher_probs = F.softmax((teacher - center) / teacher_temp, dim=-1).detach().chunk(2)
    student_logp = F.log_softmax(student / student_temp, dim=-1).chunk(len(student) // len(teacher_probs[0]))
    terms = [
        torch.sum(-probs * student_logp[view], dim=-1).mean()
        for index, probs in enumerate(teacher_probs)
        for view in range(len(student_logp))
        if view != index
    ]
    return torch.stack(terms).mean()


@torch.no_grad()
def updated_center(center: torch.Tensor, teacher: torch.Tensor, momentum: float) -> torch.Tensor:
    """The centre after one batch: ``center * momentum + mean(teacher) * (1 - momentum)``, the mean
    over every process's ``[N, K]`` teacher outputs (DINO's ``update_center``)."""
    batch_sum = teacher.sum(dim=0, keepdim=True)
    count = torch.tensor(float(len(teacher)), device=teacher.device)
    all_reduce(batch_sum)
    all_reduce(count)
    return center * momentum + batch_sum / count * (1 - momentum)


def teacher_momentum(step: int, total_steps: int, base: float) -> float:
    """The teacher's EMA momentum after step ``step`` (0-based) of ``total_steps``: ``base`` raised
    to 1 on a half cosine, ``1 - (1 - base) (1 + cos(pi step / total)) / 2`` (DINO's ``cosine_scheduler``)."""
    return 1.0 - (1.0 - base) * (1.0 + math.cos(math.pi * step / max(1, total_steps))) / 2.0


def teacher_temperature(epoch: int, warmup_temp: float, temp: float, warmup_epochs: int) -> float:
    """The teacher's temperature in ``epoch`` (0-based): DINO's ``np.linspace(warmup_temp, temp,
    warmup_epochs)`` over the first ``warmup_epochs`` epochs, then ``temp``."""
    if epoch >= warmup_epochs:
        return temp
    if warmup_epochs == 1:
        return warmup_temp
    return warmup_temp + (temp - warmup_temp) * epoch / (warmup_epochs - 1)


@torch.no_grad()
def ema_update(teacher: nn.Module, student: nn.Module, momentum: float) -> None:
    """``teacher = momentum * teacher + (1 - momentum) * student``, parameter by parameter
    (DINO's update); buffers (a convolutional stem's BatchNorm statistics) are copied from the
    student, as timm's ``ModelEmaV3`` does, since the teacher runs in evaluation mode."""
    teacher_params, student_params = list(teacher.parameters()), list(student.parameters())
    if len(teacher_params) != len(student_params):
        raise RuntimeError("the teacher and the student have different parameters.")
    torch._foreach_lerp_(teacher_params, [p.detach().to(t.dtype) for p, t in zip(student_params, teacher_params)],
                         1.0 - momentum)
    for mine, theirs in zip(teacher.buffers(), student.buffers()):
        mine.copy_(theirs)


@register_task("dino")
class DinoTask(Task):
    """DINO on multi-crop batches (see the module docstring).

    Args:
        embed_dim: width of the model's pooled feature (``ViTConfig.embed_dim``).
        crops: the multi-crop augmentation of the training images (:class:`~vitkit.data.multicrop.MultiCrop`).
        epochs: the run's epochs (the teacher temperature's warm-up and the frozen last layer count them).
        options: the head's size, the temperatures and momenta (:class:`~vitkit.tasks.dino_options.DinoOptions`;
            its crop options shape ``crops``, which :meth:`from_recipe` builds from them).
    """

    Options: ClassVar[type[Config]] = DinoOptions
    uses_labels: ClassVar[bool] = False
    releases_encoder: ClassVar[bool] = True
    #: DINO releases the teacher at the end of its schedules (momentum near 1, the decay at its end),
    #: as the paper does; its validation loss compares a moving teacher with a moving centre.
    monitor: ClassVar[str] = "last"

    def __init__(self, embed_dim: int, crops: MultiCrop, *, epochs: int, options: DinoOptions | None = None) -> None:
        super().__init__()
        options = options if options is not None else DinoOptions()
        self.crops = crops
        self.epochs = epochs
        self.student_head = DinoHead(embed_dim, options.out_dim, hidden_dim=options.hidden_dim,
                                     bottleneck_dim=options.bottleneck_dim, layers=options.head_layers,
                                     norm_last_layer=options.norm_last_layer)
        self.teacher_head = copy.deepcopy(self.student_head).requires_grad_(False)
        self.teacher_backbone: nn.Module | None = None  # the student's copy (prepare)
        self.momentum = options.teacher_momentum
        self.student_temp, self.teacher_temp = options.student_temp, options.teacher_temp
        self.warmup_teacher_temp = options.warmup_teacher_temp
        self.warmup_teacher_temp_epochs = options.warmup_teacher_temp_epochs
        self.center_momentum = options.center_momentum
        self.freeze_last_layer_epochs = options.freeze_last_layer_epochs
        self.register_buffer("center", torch.zeros(1, options.out_dim))
        # The run's progress, checkpointed, so a resumed run continues the schedules where they were.
        self.register_buffer("epoch_progress", torch.zeros(()))

    # ------------------------------------------------------------------------------ the recipe
    @classmethod
    def check_model(cls, options: DinoOptions, model: ViTConfig) -> None:
        options.check_model(model)

    @classmethod
    def conflicts(cls, options: DinoOptions, recipe: Any) -> list[str]:
        """Besides the labelled options: those DINO's teacher makes pointless or impossible."""
        found = ["optim.ema=true (the teacher is the average DINO keeps and releases)"] if recipe.optim.ema else []
        found += [f"model.impl={recipe.model.impl} (DINO trains vitkit's model)"] if recipe.model.impl != "vitkit" else []
        found += ["trainer.strategy=fsdp (the teacher is not sharded)"] if recipe.trainer.strategy.startswith("fsdp") else []
        return found

    @classmethod
    def check_recipe(cls, options: DinoOptions, recipe: Any) -> None:
        """DINO's own crops augment the training images: ``data.augment`` stays off.

        Raises:
            FieldError: ``data.augment.enabled`` is true.
        """
        if recipe.data.augment.enabled:
            raise FieldError(
                "data.augment.enabled", "is true, but DINO trains on its own multi-crop views, never on data.augment's: "
                "set data.augment.enabled=false, and shape the views with task.dino's local_crops, global_size, "
                "local_size, global_scale and local_scale."
            )

    @classmethod
    def notes(cls, options: DinoOptions, epochs: int) -> list[str]:
        return options.schedule_notes(epochs)

    @classmethod
    def from_recipe(cls, options: DinoOptions, setup: TaskSetup) -> DinoTask:
        """The task for a model of ``setup.model``, its crops normalised as the data (``setup.extra``'s
        mean and std).

        Raises:
            FieldError: a crop size the model cannot take.
        """
        options.check_model(setup.model)
        crops = MultiCrop(setup.extra["mean"], setup.extra["std"], global_size=options.crop_sizes(setup.model)["global_size"],
                          local_size=options.local_size, local_crops=options.local_crops,
                          global_scale=options.global_scale, local_scale=options.local_scale)
        return cls(setup.model.embed_dim, crops, epochs=setup.epochs, options=options)

    # ----------------------------------------------------------------------- the Task contract
    def prepare(self, model: nn.Module) -> None:
        """The teacher starts as a copy of the student's backbone (DINO loads the same weights)."""
        self.teacher_backbone = copy.deepcopy(model).requires_grad_(False)

    def set_epochs(self, epochs: int) -> None:
        """The run's epochs, which turn the step count into the epoch under way."""
        self.epochs = epochs

    def split_data(self, dataset: Dataset, split: Literal["train", "val", "test"]) -> Dataset:
        """Each training image as its multi-crop views; validation and test as built."""
        return multi_crop_dataset(dataset, self.crops) if split == "train" else dataset

    def exported_model(self, model: nn.Module) -> nn.Module:
        """The teacher's backbone: what DINO evaluates and releases."""
        return self.teacher_backbone

    @property
    def epoch(self) -> int:
        """The epoch under way (0-based)."""
        return int(self.epoch_progress.item())

    @property
    def current_teacher_temp(self) -> float:
        return teacher_temperature(self.epoch, self.warmup_teacher_temp, self.teacher_temp, self.warmup_teacher_temp_epochs)

    def training_step(self, model: nn.Module, batch: Batch) -> StepOutput:
        crops, _ = batch
        student = self.student_outputs(model, crops, freeze_last_layer=self.epoch < self.freeze_last_layer_epochs)
        with torch.no_grad():
            teacher = self.teacher_outputs(crops[:2])
        temp = self.current_teacher_temp
        loss = dino_loss(student, teacher, self.center, self.student_temp, temp)
        metrics = {"teacher_temp": torch.tensor(temp), "teacher_entropy": _entropy(teacher, self.center, temp)}
        self.center.copy_(updated_center(self.center, teacher.float(), self.center_momentum))
        return StepOutput(loss, len(crops[0]), metrics)

    @torch.no_grad()
    def evaluation_step(self, model: nn.Module, batch: tuple[torch.Tensor, Any], stage: str) -> StepOutput:
        """DINO's loss with each image and its mirror as the two global views (no local crops; the
        centre is not updated), between the evaluated ``model`` and the teacher."""
        images, _ = batch
        views = [images, images.flip(-1)]
        student = self.student_outputs(model, views)
        teacher = self.teacher_outputs(views)
        loss = dino_loss(student, teacher, self.center, self.student_temp, self.current_teacher_temp)
        return StepOutput(loss, len(images))

    @torch.no_grad()
    def after_optimizer_step(self, model: nn.Module, step: int, total_steps: int) -> None:
        """The teacher follows the student with the momentum of the step just taken (``step`` is
        the count of steps done), and the run's progress moves on."""
        momentum = teacher_momentum(step - 1, total_steps, self.momentum)
        ema_update(self.teacher_backbone, model, momentum)
        ema_update(self.teacher_head, self.student_head, momentum)
        self.epoch_progress.fill_(step * self.epochs / max(1, total_steps))

    # ----------------------------------------------------------------------------- forwards
    def student_outputs(self, model: nn.Module, crops: list[torch.Tensor], freeze_last_layer: bool = False) -> torch.Tensor:
        """``[V * B, K]`` the student's head on ``model``'s pooled features of every crop, crop-major
        (crops of one size go through the backbone together, as DINO's ``MultiCropWrapper``)."""
        return self.student_head(_pooled(model, crops), freeze_last_layer=freeze_last_layer)

    def teacher_outputs(self, crops: list[torch.Tensor]) -> torch.Tensor:
        """``[2 * B, K]`` the teacher's outputs on the global crops, in evaluation mode (no dropout
        or stochastic depth, as DINO builds its teacher)."""
        with _evaluating(self.teacher_backbone, self.teacher_head):
            return self.teacher_head(_pooled(self.teacher_backbone, crops))


def _pooled(model: nn.Module, crops: list[torch.Tensor]) -> torch.Tensor:
    """``[V * B, D]`` pooled features of each crop in order, one backbone pass per run of crops of one size."""
    features, start = [], 0
    while start < len(crops):
        end = start
        while end < len(crops) and crops[end].shape[-2:] == crops[start].shape[-2:]:
            end += 1
        images = torch.cat(crops[start:end])
        features.append(model.forward_head(model.forward_features(images), pre_logits=True))
        start = end
    return torch.cat(features)


@contextlib.contextmanager
def _evaluating(*modules: nn.Module) -> Iterator[None]:
    """``modules`` in evaluation mode for the block, then back in the mode they were in."""
    modes = [module.training for module in modules]
    for module in modules:
        module.eval()
    try:
        yield
    finally:
        for module, mode in zip(modules, modes):
            module.train(mode)


def _entropy(teacher: torch.Tensor, center: torch.Tensor, temp: float) -> torch.Tensor:
    """Mean entropy of the teacher's centred, sharpened distribution (near 0: collapse onto one
    dimension; near ``log K``: onto the uniform one)."""
    probs = F.softmax((teacher.float() - center) / temp, dim=-1)
    return -(probs * probs.clamp_min(1e-12).log()).sum(dim=-1).mean()
