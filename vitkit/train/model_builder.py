"""The model a run trains, built once from the typed recipe.

Either a fresh variant (``model.name`` plus overrides), or the weights a run starts from
(:class:`StartingWeights`): another vitkit run's model file or checkpoint (a pruned model keeps its
per-layer head counts), or a timm model's weights (``model.pretrained: timm:NAME`` with
``model.pretrained_file``, or timm's own download). The weights fix the architecture; the recipe may
change only what does not contradict them (:data:`FREE_FIELDS`), and the data fix the classes, the
image size and the channels: a new class count re-initialises the classifier (as timm's
``reset_classifier``), a new image size resamples the learned position embedding (bicubic), a
new channel count adapts the first layer's filters (timm's ``adapt_input_conv``: 1-channel data
sums the RGB filters).
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import timm
import torch
from einops import rearrange
from timm.layers import resample_abs_pos_embed
from timm.models import adapt_input_conv
from torch import nn

from ..data import DataConfig, DataInfo
from ..errors import VitkitError
from ..io import read_model, read_weights_file
from ..layers import add_lora
from ..models import VisionTransformer, ViTConfig, from_timm, model_config, timm_twin, to_timm_state_dict
from ..models.timm_interop import PATCH_WEIGHT
from ..schema import FieldError
from .config import DATA_DRIVEN_FIELDS, ModelConfig, RecipeConfig
from .finetune import check_freeze, freeze
from .schema import RecipeError

#: The prefix of ``model.pretrained`` that names a timm model (``timm:deit_small_patch16_224``).
TIMM_PREFIX = "timm:"
#: ViTConfig fields a recipe may set on top of pretrained weights: regularisation, kernels, the
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
    "img_size",
    "in_chans",
    "num_classes",
)


@dataclass
class StartingWeights:
    """Weights a run starts from.

    Attributes:
        config: the architecture they describe, at their own image size, channels and classes.
        state: their state dict in vitkit's layout.
        preprocessing: how they saw images (``mean``, ``std``, ``interpolation``, ``crop_pct``
            where known), for the data's normalisation.
        record: where they came from (``pretrained``, ``pretrained_file``), saved with the run.
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


def load_starting_weights(model: ModelConfig, resume: str | os.PathLike | None = None) -> StartingWeights | None:
    """The weights ``model.pretrained`` names, read and validated (``None`` without it).

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
            config, state, extra = read_model(resume)
        except (VitkitError, OSError):
            pass  # check_resumable names what is wrong with it
        else:
            record = extra.get("pretrained") or {"pretrained": model.pretrained}
            return StartingWeights(config, state, _preprocessing(extra), record, _class_names(extra))
    if model.pretrained.startswith(TIMM_PREFIX):
        return _timm_weights(model.pretrained.removeprefix(TIMM_PREFIX), model.pretrained_file, model.pretrained_kwargs)
    config, state, extra = _read_vitkit_weights(Path(model.pretrained))
    record = {"pretrained": model.pretrained, **({"pretrained_from": extra["pretrained"]} if "pretrained" in extra else {})}
    return StartingWeights(config, state, _preprocessing(extra), record, _class_names(extra))


def _class_names(extra: dict[str, Any]) -> tuple[str, ...] | None:
    """The class names a vitkit model file records, or ``None``."""
    names = extra.get("class_names")
    return tuple(names) if names is not None else None


def _preprocessing(extra: dict[str, Any]) -> dict[str, Any]:
    """How a vitkit model file's model saw images (its saved normalisation and eval resize)."""
    return {key: extra[key] for key in ("mean", "std", "interpolation", "crop_pct") if extra.get(key) is not None}


def _read_vitkit_weights(path: Path) -> tuple[ViTConfig, dict[str, torch.Tensor], dict[str, Any]]:
    """``(config, state, extra)`` of a vitkit model file or training checkpoint."""
    if not path.is_file():
        raise RecipeError(
            f"model.pretrained: {path} does not exist; give a vitkit model file (a run's model.safetensors, "
            "a pruned model) or timm:NAME with model.pretrained_file."
        )
    try:
        return read_model(path)
    except VitkitError as error:
        raise RecipeError(
            f"model.pretrained: {error} If the file holds a timm model's weights, give "
            f"model.pretrained=timm:<timm model name> model.pretrained_file={path}."
        ) from None


def _timm_weights(name: str, file: str | None, kwargs: dict[str, Any]) -> StartingWeights:
    """A timm model's weights: from ``file`` (a state dict saved with safetensors or torch), or
    timm's own ``pretrained=True`` download when ``file`` is ``None``; ``kwargs`` go to
    ``timm.create_model`` (timm's ``--model-kwargs``)."""
    base = name.split(".")[0]
    if not timm.is_model(base):
        close = difflib.get_close_matches(base, timm.list_models(), n=1)
        hint = f" Did you mean 'timm:{close[0]}'?" if close else ""
        raise RecipeError(f"model.pretrained: timm has no model {base!r}.{hint}")
    if file is None:
        source = _create(name, kwargs, pretrained=True)
    else:
        state = read_weights_file(file, error=RecipeError, what="model.pretrained_file")
        source = _timm_model_with(name, state, file, kwargs)
    try:
        vit = from_timm(source)
    except (ValueError, RuntimeError) as error:
        raise RecipeError(f"model.pretrained: timm:{name} cannot be fine-tuned by vitkit: {error}") from None
    preprocessing = dict(vit.pretrained_cfg or {})  # the tag's pretrained_cfg, as timm.create_model resolved it
    record = {"pretrained": f"{TIMM_PREFIX}{name}", "pretrained_file": file}
    return StartingWeights(vit.config, vit.state_dict(), preprocessing, record)


def _create(name: str, kwargs: dict[str, Any], pretrained: bool = False, **more: Any) -> nn.Module:
    """``timm.create_model``, its failures (a download, an argument the model refuses) one line."""
    try:
        return timm.create_model(name, pretrained=pretrained, **{**kwargs, **more})
    except Exception as error:  # noqa: BLE001 - a download, cache or argument failure is the user's to fix
        first = str(error).strip().splitlines()
        reason = first[0] if first else type(error).__name__
        if pretrained:
            raise RecipeError(
                f"model.pretrained: timm could not download the weights of {name} ({reason}); download them where "
                "the hub is reachable and give model.pretrained_file=<the file>."
            ) from None
        raise RecipeError(f"model.pretrained_kwargs: timm cannot build {name} with {kwargs}: {reason}") from None


def _timm_model_with(name: str, state: dict[str, torch.Tensor], file: str, kwargs: dict[str, Any]) -> nn.Module:
    """timm's model ``name`` (its tag selects its ``pretrained_cfg``) holding ``state``, loaded
    strictly. The class count is read off the weights' head (0: a headless feature extractor); a
    learned position embedding of another grid is resampled to the model's, as timm's own
    checkpoint filter does."""
    head = state.get("head.weight")
    num_classes = head.shape[0] if isinstance(head, torch.Tensor) and head.dim() == 2 else 0
    model = _create(name, kwargs, num_classes=num_classes)
    table, ours = state.get("pos_embed"), getattr(model, "pos_embed", None)
    if isinstance(table, torch.Tensor) and isinstance(ours, torch.Tensor) and table.dim() == 3 \
            and table.shape != ours.shape and hasattr(model.patch_embed, "grid_size"):
        prefix = 0 if getattr(model, "no_embed_class", False) else model.num_prefix_tokens
        state = {**state, "pos_embed": resample_abs_pos_embed(table, list(model.patch_embed.grid_size), num_prefix_tokens=prefix)}
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as error:
        lines = [line.strip() for line in str(error).splitlines()[1:] if line.strip()]
        raise RecipeError(
            f"model.pretrained_file: {file} does not hold the weights of timm model {name}: "
            f"{'; '.join(lines[:2])[:400]}. Give the weights of that architecture, the timm name they belong to, or "
            "the model.pretrained_kwargs they were built with (e.g. {depth: 6})."
        ) from None
    return model.eval()


def pretrained_data(data: DataConfig, weights: StartingWeights) -> tuple[DataConfig, str]:
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
    else:
        note = f"note: data normalised by the recipe's own data.mean / data.std, not {weights.description}'s."
    return data, note


def _shown(value: Any) -> str:
    return "[" + ", ".join(f"{v:.4g}" for v in value) + "]" if isinstance(value, tuple) else str(value)


def build_model(config: RecipeConfig, info: DataInfo, weights: StartingWeights | None) -> tuple[nn.Module, ViTConfig]:
    """The model ``config`` trains on data ``info`` and its :class:`ViTConfig`: a fresh variant, or
    ``weights`` adapted to the data; frozen, given LoRA adapters and gradient-checkpointed as the
    recipe says; timm's own
    ``VisionTransformer`` for ``model.impl: timm``.

    Raises:
        RecipeError: a recipe field that contradicts the weights, or weights the data cannot use.
    """
    # a pre-training objective trains a headless encoder (its own heads are the task's parts)
    num_classes = info.num_classes if config.task.name == "classify" else 0
    data_fields = {"img_size": info.img_size, "in_chans": info.in_chans, "num_classes": num_classes}
    if weights is None:
        vit_config = config.vit_config(**data_fields)
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
    # under FSDP the strategy checkpoints the blocks (vitkit.train.distributed.fsdp_strategy)
    model.set_grad_checkpointing(config.model.grad_checkpointing and config.trainer.strategy != "fsdp")
    return model, vit_config


def adapt(
    weights: StartingWeights, model: ModelConfig, *, img_size: tuple[int, int], in_chans: int, num_classes: int,
    class_names: Sequence[str] | None = None,
) -> VisionTransformer:
    """A vitkit model with ``weights``, fitted to the data: classes (the classifier kept when the
    data have the classes it was trained on, by count and, where the weights record them, by name,
    and ``model.reset_head`` allows; else re-initialised, distillation head too), image
    size (position embedding resampled) and channels (first-layer filters adapted); the recipe's
    free fields applied.

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
    free = {key: value for key, value in wanted.items() if key in FREE_FIELDS}
    other_classes = num_classes != source.num_classes or (
        weights.class_names is not None and class_names is not None and tuple(weights.class_names) != tuple(class_names)
    )
    reset = model.reset_head if model.reset_head is not None else other_classes
    if not reset and num_classes != source.num_classes:
        raise RecipeError(
            f"model.reset_head=false keeps the classifier of model.pretrained={weights.record['pretrained']}, which "
            f"has {source.num_classes} classes, but the data have {num_classes}: set model.reset_head=true (or leave it unset)."
        )
    state = _adapt_channels(dict(weights.state), source, in_chans)
    try:
        target = source.replace(in_chans=in_chans, img_size=img_size, **free)
    except ValueError as error:  # a FieldError names the key
        key = getattr(error, "key", None)
        where = f"model.{key} {error.problem}" if key else str(error)
        raise RecipeError(f"{where} (fine-tuning model.pretrained={weights.record['pretrained']})") from None
    built = VisionTransformer(target)
    built.load_weights(state, source_grid=source.grid_size)
    if reset:
        built.reset_classifier(num_classes)
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


def _adapt_channels(state: dict[str, torch.Tensor], source: ViTConfig, in_chans: int) -> dict[str, torch.Tensor]:
    """``state`` with its first layer's filters adapted from ``source.in_chans`` to ``in_chans`` channels
    by timm's ``adapt_input_conv`` (1 channel: the filters summed over the source's channels)."""
    if in_chans == source.in_chans:
        return state
    if source.shifted_patches:
        raise RecipeError(
            f"model.pretrained: weights with shifted patch tokens take {source.in_chans}-channel images and cannot be "
            f"adapted to the data's {in_chans}: set data.in_chans={source.in_chans}."
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
