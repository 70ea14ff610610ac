"""Pretrained weights into any vitkit model, layered as timm's ``load_pretrained``: read the
weights (:func:`read_pretrained`), then fit them to the model (:func:`load_pretrained`): filter,
adapt (resample the learned position embedding, timm's ``adapt_input_conv`` for another channel
count, keep or re-initialise the classifier), and ``load_state_dict``.

Sources: a vitkit model file or training checkpoint, or a timm model's weights (``timm:NAME`` with
a weights file, or timm's own download). A timm source is read through timm's model built on the
meta device with the file's tensors assigned to it: no memory, no init, and no vitkit model is
built to read it. The model to load into is built once, by the caller, at the size, channels and
classes its data need (:func:`fit_config` gives that architecture)::

    weights = vitkit.read_pretrained("runs/mae/latest/model.safetensors")
    model = vitkit.VisionTransformer(vitkit.fit_config(weights, num_classes=10))
    vitkit.load_pretrained(model, weights)
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import timm
import torch
from einops import rearrange
from timm.layers import resample_abs_pos_embed
from timm.models import adapt_input_conv
from torch import nn

from .errors import VitkitError
from .files import path_kind
from .io import read_model, read_weights_file
from .models import VisionTransformer, ViTConfig
from .models.config import MAX_PARAMETERS
from .models.timm_interop import PATCH_WEIGHT, pretrained_preprocessing, timm_config_and_state

#: The prefix that names a timm model (``timm:deit_small_patch16_224``).
TIMM_PREFIX = "timm:"


class PretrainedError(VitkitError, ValueError):
    """Weights that cannot be read, or that do not fit the model they are loaded into."""


class SourceKeys(NamedTuple):
    """How messages name the three inputs of :func:`read_pretrained` (a recipe says
    ``model.pretrained``, ``model.pretrained_file``, ``model.pretrained_kwargs``)."""

    source: str = "pretrained"
    file: str = "file"
    kwargs: str = "timm_kwargs"


#: The names the library's own messages use.
LIBRARY_KEYS = SourceKeys()


@dataclass
class PretrainedWeights:
    """Weights read by :func:`read_pretrained`.

    Attributes:
        config: the architecture they describe, at their own image size, channels and classes.
        state: their state dict in vitkit's layout.
        preprocessing: how they saw images (``mean``, ``std``, ``interpolation``, ``crop_pct``
            where known).
        record: where they came from (``pretrained``, ``pretrained_file``), saved with a run.
        class_names: the classes their classifier was trained on, where recorded (vitkit files).
    """

    config: ViTConfig
    state: dict[str, torch.Tensor]
    preprocessing: dict[str, Any]
    record: dict[str, Any]
    class_names: tuple[str, ...] | None = None

    @property
    def description(self) -> str:
        """``timm:deit_tiny_patch16_224 (deit_t.safetensors)`` or the model file's path."""
        file = self.record.get("pretrained_file")
        return f"{self.record['pretrained']}" + (f" ({file})" if file else "")

    @classmethod
    def of_model_file(cls, path: str | os.PathLike, record: dict[str, Any] | None = None) -> PretrainedWeights:
        """A vitkit model file or checkpoint's weights (``VitkitError`` when it is not one)."""
        config, state, extra = read_model(path)
        names = extra.get("class_names")
        preprocessing = {key: extra[key] for key in ("mean", "std", "interpolation", "crop_pct") if extra.get(key) is not None}
        if record is None:
            record = {"pretrained": str(path), **({"pretrained_from": extra["pretrained"]} if "pretrained" in extra else {})}
        return cls(config, state, preprocessing, record, tuple(names) if names is not None else None)


def read_pretrained(
    source: str | os.PathLike,
    *,
    file: str | os.PathLike | None = None,
    timm_kwargs: dict[str, Any] | None = None,
    keys: SourceKeys = LIBRARY_KEYS,
    error: type[VitkitError] = PretrainedError,
) -> PretrainedWeights:
    """Read pretrained weights.

    Args:
        source: a vitkit model file or checkpoint, or ``timm:NAME`` (a timm model name, with its
            tag: ``timm:vit_small_patch16_224.augreg_in21k``).
        file: with ``timm:NAME``, a state dict of that model saved with safetensors or torch
            (``weights_only``: no pickled code runs); ``None`` asks timm to download them.
        timm_kwargs: keyword arguments for ``timm.create_model`` (timm's ``--model-kwargs``).
        keys, error: how messages name the inputs, and the exception they raise.

    Raises:
        ``error``: a missing or unreadable file, a timm name timm lacks, weights that do not fit
            that timm model, a model over :data:`~vitkit.models.config.MAX_PARAMETERS`, a failed
            download (one line each).
    """
    source = str(source)
    if source.startswith(TIMM_PREFIX):
        return _timm_weights(source.removeprefix(TIMM_PREFIX), file, dict(timm_kwargs or {}), keys, error)
    path = Path(source)
    if not path.is_file():
        raise error(
            f"{keys.source}: {path} {path_kind(path)}; give a vitkit model file (a run's model.safetensors, a pruned "
            f"model, a .ckpt; not the folder of a trainer.strategy=fsdp run's sharded checkpoint) or timm:NAME with {keys.file}."
        )
    try:
        return PretrainedWeights.of_model_file(path)
    except VitkitError as problem:
        raise error(
            f"{keys.source}: {problem} If the file holds a timm model's weights, give "
            f"{keys.source}=timm:<timm model name> {keys.file}={path}."
        ) from None


def _timm_weights(
    name: str, file: str | os.PathLike | None, kwargs: dict[str, Any], keys: SourceKeys, error: type[VitkitError]
) -> PretrainedWeights:
    """A timm model's weights: its model built on the meta device (no memory), bounded in size, with
    ``file``'s tensors assigned; or timm's own download when ``file`` is ``None``."""
    base = name.split(".")[0]
    if not timm.is_model(base):
        close = difflib.get_close_matches(base, timm.list_models(), n=1)
        hint = f" Did you mean 'timm:{close[0]}'?" if close else ""
        raise error(f"{keys.source}: timm has no model {base!r}.{hint}")
    if file is None:
        source = _create(name, kwargs, keys, error, pretrained=True)
    else:
        state = read_weights_file(file, error=error, what=keys.file)
        head = state.get("head.weight")
        num_classes = head.shape[0] if isinstance(head, torch.Tensor) and head.dim() == 2 else 0
        with torch.device("meta"):
            source = _create(name, kwargs, keys, error, num_classes=num_classes)
        size = sum(p.numel() for p in source.parameters())
        if size > MAX_PARAMETERS:
            raise error(
                f"{keys.kwargs}: timm:{name} with {kwargs} would hold {size:.3g} weights, more than the limit of "
                f"{MAX_PARAMETERS:.3g}; give the keyword arguments its weights were trained with."
            )
        _assign(source, state, name, file, keys, error)
    try:
        config, vit_state = timm_config_and_state(source)
    except (ValueError, RuntimeError) as problem:
        raise error(f"{keys.source}: timm:{name} cannot be loaded by vitkit: {problem}") from None
    preprocessing = pretrained_preprocessing(getattr(source, "pretrained_cfg", None), config) or {}
    record = {"pretrained": f"{TIMM_PREFIX}{name}", "pretrained_file": None if file is None else str(file)}
    return PretrainedWeights(config, vit_state, preprocessing, record)


def _create(
    name: str, kwargs: dict[str, Any], keys: SourceKeys, error: type[VitkitError], pretrained: bool = False, **more: Any
) -> nn.Module:
    """``timm.create_model``, its failures (a download, an argument the model refuses) one line."""
    try:
        return timm.create_model(name, pretrained=pretrained, **{**kwargs, **more})
    except Exception as problem:  # noqa: BLE001 - a download, cache or argument failure is the user's to fix
        first = str(problem).strip().splitlines()
        reason = first[0] if first else type(problem).__name__
        if pretrained:
            raise error(
                f"{keys.source}: timm could not download the weights of {name} ({reason}); download them where "
                f"the hub is reachable and give {keys.file}=<the file>."
            ) from None
        raise error(f"{keys.kwargs}: timm cannot build {name} with {kwargs}: {reason}") from None


def _assign(
    model: nn.Module, state: dict[str, torch.Tensor], name: str, file: str | os.PathLike, keys: SourceKeys,
    error: type[VitkitError],
) -> None:
    """``state`` assigned to the meta-device timm ``model`` (strict); a learned position embedding of
    another grid is resampled to the model's first, as timm's own checkpoint filter does."""
    table, ours = state.get("pos_embed"), getattr(model, "pos_embed", None)
    if isinstance(table, torch.Tensor) and isinstance(ours, torch.Tensor) and table.dim() == 3 \
            and table.shape != ours.shape and hasattr(model.patch_embed, "grid_size"):
        prefix = 0 if getattr(model, "no_embed_class", False) else model.num_prefix_tokens
        state = {**state, "pos_embed": resample_abs_pos_embed(table, list(model.patch_embed.grid_size), num_prefix_tokens=prefix)}
    try:
        model.load_state_dict(state, strict=True, assign=True)
    except RuntimeError as problem:
        lines = [line.strip() for line in str(problem).splitlines()[1:] if line.strip()]
        raise error(
            f"{keys.file}: {file} does not hold the weights of timm model {name}: "
            f"{'; '.join(lines[:2])[:400]}. Give the weights of that architecture, the timm name they belong to, or "
            f"the {keys.kwargs} they were built with (e.g. {{depth: 6}})."
        ) from None
    model.eval()  # non-persistent buffers (RoPE's grids) stay on the meta device: the conversion reads the state dict


def fit_config(
    weights: PretrainedWeights,
    *,
    img_size: tuple[int, int] | None = None,
    in_chans: int | None = None,
    num_classes: int | None = None,
    **free: Any,
) -> ViTConfig:
    """The architecture of ``weights`` at another image size, channel count or class count
    (``None``: theirs), with ``free`` :class:`ViTConfig` fields (regularisation, kernels) changed:
    what to build before :func:`load_pretrained`."""
    data = {key: value for key, value in (("img_size", img_size), ("in_chans", in_chans), ("num_classes", num_classes))
            if value is not None}
    return weights.config.replace(**data, **free)


def load_pretrained(
    model: VisionTransformer,
    weights: PretrainedWeights | str | os.PathLike,
    *,
    reset_head: bool | None = None,
    class_names: Sequence[str] | None = None,
) -> bool:
    """Load ``weights`` into ``model`` (any :class:`VisionTransformer` of their architecture), fitted
    to it: the learned position embedding resampled to its grid (bicubic), the first layer's filters
    adapted to its channels (timm's ``adapt_input_conv``: 1 channel sums the RGB filters), and the
    classifier kept or left as the model's own (re-initialised). A model whose final norm comes after
    pooling where the weights' came before it, or the reverse (``fc_norm``, as ``global_pool='avg'``
    sets it), keeps its own fresh norm and drops theirs: MAE's fine-tuning of an encoder pre-trained
    with the norm on every token (He et al. 2021, arXiv 2111.06377; its ``models_vit.py``).

    Args:
        model: the model to fill, built once (:func:`fit_config` gives its architecture).
        weights: :class:`PretrainedWeights`, or a source for :func:`read_pretrained`.
        reset_head: keep the weights' classifier (``False``), or leave the model's fresh one
            (``True``); ``None``: reset when the classes differ (their count, or their names where
            both ``class_names`` and the weights record them), as timm's ``num_classes=``, or
            the final norm moved, or ``head_bn`` added or removed (a fresh batch norm).
        class_names: the classes the model will be trained on, if known.

    Returns:
        whether the classifier was re-initialised (so that the caller can say so).

    Raises:
        PretrainedError: the model's architecture differs from the weights' beyond image size,
            channels, classes and the free fields, or ``reset_head=False`` with other classes,
            with the final norm moved or with ``head_bn`` changed.
    """
    if not isinstance(weights, PretrainedWeights):
        weights = read_pretrained(weights)
    source, target = weights.config, model.config
    other_classes = target.num_classes != source.num_classes or (
        weights.class_names is not None and class_names is not None and tuple(weights.class_names) != tuple(class_names)
    )
    moved_norm = source.use_fc_norm != target.use_fc_norm  # its classifier read other features
    other_bn = source.head_bn != target.head_bn  # so did it with a batch norm added or taken away
    reset = (other_classes or moved_norm or other_bn) if reset_head is None else reset_head
    if not reset and target.num_classes != source.num_classes:
        raise PretrainedError(
            f"keeping the classifier of {weights.description}, which has {source.num_classes} classes, in a model of "
            f"{target.num_classes}: reset the head (reset_head=True, or leave it unset)."
        )
    if other_bn and not reset:
        raise PretrainedError(
            f"keeping the classifier of {weights.description} with head_bn {'added' if target.head_bn else 'removed'}: "
            "it was trained on other features; reset the head (reset_head=True, or leave it unset), or keep the "
            "weights' head_bn."
        )
    if moved_norm and not reset:
        raise PretrainedError(
            f"keeping the classifier of {weights.description} with the final norm moved "
            f"({'after' if target.use_fc_norm else 'before'} pooling): it was trained on other features; reset the "
            "head (reset_head=True, or leave it unset), or keep the weights' global_pool and fc_norm."
        )
    state = _adapt_channels(dict(weights.state), source, target.in_chans)
    fresh = ("head.", "head_dist.") if reset else ()  # the model's own classifier, as its init scheme drew it
    if moved_norm:  # MAE's fine-tuning: a new norm after average pooling, the encoder's last norm dropped
        fresh += ("norm.", "fc_norm.")
    if other_bn:  # MAE's linear probe: a fresh BatchNorm before the new classifier
        fresh += ("head_bn.",)
    if fresh:
        state = {key: value for key, value in state.items() if not key.startswith(fresh)}
        state.update({key: value for key, value in model.state_dict().items() if key.startswith(fresh)})
    try:
        model.load_weights(state, source_grid=source.grid_size)
    except RuntimeError as problem:
        lines = [line.strip() for line in str(problem).splitlines()[1:] if line.strip()]
        raise PretrainedError(
            f"the weights of {weights.description} do not fit this model: {'; '.join(lines[:2])[:400]}."
        ) from None
    return reset


def _adapt_channels(state: dict[str, torch.Tensor], source: ViTConfig, in_chans: int) -> dict[str, torch.Tensor]:
    """``state`` with its first layer's filters adapted from ``source.in_chans`` to ``in_chans`` channels
    by timm's ``adapt_input_conv`` (1 channel: the filters summed over the source's channels)."""
    if in_chans == source.in_chans:
        return state
    if source.shifted_patches:
        raise PretrainedError(
            f"weights with shifted patch tokens take {source.in_chans}-channel images and cannot be adapted to "
            f"{in_chans}: give {source.in_chans}-channel images (data.in_chans={source.in_chans})."
        )
    if source.patch_embed == "conv":
        key = next(k for k, v in state.items() if k.startswith("patch_embed.stem.") and v.dim() == 4)
        state[key] = adapt_input_conv(in_chans, state[key], base_chans=source.in_chans)
        return state
    p1, p2 = source.patch_size
    conv = rearrange(state[PATCH_WEIGHT], "d (p1 p2 c) -> d c p1 p2", p1=p1, p2=p2)
    adapted = adapt_input_conv(in_chans, conv, base_chans=source.in_chans)
    state[PATCH_WEIGHT] = rearrange(adapted, "d c p1 p2 -> d (p1 p2 c)")
    return state
