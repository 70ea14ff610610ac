"""The model a run trains, built once from the typed recipe.

Either a fresh variant (``model.name`` plus overrides), or the weights a run starts from
(:class:`~vitkit.pretrained.PretrainedWeights`): another vitkit run's model file or checkpoint (a
pruned model keeps its per-layer head counts), or a timm model's weights (``model.pretrained:
timm:NAME`` with ``model.pretrained_file``, or timm's own download), read and loaded by the library's
:mod:`vitkit.pretrained` into the one model built here. The weights fix the architecture; the recipe
may change only what does not contradict them (:data:`FREE_FIELDS`), and the data fix the classes,
the image size and the channels: a new class count re-initialises the classifier (with a note), a
new image size resamples the learned position embedding, a new channel count adapts the first
layer's filters.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from typing import Any

from lightning.pytorch.utilities import rank_zero_info
from torch import nn

from ..data import DataConfig, DataInfo
from ..errors import VitkitError
from ..io import read_model
from ..layers import add_lora
from ..models import VisionTransformer, ViTConfig, model_config, timm_twin, to_timm_state_dict
from ..pretrained import PretrainedError, PretrainedWeights, SourceKeys, fit_config, load_pretrained, read_pretrained
from ..schema import FieldError, RecipeError
from .config import DATA_DRIVEN_FIELDS, ModelConfig, RecipeConfig
from .freezing import check_freeze, freeze

#: ViTConfig fields a recipe may set on top of pretrained weights: regularisation, kernels, token merging, the
#: input size, and the init of a new classifier; the data set ``img_size``, ``in_chans`` and
#: ``num_classes``. Every other field is the weights' own.
FREE_FIELDS = (
    "drop_rate",
    "pos_drop_rate",
    "proj_drop_rate",
    "attn_drop_rate",
    "drop_path_rate",
    "attn_impl",
    "dynamic_img_size",
    "init",
    "out_init_scale",
    "merge_tokens",  # an inference option (ToMe's r), not a weight
    "merge_prop_attn",  # ToMe's prop_attn, an inference option too
    "global_pool",  # token or avg pooling: with fc_norm, MAE's fine-tuning (the final norm moves after pooling)
    "fc_norm",
    "head_bn",  # MAE's linear probe: a fresh BatchNorm before the classifier
    "img_size",
    "in_chans",
    "num_classes",
)

#: Free fields that only a recipe's own key changes: a ``model.name`` variant's default is no
#: choice, so the weights' value stays (an MAE encoder's init, its pooling).
WEIGHTS_DEFAULT_FIELDS = ("init", "global_pool", "fc_norm", "head_bn")

#: How messages name the recipe's keys of the weights to start from.
RECIPE_KEYS = SourceKeys("model.pretrained", "model.pretrained_file", "model.pretrained_kwargs")


def load_starting_weights(model: ModelConfig, resume: str | os.PathLike | None = None) -> PretrainedWeights | None:
    """The weights ``model.pretrained`` names, read and validated (``None`` without it) by
    :func:`vitkit.pretrained.read_pretrained`.

    A resumed fine-tuning run restores every weight from its checkpoint, so there the architecture
    and the normalisation are read off ``resume`` (the original weights file may be gone).

    Raises:
        RecipeError: a file that is not a model of the kind named, a timm name timm lacks, weights
            that do not fit that timm model, or a timm download that failed.
    """
    if model.pretrained is None:
        return None
    if resume is not None:
        try:
            config, _, extra = read_model(resume)
        except (VitkitError, OSError):
            pass  # check_resumable names what is wrong with it
        else:
            record = extra.get("pretrained") or {"pretrained": model.pretrained}
            return PretrainedWeights.of_model_file(resume, record)
    return read_pretrained(
        model.pretrained, file=model.pretrained_file, timm_kwargs=model.pretrained_kwargs, keys=RECIPE_KEYS,
        error=RecipeError,
    )


def weights_geometry(weights: PretrainedWeights | None) -> tuple[dict[str, Any], str]:
    """The image size and channels an image folder's run takes from ``weights`` where the recipe
    leaves them unset (the size they were trained at; the channels of a vitkit model file, while
    RGB timm weights adapt to gray images), and the weights' name for the note that says so."""
    if weights is None:
        return {}, ""
    height, width = weights.config.img_size
    geometry: dict[str, Any] = {"img_size": height if height == width else (height, width)}
    if not str(weights.record.get("pretrained", "")).startswith("timm:"):
        geometry["in_chans"] = weights.config.in_chans
    return geometry, weights.description


def pretrained_data(data: DataConfig, weights: PretrainedWeights) -> tuple[DataConfig, str]:
    """``data`` normalised as the weights saw images (their mean, std and interpolation), unless
    the recipe sets them, and a ``note:`` line saying what was used. Statistics of 3-channel
    weights become their average for 1-channel data (the adapted filters sum the channels)."""
    channels = data.resolved_in_chans()
    used: dict[str, Any] = {}
    for key in ("mean", "std"):
        values = weights.preprocessing.get(key)
        if getattr(data, key) is None and values is not None:
            values = tuple(float(v) for v in values)
            used[key] = (sum(values) / len(values),) if channels == 1 and len(values) != 1 else values
    interpolation = weights.preprocessing.get("interpolation")
    if data.interpolation is None and interpolation is not None:
        used["interpolation"] = interpolation
    data = dataclasses.replace(data, **used)
    if used:
        said = ", ".join(f"{key} {_shown(value)}" for key, value in used.items())
        note = f"note: data normalised as {weights.description} was trained: {said} (set data.mean / data.std to change)."
    elif all(_same(getattr(data, key), weights.preprocessing.get(key), channels) for key in ("mean", "std")):
        note = f"note: data normalised by the recipe's data.mean / data.std, the same as {weights.description}'s."
    else:
        note = f"note: data normalised by the recipe's own data.mean / data.std, not {weights.description}'s."
    return data, note


def _same(ours: Any, theirs: Any, channels: int) -> bool:
    """Whether the recipe's statistics equal the weights' (their average for 1-channel data)."""
    if ours is None or theirs is None:
        return ours is None and theirs is None
    theirs = [float(v) for v in theirs]
    theirs = [sum(theirs) / len(theirs)] if channels == 1 and len(theirs) != 1 else theirs
    return len(ours) == len(theirs) and all(abs(a - b) < 1e-6 for a, b in zip(ours, theirs))


def _shown(value: Any) -> str:
    return "[" + ", ".join(f"{v:.4g}" for v in value) + "]" if isinstance(value, tuple) else str(value)


def build_model(config: RecipeConfig, info: DataInfo, weights: PretrainedWeights | None) -> tuple[nn.Module, ViTConfig]:
    """The model ``config`` trains on data ``info`` and its :class:`ViTConfig`: a fresh variant, or
    ``weights`` adapted to the data; frozen, given LoRA adapters and gradient-checkpointed as the
    recipe says; timm's own
    ``VisionTransformer`` for ``model.impl: timm``.

    Raises:
        RecipeError: a recipe field that contradicts the weights, or weights the data cannot use.
    """
    # a task that releases an encoder trains a headless one (its own heads are the task's parts)
    num_classes = 0 if config.task.task_class.releases_encoder else info.num_classes
    data_fields = {"img_size": info.img_size, "in_chans": info.in_chans, "num_classes": num_classes}
    if weights is None:
        try:
            vit_config = config.vit_config(**data_fields)
        except ValueError as error:  # sizes settled from the images (data.img_size unset) that the model cannot take
            raise RecipeError(
                f"the model cannot take the data's {info.img_size[0]}x{info.img_size[1]} images: {error} Set "
                "data.img_size (or model.patch_size) so that they fit."
            ) from None
        vitkit_model = None
    else:
        vitkit_model = adapt(weights, config.model, class_names=info.class_names, **data_fields)
        vit_config = vitkit_model.config
    if config.model.impl == "timm":
        model = timm_twin(vit_config)
        if vitkit_model is not None:
            model.load_state_dict(to_timm_state_dict(vitkit_model))
    else:
        model = vitkit_model if vitkit_model is not None else VisionTransformer(vit_config)
    try:
        check_freeze(config.model.freeze, vit_config.depth)
    except FieldError as error:
        raise RecipeError(f"model.{error.key} {error.problem}") from None
    if config.model.lora is not None:  # the adapters and the classifier train, nothing else
        freeze(model, "backbone")
        add_lora(model, config.model.lora)
    else:
        freeze(model, config.model.freeze)
    model.set_grad_checkpointing(config.model.grad_checkpointing)  # under FSDP too (inside each block's unit)
    return model, vit_config


def adapt(
    weights: PretrainedWeights, model: ModelConfig, *, img_size: tuple[int, int], in_chans: int, num_classes: int,
    class_names: Sequence[str] | None = None,
) -> VisionTransformer:
    """A vitkit model with ``weights``, fitted to the data: classes (the classifier kept when the
    data have the classes it was trained on, by count and, where the weights record them, by name,
    and ``model.reset_head`` allows; else re-initialised, distillation head too), image
    size (position embedding resampled) and channels (first-layer filters adapted); the recipe's
    free fields applied. With ``model.pretrained_weights`` false: the same model, freshly initialised.

    Raises:
        RecipeError: a recipe field that contradicts the weights.
    """
    source = weights.config
    wanted = _recipe_fields(model, source)
    contradictions = [
        f"model.{key}={_plain(wanted[key])} (the weights have {_plain(getattr(source, key))})"
        for key in sorted(wanted)
        if key not in FREE_FIELDS and _plain(wanted[key]) != _plain(getattr(source, key))
    ]
    if contradictions:
        raise RecipeError(
            f"the recipe contradicts the weights of model.pretrained={weights.record['pretrained']}: "
            f"{'; '.join(contradictions[:4])}. The weights fix the architecture: drop these keys (or model.name) "
            "from the recipe, or train from scratch without model.pretrained."
        )
    if model.reset_head is False and num_classes != source.num_classes:
        raise RecipeError(
            f"model.reset_head=false keeps the classifier of model.pretrained={weights.record['pretrained']}, which "
            f"has {source.num_classes} classes, but the data have {num_classes}: set model.reset_head=true (or leave it unset)."
        )
    chosen = model.vit_overrides()
    free = {key: value for key, value in wanted.items()
            if key in FREE_FIELDS and (key not in WEIGHTS_DEFAULT_FIELDS or chosen.get(key) is not None)}
    try:
        target = fit_config(weights, img_size=img_size, in_chans=in_chans, num_classes=num_classes, **free)
    except ValueError as error:  # a FieldError names the key
        key = getattr(error, "key", None)
        where = f"model.{key} {error.problem}" if key else str(error)
        raise RecipeError(f"{where} (fine-tuning model.pretrained={weights.record['pretrained']})") from None
    built = VisionTransformer(target)
    if not model.pretrained_weights:
        rank_zero_info(f"note: model.pretrained_weights=false: {weights.description}'s architecture and preprocessing "
                       "with fresh weights (the from-scratch baseline).")
        return built
    try:
        reset = load_pretrained(built, weights, reset_head=model.reset_head, class_names=class_names)
    except PretrainedError as error:
        raise RecipeError(f"model.pretrained: {error}") from None
    if source.use_fc_norm != target.use_fc_norm:
        rank_zero_info(f"note: the final norm moves {'after' if target.use_fc_norm else 'before'} pooling "
                       f"(model.global_pool={target.global_pool}): a new norm, {weights.description}'s dropped.")
    if reset and num_classes > 0:
        had = f"its {source.num_classes}-class classifier replaced" if source.num_classes else "it has no classifier"
        rank_zero_info(f"note: a new classifier for the data's {num_classes} classes, initialised as model.init says "
                       f"({weights.description}: {had}).")
    return built


def _recipe_fields(model: ModelConfig, source: ViTConfig) -> dict[str, Any]:
    """The ViTConfig fields the recipe sets: its overrides, and with ``model.name`` every field of
    that variant (compared with the weights' like an override), except those left unset (``None``:
    derived from the others, as ``pos_embed`` from ``rope``). A pruned model's per-layer head
    counts stand for the recipe's ``num_heads`` when no layer has more (the model it was pruned from)."""
    fields = dict(model.vit_overrides())
    if model.name is not None:  # the variant's geometry and classes are the data's to set, not the name's
        variant = {k: v for k, v in model_config(model.name).to_dict().items() if k not in DATA_DRIVEN_FIELDS}
        fields = {**variant, **fields}
    if isinstance(source.num_heads, list) and isinstance(fields.get("num_heads"), int) \
            and max(source.num_heads) <= fields["num_heads"]:
        fields.pop("num_heads")
        if fields.get("head_dim") is None:
            fields.pop("head_dim", None)
    return {key: value for key, value in fields.items() if value is not None}  # None: derived, not chosen


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value
