"""Knowledge distillation from a CNN (or any classifier) teacher, as DeiT (Touvron et al. 2020,
"Training data-efficient image transformers & distillation through attention",
https://arxiv.org/abs/2012.12877).

The loss is :class:`vitkit.tasks.DistillationLoss` (DeiT's); this module builds, trains and
freezes the teacher. The teacher is built for the data (a timm model with ``pretrained=False``, ``in_chans`` and
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
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file
from torch import nn
from tqdm.auto import tqdm

from ..data import DataInfo
from ..evaluation import evaluate_model
from ..files import atomic_write
from ..io import load_model, shape_mismatches
from ..models.config import MAX_PARAMETERS
from .config import DistillConfig, TeacherConfig
from .datamodule import ViTDataModule
from .optim import Horizon, warmup_cosine
from .schema import RecipeError

log = logging.getLogger(__name__)

#: Where a run keeps the teacher it trained, so a resumed run distils from the same one.
TEACHER_FILE = "teacher.safetensors"


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
