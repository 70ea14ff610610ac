"""Knowledge distillation from a CNN (or any classifier) teacher, as DeiT (Touvron et al. 2020,
"Training data-efficient image transformers & distillation through attention",
https://arxiv.org/abs/2012.12877).

The loss is :class:`vitkit.tasks.DistillationLoss` (DeiT's); this module builds, trains and
freezes the teacher. The teacher is built for the data (a timm model with ``pretrained=False``, ``in_chans`` and
``num_classes`` from the dataset, trained first by the same command, or a vitkit model file),
then frozen: eval mode, no gradients, its logits computed under ``no_grad``.
"""

from __future__ import annotations

import difflib
import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import timm
import torch
import torch.nn.functional as F
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file
from torch import nn
from tqdm.auto import tqdm

from ..data import DataInfo
from ..evaluation import evaluate_model
from ..files import atomic_write
from ..io import load_model, shape_mismatches
from ..models.config import MAX_PARAMETERS
from ..schema import MAX_BATCH_SIZE, MAX_EPOCHS, Config, FieldError, RecipeError, bounds, describe
from .datamodule import ViTDataModule
from .optim import Horizon, warmup_cosine

log = logging.getLogger(__name__)

#: Where a run keeps the teacher it trained, so a resumed run distils from the same one.
TEACHER_FILE = "teacher.safetensors"



@dataclass
class TeacherConfig(Config):
    """The teacher of a distilling run: a timm model trained first by the same command, a timm
    model with trained weights from a file, or a vitkit model file.

    Attributes:
        model: a timm model name (``resnet18``), built for the data (``pretrained=False``,
            ``in_chans`` and ``num_classes`` from the dataset) and trained for ``epochs`` first.
        model_kwargs: more keyword arguments of ``timm.create_model`` (timm's ``--model-kwargs``), e.g.
            ``{layers: [1, 1, 1, 1], channels: [16, 32, 64, 128], stem_width: 16}`` for a narrow ResNet-10.
        small_input_stem: replace a ResNet's stem (``conv1`` 7x7 stride 2, then ``maxpool``) with one
            3x3 stride-1 convolution and no pooling, as He et al.'s CIFAR ResNets (arXiv 1512.03385,
            section 4.2): a 28-pixel image then reaches the last stage at 4x4, not 1x1.
        file: a vitkit model file (``save_model``, e.g. another run's ``model.safetensors``); with
            ``model``, the weights of that timm teacher (another run's ``teacher.safetensors``), so
            several students distil from one teacher trained once.
        epochs: training epochs of a ``model`` teacher (AdamW, one-epoch warmup, cosine decay).
        lr: its peak learning rate.
        weight_decay: its AdamW weight decay.
        batch_size: its batch size.
    """

    model: str | None = None
    model_kwargs: dict[str, Any] = field(default_factory=dict)
    small_input_stem: bool = False
    file: str | None = None
    epochs: int = field(default=5, metadata=bounds(ge=1, le=MAX_EPOCHS))
    lr: float = field(default=2e-3, metadata=bounds(gt=0))
    weight_decay: float = field(default=0.05, metadata=bounds(ge=0))
    batch_size: int = field(default=128, metadata=bounds(ge=1, le=MAX_BATCH_SIZE))

    def validate(self) -> None:
        """A timm name timm knows, a file that exists."""
        if self.model is not None and not timm.is_model(self.model):
            close = difflib.get_close_matches(self.model, timm.list_models(), n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise FieldError("model", f"is no timm model: {describe(self.model)}.{hint}")
        if self.file is not None and not Path(self.file).is_file():
            raise FieldError("file", f"does not exist: {describe(self.file)}.")
        if self.file is not None and self.model is None and (self.model_kwargs or self.small_input_stem):
            raise FieldError(
                "file", "alone is a finished vitkit model: model_kwargs and small_input_stem only shape a timm teacher "
                "(give teacher.model too, to load a timm teacher's weights from the file)."
            )
        reserved = {"pretrained", "num_classes", "in_chans"} & set(self.model_kwargs)
        if reserved:
            raise FieldError(
                "model_kwargs", f"may not set {', '.join(sorted(reserved))}: the teacher is built untrained for the data."
            )


@dataclass
class DistillConfig(Config):
    """DeiT distillation (Touvron et al. 2020, arXiv 2012.12877; :mod:`vitkit.train.distill`).

    Attributes:
        type: ``'none'``, ``'hard'`` (the teacher's argmax as a second label) or ``'soft'``
            (KL divergence to the teacher's tempered softmax).
        alpha: weight of the distillation term; the label loss gets ``1 - alpha``.
        tau: softmax temperature of ``soft`` distillation.
        teacher: where the teacher comes from (:class:`TeacherConfig`); unused with ``type: none``.
    """

    type: Literal["none", "hard", "soft"] = "none"
    alpha: float = field(default=0.5, metadata=bounds(ge=0, le=1))
    tau: float = field(default=1.0, metadata=bounds(gt=0))
    teacher: TeacherConfig = field(default_factory=TeacherConfig)

    def validate(self) -> None:
        """A distilling run names its teacher."""
        if self.type != "none" and self.teacher.model is None and self.teacher.file is None:
            raise FieldError(
                "teacher",
                f"must name teacher.model (a timm model name), teacher.file (a vitkit model file) or both (a timm "
                f"teacher with another run's teacher.safetensors) "
                f"for distill.type={self.type!r}.",
            )


def freeze(teacher: nn.Module) -> nn.Module:
    """``teacher`` in eval mode (BatchNorm statistics and dropout fixed) with every parameter's
    ``requires_grad`` off."""
    teacher.eval()
    teacher.requires_grad_(False)
    return teacher


def build_teacher(config: TeacherConfig, info: DataInfo) -> nn.Module:
    """The teacher ``config`` names, built for the data: a vitkit model file (checked against the
    dataset's classes, channels and image size) or a timm model (``pretrained=False``, with
    ``model_kwargs``, and :func:`small_input_stem` when asked) in channels-last memory format,
    untrained or with the weights of ``file`` (another run's ``teacher.safetensors``)."""
    if config.file is not None and config.model is None:
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
    check_timm_teacher(config, info)  # on the meta device: nothing is allocated before it fits
    model = _timm_teacher(config, info)
    if config.file is not None:
        load_teacher_weights(model, Path(config.file), config.model)
    # convolutions run fastest on CPU (oneDNN) and GPU with NHWC activations; a no-op for other weights
    return model.to(memory_format=torch.channels_last)


def _timm_teacher(config: TeacherConfig, info: DataInfo) -> nn.Module:
    """timm's ``config.model`` built for the data (untrained), with the small-input stem when asked."""
    try:
        model = timm.create_model(
            config.model, pretrained=False, num_classes=info.num_classes, in_chans=info.in_chans, **config.model_kwargs
        )
    except (TypeError, ValueError, AssertionError) as error:
        raise RecipeError(
            f"distill.teacher.model_kwargs {config.model_kwargs} do not build timm's {config.model!r}: {error}."
        ) from None
    return small_input_stem(model, config.model) if config.small_input_stem else model


def check_timm_teacher(config: TeacherConfig, info: DataInfo) -> None:
    """Refuse, before any weight is allocated, a timm teacher above :data:`MAX_PARAMETERS` or one
    that cannot take the data's images (a fixed-size ViT on another image size): the teacher is
    built on the meta device and run on one meta image. An op the meta device lacks leaves the
    check to the real forward.

    Raises:
        RecipeError: naming the size or the teacher's own complaint, and what to change.
    """
    with torch.device("meta"):
        model = _timm_teacher(config, info)
    count = sum(param.numel() for param in model.parameters())
    if count > MAX_PARAMETERS:
        raise RecipeError(
            f"distill.teacher.model {config.model!r} has {count:,} parameters, more than vitkit builds "
            f"({MAX_PARAMETERS:,}); choose a smaller teacher or shrink it with distill.teacher.model_kwargs."
        )
    height, width = info.img_size
    try:
        with torch.no_grad():
            model.eval()(torch.empty(1, info.in_chans, height, width, device="meta"))
    except NotImplementedError:
        return
    except (AssertionError, ValueError, RuntimeError) as error:
        reason = " ".join(str(error).split())[:200] or type(error).__name__
        raise RecipeError(
            f"distill.teacher.model {config.model!r} cannot take the data's {height}x{width} images ({reason}); "
            f"build it for them (distill.teacher.model_kwargs={{img_size: {height}}} for a ViT) or choose a "
            "teacher that takes any size (a CNN such as resnet18)."
        ) from None


def load_teacher_weights(teacher: nn.Module, path: Path, name: str) -> None:
    """Load ``path`` (a safetensors file, e.g. a distilling run's ``teacher.safetensors``) into the
    timm ``teacher``, after checking from the file's header alone that it holds exactly the
    teacher's tensor names and shapes."""
    try:
        with safe_open(path, "pt") as handle:
            found = {key: tuple(handle.get_slice(key).get_shape()) for key in handle.keys()}
    except (SafetensorError, OSError) as error:
        raise RecipeError(f"distill.teacher.file {path} is no readable safetensors file ({error}).") from None
    wanted = {key: tuple(value.shape) for key, value in teacher.state_dict().items()}
    shown = shape_mismatches(wanted, found)
    if shown:
        raise RecipeError(
            f"distill.teacher.file {path} holds no weights of the teacher built from timm's {name!r} with these "
            f"options ({shown}); give the model, model_kwargs and small_input_stem it was trained with."
        )
    teacher.load_state_dict(load_file(path))


def small_input_stem(model: nn.Module, name: str) -> nn.Module:
    """``model`` (a ResNet: ``conv1`` then ``maxpool``) with the CIFAR stem of He et al. 2016 (arXiv
    1512.03385, section 4.2): ``conv1`` becomes a 3x3 stride-1 convolution of the same widths and
    ``maxpool`` an identity, so the image keeps its resolution until the first strided stage."""
    conv, pool = getattr(model, "conv1", None), getattr(model, "maxpool", None)
    if not isinstance(conv, nn.Conv2d) or not isinstance(pool, nn.Module):
        raise RecipeError(
            f"distill.teacher.small_input_stem needs a ResNet-style stem (a conv1 convolution and a maxpool), which "
            f"timm's {name!r} does not have; use a ResNet (resnet10t, resnet18, ...) or drop small_input_stem."
        )
    model.conv1 = nn.Conv2d(conv.in_channels, conv.out_channels, 3, stride=1, padding=1, bias=False)
    model.maxpool = nn.Identity()
    return model


def fit_teacher(
    teacher: nn.Module, config: TeacherConfig, datamodule: ViTDataModule, precision: str, progress: bool = False
) -> dict[str, Any]:
    """Train ``teacher`` in place for ``config.epochs`` on the training split (its augmentation),
    AdamW with a one-epoch warmup and cosine decay; returns its validation and test accuracy and
    its training time."""
    started = time.perf_counter()
    loader = datamodule.loader(datamodule.bundle.train, config.batch_size, train=True)
    total = config.epochs * len(loader)
    optimizer = torch.optim.AdamW(teacher.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    schedule = warmup_cosine(optimizer, Horizon(warmup_steps=min(len(loader), total // 2), total_steps=total, floor=1e-2))
    bf16 = precision == "bf16-mixed"
    teacher.train()
    for epoch in range(config.epochs):
        batches = tqdm(loader, desc=f"teacher epoch {epoch + 1}/{config.epochs}", disable=not progress, leave=False)
        for step, (images, targets) in enumerate(batches):
            images = images.contiguous(memory_format=torch.channels_last)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                loss = F.cross_entropy(teacher(images), targets)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
            if progress and step % 50 == 0:  # .item() waits for the device: not on every step
                batches.set_postfix(loss=f"{loss.item():.3f}", refresh=False)
        log.info("teacher epoch %d/%d: last batch loss %.4f", epoch + 1, config.epochs, loss.item())
    teacher.eval()
    trained_s = round(time.perf_counter() - started, 2)
    report = {"teacher_train_s": trained_s}
    for split in ("val", "test"):
        dataset = getattr(datamodule.bundle, split)
        loader = datamodule.loader(dataset, 2 * config.batch_size, train=False)
        report[f"teacher_{split}_acc"] = evaluate_model(teacher, loader).top1 if len(dataset) else math.nan
    return report


def prepare_teacher(
    teacher: nn.Module,
    config: DistillConfig,
    datamodule: ViTDataModule,
    run_dir: Path,
    precision: str,
    progress: bool = False,
) -> dict[str, Any]:
    """Make ``teacher`` (from :func:`build_teacher`) the frozen teacher of a distilling run and
    say what to report about it: a ``teacher.file`` as loaded, else the run's own
    ``teacher.safetensors`` (a resumed run), else trained now (and saved there)."""
    named = [name for name in (config.teacher.model, config.teacher.file) if name is not None]
    report: dict[str, Any] = {"teacher": " with weights ".join(named)}
    saved = run_dir / TEACHER_FILE
    run_dir.mkdir(parents=True, exist_ok=True)
    if config.teacher.file is None:
        if saved.is_file():  # a resumed run: the same header check as a teacher.file
            load_teacher_weights(teacher, saved, config.teacher.model)
        else:
            report.update(fit_teacher(teacher, config.teacher, datamodule, precision, progress))
            state = {key: value.detach().contiguous() for key, value in teacher.state_dict().items()}
            atomic_write(saved, lambda tmp: save_file(state, tmp))
    freeze(teacher)
    return report
