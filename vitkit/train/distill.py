"""Knowledge distillation from a CNN (or any classifier) teacher, as DeiT (Touvron et al. 2020,
"Training data-efficient image transformers & distillation through attention",
https://arxiv.org/abs/2012.12877).

:class:`DistillationLoss` is DeiT's ``losses.py`` (facebookresearch/deit): the student's class
logits learn the labels, its distillation logits (the distillation token's head, or the class
logits again for a model without one, as DeiT does) learn the teacher:

- ``hard``: ``(1 - alpha) CE(cls, y) + alpha CE(dist, argmax teacher)`` (``alpha`` 0.5: the paper's
  ``1/2 CE(y) + 1/2 CE(y_t)``);
- ``soft``: ``(1 - alpha) CE(cls, y) + alpha tau^2 KL(p_t || p_s)`` with ``p = softmax(logits / tau)``,
  DeiT's ``kl_div(log p_s, log p_t, reduction='sum', log_target=True) / numel``: summed over the
  batch and the classes and divided by ``B x C`` (PyTorch's legacy mean, which DeiT keeps; see
  its issue 61), i.e. the per-image KL divided by the number of classes too.

The teacher is built for the data (a timm model with ``pretrained=False``, ``in_chans`` and
``num_classes`` from the dataset, trained first by the same command, or a vitkit model file),
then frozen: eval mode, no gradients, its logits computed under ``no_grad``.
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import Any

import timm
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

from ..data import DataInfo
from ..evaluation import evaluate_model
from ..files import atomic_write
from ..io import load_model
from .config import DistillConfig, TeacherConfig
from .datamodule import ViTDataModule
from .optim import warmup_cosine
from .schema import RecipeError

log = logging.getLogger(__name__)

#: Where a run keeps the teacher it trained, so a resumed run distils from the same one.
TEACHER_FILE = "teacher.safetensors"


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


def freeze(teacher: nn.Module) -> nn.Module:
    """``teacher`` in eval mode (BatchNorm statistics and dropout fixed) with every parameter's
    ``requires_grad`` off."""
    teacher.eval()
    teacher.requires_grad_(False)
    return teacher


def build_teacher(config: TeacherConfig, info: DataInfo) -> nn.Module:
    """The teacher ``config`` names, built for the data: a vitkit model file (checked against the
    dataset's classes, channels and image size) or a fresh timm model (``pretrained=False``)."""
    if config.file is not None:
        model = load_model(config.file)
        found = (model.config.num_classes, model.config.in_chans, tuple(model.config.img_size))
        wanted = (info.num_classes, info.in_chans, tuple(info.img_size))
        if found != wanted:
            raise RecipeError(
                f"distill.teacher.file {config.file} classifies {found[0]} classes of {found[1]}-channel "
                f"{found[2][0]}x{found[2][1]} images, but the data has {wanted[0]} classes of {wanted[1]}-channel "
                f"{wanted[2][0]}x{wanted[2][1]} images; give a teacher trained on this dataset."
            )
        return model
    return timm.create_model(config.model, pretrained=False, num_classes=info.num_classes, in_chans=info.in_chans)


def fit_teacher(
    teacher: nn.Module, config: TeacherConfig, datamodule: ViTDataModule, precision: str
) -> dict[str, Any]:
    """Train ``teacher`` in place for ``config.epochs`` on the training split (its augmentation),
    AdamW with a one-epoch warmup and cosine decay; returns its validation accuracy and time."""
    started = time.perf_counter()
    loader = datamodule.loader(datamodule.bundle.train, config.batch_size, train=True)
    total = config.epochs * len(loader)
    optimizer = torch.optim.AdamW(teacher.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    schedule = warmup_cosine(optimizer, warmup_steps=min(len(loader), total // 2), total_steps=total,
                             lr=config.lr, min_lr=config.lr * 1e-2)
    bf16 = precision == "bf16-mixed"
    teacher.train()
    for epoch in range(config.epochs):
        for images, targets in loader:
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                loss = F.cross_entropy(teacher(images), targets)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
        log.info("teacher epoch %d/%d: last batch loss %.4f", epoch + 1, config.epochs, loss.item())
    teacher.eval()
    val = datamodule.loader(datamodule.bundle.val, 2 * config.batch_size, train=False)
    accuracy = evaluate_model(teacher, val).top1 if len(datamodule.bundle.val) else math.nan
    return {"teacher_val_acc": accuracy, "teacher_train_s": round(time.perf_counter() - started, 2)}


def prepare_teacher(
    teacher: nn.Module, config: DistillConfig, datamodule: ViTDataModule, run_dir: Path, precision: str
) -> dict[str, Any]:
    """Make ``teacher`` (from :func:`build_teacher`) the frozen teacher of a distilling run and
    say what to report about it: a ``teacher.file`` as loaded, else the run's own
    ``teacher.safetensors`` (a resumed run), else trained now (and saved there)."""
    report: dict[str, Any] = {"teacher": config.teacher.file or config.teacher.model}
    saved = run_dir / TEACHER_FILE
    run_dir.mkdir(parents=True, exist_ok=True)
    if config.teacher.file is None:
        if saved.is_file():
            teacher.load_state_dict(load_file(saved))
        else:
            report.update(fit_teacher(teacher, config.teacher, datamodule, precision))
            state = {key: value.detach().contiguous() for key, value in teacher.state_dict().items()}
            atomic_write(saved, lambda tmp: save_file(state, tmp))
    freeze(teacher)
    return report
