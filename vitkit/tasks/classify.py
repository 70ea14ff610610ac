"""Image classification (``task.name: classify``): cross-entropy on labels, with timm's Mixup /
CutMix and label smoothing, DeiT's distillation from a frozen teacher (Touvron et al. 2020,
https://arxiv.org/abs/2012.12877), and top-1/top-5 accuracy under test-time augmentation.

:class:`DistillationLoss` is DeiT's ``losses.py`` (facebookresearch/deit): the student's class
logits learn the labels, its distillation logits (the distillation token's head, or the class
logits again for a model without one, as DeiT does) learn the teacher:

- ``hard``: ``(1 - alpha) CE(cls, y) + alpha CE(dist, argmax teacher)`` (``alpha`` 0.5: the paper's
  ``1/2 CE(y) + 1/2 CE(y_t)``);
- ``soft``: ``(1 - alpha) CE(cls, y) + alpha tau^2 KL(p_t || p_s)`` with ``p = softmax(logits / tau)``,
  DeiT's ``kl_div(log p_s, log p_t, reduction='sum', log_target=True) / numel``: summed over the
  batch and the classes and divided by ``B x C`` (PyTorch's legacy mean, which DeiT keeps; see
  facebookresearch/deit issue 61), i.e. the per-image KL divided by the number of classes too.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any, ClassVar, Literal

import torch
import torch.nn.functional as F
from timm.data import Mixup
from timm.loss import SoftTargetCrossEntropy
from timm.utils import accuracy
from torch import nn

from ..evaluation import TestTimeAugmentation, average_views, batch_metrics, black_level, predict_views
from ..schema import Config
from .base import StepOutput, Task, TaskSetup
from .registry import register_task

Batch = tuple[torch.Tensor, torch.Tensor]


class DistillationLoss(nn.Module):
    """DeiT's distillation loss (see the module docstring for the formulas).

    Args:
        base_criterion: the label loss on the class logits (cross-entropy, label smoothing, or
            soft-target cross-entropy after Mixup).
        kind: ``'hard'`` or ``'soft'``.
        alpha: weight of the distillation term, in ``[0, 1]``.
        tau: softmax temperature of ``soft`` distillation.
    """

    def __init__(self, base_criterion: nn.Module, kind: str, alpha: float, tau: float) -> None:
        super().__init__()
        if kind not in ("hard", "soft"):
            raise ValueError(f"distillation type must be 'hard' or 'soft', got {kind!r}.")
        self.base_criterion = base_criterion
        self.kind = kind
        self.alpha = alpha
        self.tau = tau

    def forward(
        self, class_logits: torch.Tensor, dist_logits: torch.Tensor, targets: torch.Tensor, teacher_logits: torch.Tensor
    ) -> torch.Tensor:
        """Scalar loss from the student's ``[B, C]`` class and distillation logits, the targets
        (labels ``[B]`` or soft ``[B, C]``) and the teacher's ``[B, C]`` logits."""
        base = self.base_criterion(class_logits, targets)
        teacher_logits = teacher_logits.detach().to(dist_logits.dtype)
        if self.kind == "hard":
            distill = F.cross_entropy(dist_logits, teacher_logits.argmax(dim=1))
        else:
            tau = self.tau
            distill = F.kl_div(
                F.log_softmax(dist_logits / tau, dim=1),
                F.log_softmax(teacher_logits / tau, dim=1),
                reduction="sum",
                log_target=True,
            ) * (tau * tau) / dist_logits.numel()
        return base * (1 - self.alpha) + distill * self.alpha


def _top1(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Top-1 accuracy in percent of ``[B, K]`` logits against ``[B]`` labels (timm's ``accuracy``)."""
    return accuracy(logits, targets)[0]


def build_criterion(
    num_classes: int,
    *,
    mixup: float = 0.0,
    cutmix: float = 0.0,
    mixup_prob: float = 1.0,
    mixup_switch_prob: float = 0.5,
    label_smoothing: float = 0.0,
) -> tuple[Mixup | None, nn.Module]:
    """The batch mixer (``None`` without Mixup/CutMix) and the training loss: soft-target
    cross-entropy after mixing (targets already smoothed), label-smoothing or plain cross-entropy."""
    if (mixup > 0 or cutmix > 0) and mixup_prob > 0:
        mixer = Mixup(
            mixup_alpha=mixup,
            cutmix_alpha=cutmix,
            prob=mixup_prob,
            switch_prob=mixup_switch_prob,
            label_smoothing=label_smoothing,
            num_classes=num_classes,
        )
        return mixer, SoftTargetCrossEntropy()
    if label_smoothing > 0:
        return None, nn.CrossEntropyLoss(label_smoothing=label_smoothing)
    return None, nn.CrossEntropyLoss()


@register_task("classify")
class ClassifyTask(Task):
    """Supervised classification on ``(images [B, C, H, W], labels [B])`` batches.

    Args:
        mixer: timm's ``Mixup`` for Mixup/CutMix, or ``None`` (:func:`build_criterion`).
        criterion: the label loss (:func:`build_criterion`).
        distill: ``"none"``, or DeiT's ``"hard"`` / ``"soft"`` distillation from a teacher
            attached with :meth:`attach_teacher`, weighted ``alpha`` at temperature ``tau``.
        tta: the test-time augmentation of the test split; ``val_tta`` that of validation
            (``None``: the same).
        fill: ``[C]`` normalised black, the border of ``'hflip_shift'``'s moved views.
    """

    monitors: ClassVar[dict[str, Literal["min", "max"]]] = {"val/acc1": "max", "val/acc5": "max", "val/loss": "min"}
    monitor: ClassVar[str] = "val/acc1"
    summary_metrics: ClassVar[dict[str, str]] = {"val_acc": "val/acc1", "test_acc": "test/acc1", "test_acc5": "test/acc5"}
    progress_metric: ClassVar[str] = "acc1"
    pure_bf16: ClassVar[bool] = True

    def __init__(
        self,
        mixer: Mixup | None,
        criterion: nn.Module,
        *,
        distill: Literal["none", "hard", "soft"] = "none",
        alpha: float = 0.5,
        tau: float = 1.0,
        tta: TestTimeAugmentation = "none",
        val_tta: TestTimeAugmentation | None = None,
        fill: torch.Tensor | None = None,
    ) -> None:
        super().__init__()
        self.mixup = mixer
        self.train_criterion = criterion
        self.distill_loss = None if distill == "none" else DistillationLoss(criterion, distill, alpha, tau)
        self.tta: TestTimeAugmentation = tta
        self.val_tta: TestTimeAugmentation = val_tta or tta
        self.fill = fill
        # Kept out of the children: neither checkpointed nor switched to train mode nor optimised.
        self.__dict__["teacher"] = None

    @classmethod
    def from_recipe(cls, options: Config, setup: TaskSetup) -> ClassifyTask:
        """The recipe's ``optim`` regularisers, ``distill`` section and ``trainer`` test-time
        augmentation, with ``'hflip_shift'``'s black border from the data's normalisation."""
        optim, distill, trainer, extra = setup.recipe.optim, setup.recipe.distill, setup.recipe.trainer, setup.extra
        mixer, criterion = build_criterion(
            setup.model.num_classes, mixup=optim.mixup, cutmix=optim.cutmix, mixup_prob=optim.mixup_prob,
            mixup_switch_prob=optim.mixup_switch_prob, label_smoothing=optim.label_smoothing,
        )
        fill = black_level(extra["mean"], extra["std"]) if "mean" in extra and "std" in extra else None
        return cls(mixer, criterion, distill=distill.type, alpha=distill.alpha, tau=distill.tau, tta=trainer.tta,
                   val_tta=trainer.val_tta, fill=fill)

    def summary(self, metric: Callable[[str], float | None]) -> dict[str, Any]:
        """Besides the accuracies: the test-time augmentation of test and validation, and under it
        the test accuracy of the images alone (and, for ``'hflip_shift'``, with their mirrors only)."""
        entries: dict[str, Any] = {**super().summary(metric), "tta": self.tta, "val_tta": self.val_tta}
        if self.tta != "none":
            entries["test_acc_one_view"] = metric("test/acc1_one_view")
        if self.tta == "hflip_shift":
            entries["test_acc_mirrored"] = metric("test/acc1_mirrored")
        return entries

    def attach_teacher(self, teacher: nn.Module) -> None:
        """Distil from ``teacher`` (frozen, see :func:`vitkit.train.distill.freeze`)."""
        self.__dict__["teacher"] = teacher

    def prepare(self, model: nn.Module) -> None:
        if self.distill_loss is not None and hasattr(model, "set_distilled_training"):
            model.set_distilled_training(True)  # a distillation token's head gets the teacher's term

    def on_fit_start(self, device: torch.device) -> None:
        if self.distill_loss is not None:
            if self.teacher is None:
                raise RuntimeError("distillation is configured but no teacher was attached (attach_teacher).")
            self.teacher.to(device)

    def training_step(self, model: nn.Module, batch: Batch) -> StepOutput:
        images, targets = batch
        soft_targets = targets
        if self.mixup is not None:
            images, soft_targets = self.mixup(images, targets)
        outputs = model(images)
        # (class, distillation) logits from a model with a distillation token; else one set for both, as DeiT
        logits, dist_logits = outputs if isinstance(outputs, tuple) else (outputs, outputs)
        if self.distill_loss is not None:
            with torch.no_grad():
                teacher_logits = self.teacher(images)
            loss = self.distill_loss(logits, dist_logits, soft_targets, teacher_logits)
        else:
            loss = self.train_criterion(logits, soft_targets)
        metrics = {} if self.mixup is not None else {"acc1": partial(_top1, logits.detach(), targets)}
        return StepOutput(loss, len(targets), metrics)

    def evaluation_step(self, model: nn.Module, batch: Batch, stage: str) -> StepOutput:
        images, targets = batch
        views = predict_views(model, images, self.val_tta if stage == "val" else self.tta, self.fill)
        loss, acc1, acc5 = batch_metrics(average_views(views), targets)
        metrics = {"acc1": acc1, "acc5": acc5}
        if len(views) > 1:  # the images alone, beside the averaged views, so that the gain is measured
            metrics["acc1_one_view"] = accuracy(views[0], targets)[0]
        if len(views) > 2:  # and the image with its mirror ('hflip'), so that the moved views' gain is too
            metrics["acc1_mirrored"] = accuracy(average_views(views[:2]), targets)[0]
        return StepOutput(loss, len(targets), metrics)
