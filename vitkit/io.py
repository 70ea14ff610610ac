"""Model files: safetensors weights plus a JSON config, and training checkpoints, read without
unpickling code and without Lightning.

:func:`load_model` is the one loader: it reads a ``.safetensors`` file written by :func:`save_model`
or a Lightning ``.ckpt`` written by a training run (``torch.load(weights_only=True)``: tensors and
plain containers only), through one validation path (:func:`~vitkit.model_extra.check_extra`,
:func:`check_tensor_shapes`) before any weight is copied; weights with NaN or infinity are refused
(:func:`check_finite`), as are those of :func:`read_weights_file`.
"""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from .errors import VitkitError
from .files import atomic_write, path_kind
from .layers.lora import LoraError, merge_lora_state_dict
from .model_extra import EXTRA_KEY, check_extra
from .models.config import ViTConfig
from .models.vision_transformer import VisionTransformer
from .preprocessing import preprocessing_extra
from .schema import ConfigError

FORMAT_KEY = "vitkit_format"
#: The suffix :func:`save_model` gives a path that has none.
MODEL_SUFFIX = ".safetensors"
CONFIG_KEY = "vitkit_config"
#: The model-file format: "1" before ``pos_drop_rate`` and RoPE's patch-only absolute embedding,
#: "2" since. Files and checkpoints of an older format are upgraded as they are read (:func:`upgrade`).
FORMAT_VERSION = "3"
#: State-dict prefixes of the trained weights and of their EMA inside a training checkpoint: the
#: LightningModule (:class:`vitkit.train.module.ViTModule`) saves its ``model`` and its EMA copy
#: under them, and this module reads them back without importing Lightning.
MODEL_PREFIX = "model."
EMA_PREFIX = "ema.module."
#: The hyper-parameter of a training checkpoint that names the state-dict prefix of the model its
#: run releases (``model.safetensors``: the EMA copy, DINO's teacher): the checkpoint reads as it.
RELEASED_KEY = "released_prefix"


class ModelFileError(ConfigError):
    """A model file that is not a readable vitkit model (the message names the file)."""


class UnsafeCheckpointError(VitkitError, pickle.UnpicklingError):
    """A checkpoint holds pickled objects that could run code; it is not loaded."""


class CheckpointError(VitkitError, ValueError):
    """A checkpoint is unreadable (truncated, not a checkpoint) or does not fit the recipe."""


def save_model(model: VisionTransformer, path: str | os.PathLike, extra: dict[str, Any] | None = None) -> Path:
    """Write ``model`` to ``path`` (``.safetensors``): weights, its :class:`ViTConfig` (per-layer
    head counts included, so pruned models reload) and ``extra`` JSON metadata (for example the
    input normalisation and class names), atomically. A model that carries timm's preprocessing
    (``model.pretrained_cfg``, recorded by :func:`vitkit.from_timm`) has it written too (mean,
    std, image size, channels, crop, interpolation, classes named by index); the keys of ``extra``
    win. LoRA adapters are merged into the written weights (``model`` keeps them), so the file
    loads as a plain model. A ``path`` without a suffix gets ``.safetensors`` (``save_model(m,
    "pruned")`` writes ``pruned.safetensors``, which :func:`load_model` finds by either name);
    returns the path written."""
    path = Path(path)
    if not path.suffix:
        path = path.with_name(path.name + MODEL_SUFFIX)
    state = {name: tensor.detach().contiguous().cpu() for name, tensor in merge_lora_state_dict(model.state_dict()).items()}
    config = model.config.replace(num_heads=model.heads_per_layer(), head_dim=model.config.resolved_head_dim())
    cfg = getattr(model, "pretrained_cfg", None)
    carried = preprocessing_extra(cfg, config.num_classes) if cfg else {}
    metadata = {
        FORMAT_KEY: FORMAT_VERSION,
        CONFIG_KEY: json.dumps(config.to_dict()),
        EXTRA_KEY: json.dumps({**carried, **(extra or {})}),
    }
    return atomic_write(path, lambda tmp: save_file(state, tmp, metadata=metadata))


def read_model_file(path: str | os.PathLike) -> tuple[ViTConfig, dict[str, Any], dict[str, Any]]:
    """``(config, state_dict, extra)`` of a file written by :func:`save_model`. The metadata is
    validated (config fields, types and ranges like a recipe's; ``extra``'s class names and
    normalisation) before any tensor is read.

    Raises:
        FileNotFoundError: no such file.
        ModelFileError: not a safetensors file, not written by vitkit, or invalid metadata.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"model file {path} {path_kind(path)}; expected a file written by vitkit.save_model.")
    try:
        with safe_open(str(path), framework="pt") as handle:
            metadata = handle.metadata() or {}
            values, extra = _read_metadata(metadata, path)
            shapes = {key: tuple(handle.get_slice(key).get_shape()) for key in handle.keys()}
            version = metadata.get(FORMAT_KEY, "1")
            config = _config(upgrade(values, version), f"the metadata of model file {path}", ModelFileError)
            extra = check_extra(extra, config, f"the metadata of model file {path}", ModelFileError)
            check_tensor_shapes(config, upgraded_shapes(shapes, config, version), f"model file {path}", ModelFileError)
            state = upgrade_state({key: handle.get_tensor(key) for key in handle.keys()}, config, version)
    except ModelFileError:
        raise
    except (SafetensorError, OSError, ValueError) as error:
        raise ModelFileError(
            f"{path} is not a readable safetensors file ({error}); vitkit model files are written by "
            "vitkit.save_model (a training run, vitkit train, writes model.safetensors beside its checkpoints)."
        ) from None
    return config, state, extra


def _read_metadata(metadata: dict[str, str], path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The config and ``extra`` JSON objects of a model file's metadata, as written."""
    if CONFIG_KEY not in metadata:
        raise ModelFileError(f"{path} has no vitkit config in its metadata; was it written by vitkit.save_model?")
    if metadata.get(FORMAT_KEY, "1") not in FORMAT_VERSIONS:
        raise ModelFileError(
            f"{path} is a vitkit model file of format {metadata[FORMAT_KEY]!r}, newer than this vitkit reads "
            f"({FORMAT_VERSION}); upgrade vitkit."
        )
    return metadata_object(metadata[CONFIG_KEY], CONFIG_KEY, path), metadata_object(metadata.get(EXTRA_KEY, "{}"), EXTRA_KEY, path)


def _config(values: dict[str, Any], source: str, error: type[ConfigError]) -> ViTConfig:
    return ViTConfig.from_dict(values, source=source, error=error)


#: Every format :func:`upgrade` reads, oldest first.
FORMAT_VERSIONS = ("1", "2", FORMAT_VERSION)


def _older_than(version: str, than: str) -> bool:
    return FORMAT_VERSIONS.index(version) < FORMAT_VERSIONS.index(than)


def upgrade(values: Any, version: str) -> Any:
    """The config dict of a model file or checkpoint of format ``version`` in today's layout
    (format :data:`FORMAT_VERSION`), so that the model is rebuilt as it was trained. The one place
    that knows old layouts: the model code reads today's only.

    Format 1 to 2: ``drop_rate`` also dropped the position-embedded tokens (now ``pos_drop_rate``);
    ``pos_embed`` was always explicit, and with RoPE a ``learn`` table had rows for the prefix
    tokens (now folded into the tokens by :func:`upgrade_state`); options that did nothing
    (``rope_axes`` of mixed RoPE, ``rope_theta`` without RoPE, ``no_embed_class`` without an
    absolute table) are removed, which changes no output.
    Format 2 to 3: ``locality_attention`` is named ``locality``.

    Args:
        values: the config as written (anything else is returned as is, for the validation to refuse).
        version: the file's format (one of :data:`FORMAT_VERSIONS`).
    """
    if not isinstance(values, dict) or version == FORMAT_VERSION:
        return values
    values = dict(values)
    if version == "1":
        values.setdefault("pos_drop_rate", values.get("drop_rate", 0.0))
        values.setdefault("pos_embed", "learn")
        rope = values.get("rope", "none")
        if rope == "none":
            values.pop("rope_theta", None)
        if rope != "axial":
            values.pop("rope_axes", None)
        if values["pos_embed"] == "none" or rope != "none":
            values.pop("no_embed_class", None)  # without a table it did nothing; with RoPE it is implied
    if "locality_attention" in values:
        values["locality"] = values.pop("locality_attention")
    return values


def upgraded_shapes(shapes: dict[str, tuple[int, ...]], config: ViTConfig, version: str) -> dict[str, tuple[int, ...]]:
    """The tensor names and shapes :func:`upgrade_state` turns ``shapes`` into (worked out on the
    meta device, so nothing is allocated)."""
    meta = {name: torch.empty(shape, device="meta") for name, shape in shapes.items() if "not a tensor" not in shape}
    upgraded = upgrade_state(meta, config, version)
    kept = {name: shape for name, shape in shapes.items() if name not in meta}  # refused by the shape check
    return {**kept, **{name: tuple(tensor.shape) for name, tensor in upgraded.items()}}


def upgrade_state(state: dict[str, torch.Tensor], config: ViTConfig, version: str) -> dict[str, torch.Tensor]:
    """``state`` (weights of a model file or checkpoint of format ``version``) in the layout of
    ``config``'s model.

    Format 1: a RoPE model's learned ``pos_embed`` with prefix-token rows has them added to the
    tokens they belong to, which is the same model (a token and its constant embedding are summed
    before the first block).
    Formats 1 and 2: Locality Self-Attention kept one per-layer scalar ``attn.log_scale`` (log
    space); today's per-head ``attn.temperature [H]`` holding ``exp(log_scale)`` on every head is
    the same function.
    """
    if version == FORMAT_VERSION:
        return state
    state = dict(state)
    heads = config.heads_per_layer()
    for name in [name for name in state if name.endswith(".attn.log_scale") and state[name].dim() == 0]:
        parts = name.split(".")
        if parts[0] == "blocks" and len(parts) == 4 and parts[1].isdigit() and int(parts[1]) < len(heads):
            state[name.removesuffix("log_scale") + "temperature"] = state.pop(name).exp().expand(heads[int(parts[1])]).clone()
        # any other log_scale is left as it is, for the shape check to name
    table = state.get("pos_embed")
    prefix = config.num_prefix_tokens
    if config.rope == "none" or table is None or table.dim() != 3 or table.shape[1] != prefix + config.num_patches \
            or not prefix:
        return state
    tokens = [(name, count) for name, count in (("cls_token", int(config.class_token)),
                                                ("dist_token", int(config.distilled)), ("reg_token", config.reg_tokens))
              if count]
    if any(state.get(name) is None or tuple(state[name].shape) != (1, count, table.shape[2]) for name, count in tokens):
        return state  # a damaged file: the shape check names the missing or misshapen token
    state["pos_embed"] = table[:, prefix:]
    rows = iter(table[:, :prefix].split(1, dim=1))
    for name, count in tokens:
        state[name] = state[name] + torch.cat([next(rows) for _ in range(count)], dim=1)
    return state


def upgrade_checkpoint(checkpoint: Any) -> Any:
    """A Lightning training checkpoint of an older format in today's layout, so that it resumes:
    its model config (:func:`upgrade`), the weights of the model and of its EMA copy
    (:func:`upgrade_state`) and, before format 3, the optimizer's two weight-decay groups, which
    vitkit kept in its own order (decayed first) where today's follow timm's (decayed second).
    A checkpoint of today's format, or one that is no vitkit checkpoint, is returned as is."""
    hparams = checkpoint.get("hyper_parameters") if isinstance(checkpoint, dict) else None
    if not isinstance(hparams, dict) or not isinstance(hparams.get("vit_config"), dict):
        return checkpoint
    version = str(hparams.get(FORMAT_KEY, "1"))
    if version not in FORMAT_VERSIONS or version == FORMAT_VERSION:
        return checkpoint
    values = upgrade(hparams["vit_config"], version)
    config = _config(values, "the hyper-parameters of a checkpoint", CheckpointError)
    checkpoint = {**checkpoint, "hyper_parameters": {**hparams, "vit_config": values, FORMAT_KEY: FORMAT_VERSION}}
    weights = checkpoint.get("state_dict")
    if isinstance(weights, dict):
        upgraded = dict(weights)
        for prefix in (MODEL_PREFIX, EMA_PREFIX):
            part = {k[len(prefix):]: v for k, v in weights.items() if isinstance(k, str) and k.startswith(prefix)}
            for key in part:
                del upgraded[prefix + key]
            upgraded.update({prefix + k: v for k, v in upgrade_state(part, config, version).items()})
        checkpoint["state_dict"] = upgraded
    if _older_than(version, "3"):  # anything but lists is left as it is, for check_resumable to name
        states, schedules = checkpoint.get("optimizer_states", []), checkpoint.get("lr_schedulers", [])
        if isinstance(states, list):
            checkpoint["optimizer_states"] = [_timm_group_order(state) for state in states]
        if isinstance(schedules, list):
            checkpoint["lr_schedulers"] = [_timm_group_order_of_schedule(s) for s in schedules]
    return checkpoint


def _decayed_first(groups: Any) -> bool:
    """Two weight-decay groups in vitkit's former order: decayed, then undecayed (each a mapping
    with a list of integer ``params``: a damaged group is never reordered)."""
    if not (isinstance(groups, list) and len(groups) == 2 and all(
            isinstance(group, dict) and isinstance(group.get("params"), list)
            and all(isinstance(p, int) for p in group["params"])
            and isinstance(group.get("weight_decay", 0), (int, float)) for group in groups)):
        return False
    return groups[0].get("weight_decay", 0) > 0 and groups[1].get("weight_decay", 0) == 0


def _timm_group_order(state: Any) -> Any:
    """An AdamW ``state_dict`` whose two groups are swapped into timm's order, its per-parameter
    state renumbered to match (torch numbers the parameters group by group)."""
    if not isinstance(state, dict) or not _decayed_first(state.get("param_groups", [])):
        return state
    first, second = state["param_groups"]
    order = [*second["params"], *first["params"]]
    renumber = {old: new for new, old in enumerate(order)}
    if not isinstance(state.get("state", {}), dict) or not set(state.get("state", {})) <= set(renumber):
        return state
    groups = [
        {**second, "params": [renumber[p] for p in second["params"]]},
        {**first, "params": [renumber[p] for p in first["params"]]},
    ]
    return {**state, "param_groups": groups, "state": {renumber[p]: v for p, v in state.get("state", {}).items()}}


def _timm_group_order_of_schedule(state: Any) -> Any:
    """A learning-rate scheduler's ``state_dict`` with its per-group lists swapped alike."""
    if not isinstance(state, dict):
        return state
    return {key: value[::-1] if key in ("base_lrs", "_last_lr") and isinstance(value, list) and len(value) == 2
            else value for key, value in state.items()}


def shape_mismatches(expected: dict[str, tuple[int, ...]], found: dict[str, tuple[int, ...]]) -> str:
    """Up to three of the tensors that differ between ``expected`` and ``found`` (name -> shape),
    missing, unexpected or misshapen, joined for an error message; ``""`` when they match."""
    problems = [f"{name} missing" for name in expected if name not in found]
    problems += [f"unexpected {name}" for name in found if name not in expected]
    problems += [
        f"{name} is {list(found[name])}, the model needs {list(shape)}"
        for name, shape in expected.items()
        if name in found and found[name] != shape
    ]
    more = f"; and {len(problems) - 3} more" if len(problems) > 3 else ""
    return "; ".join(problems[:3]) + more if problems else ""


def check_tensor_shapes(
    config: ViTConfig, shapes: dict[str, tuple[int, ...]], source: str, error: type[ConfigError]
) -> None:
    """Refuse tensors that are not exactly those ``config``'s model holds (names and shapes),
    before anything is allocated: the expected shapes come from the model built on the ``meta``
    device, which holds no memory. A ``sincos`` model's fixed ``pos_embed`` may be present or not.

    Raises:
        ``error``: naming up to three missing, unexpected or misshapen tensors.
    """
    with torch.device("meta"):
        expected = {name: tuple(t.shape) for name, t in VisionTransformer(config).state_dict().items()}
    if config.resolved_pos_embed == "sincos":
        shapes = {name: shape for name, shape in shapes.items() if name != "pos_embed"}
    shown = shape_mismatches(expected, shapes)
    if shown:
        raise error(
            f"the tensors of {source} do not match its model config: {shown}. The file is damaged or its "
            "weights and config come from different models."
        )


def metadata_object(text: str, key: str, path: Path) -> dict[str, Any]:
    """The JSON object stored under metadata ``key`` of model file ``path`` (a ``.safetensors`` or
    an exported ``.onnx`` file).

    Raises:
        ModelFileError: not JSON (nested too deeply, an integer of over 4,300 digits), or not an object.
    """
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as error:  # ValueError: also an integer of over 4300 digits
        reason = error.msg if isinstance(error, json.JSONDecodeError) else str(error) if isinstance(error, ValueError) \
            else "nested too deeply"
        raise ModelFileError(
            f"model file {path}: its metadata {key!r} is not valid JSON ({reason}); the file is damaged or was "
            "not written by vitkit.save_model."
        ) from None
    if not isinstance(value, dict):
        raise ModelFileError(
            f"model file {path}: its metadata {key!r} must be a JSON object, got {type(value).__name__}."
        )
    return value


def read_model(path: str | os.PathLike) -> tuple[ViTConfig, dict[str, torch.Tensor], dict[str, Any]]:
    """``(config, state_dict, extra)`` of a vitkit ``.safetensors`` model file
    (:func:`read_model_file`) or a training ``.ckpt`` (:func:`read_training_checkpoint`).

    Raises:
        FileNotFoundError: no such file.
        ModelFileError, CheckpointError, UnsafeCheckpointError: unreadable or invalid; the message names the file.
    """
    path = Path(path)
    if path.suffix == ".safetensors":
        (config, state, extra), source, error = read_model_file(path), f"model file {path}", ModelFileError
    elif path.suffix == ".ckpt":
        (config, state, extra), source, error = read_training_checkpoint(path), f"checkpoint {path}", CheckpointError
    else:
        raise CheckpointError(f"{path}: expected a .safetensors model file or a training .ckpt checkpoint.")
    check_floating_point(state, config, source, error)
    check_finite(state, source, error)
    return config, state, extra


def check_floating_point(state: dict[str, Any], config: ViTConfig, source: str, error: type[VitkitError]) -> None:
    """Refuse a tensor that is not floating point where ``config``'s model holds floating-point
    weights: loading would cast it silently (a header relabelling float32 bytes as ``I32`` gives
    weights near 1e9). The model's dtypes come from the model built on the ``meta`` device.

    Raises:
        ``error``: naming ``source``, the first such tensor and its dtype.
    """
    with torch.device("meta"):
        expected = VisionTransformer(config).state_dict()
    for name, tensor in state.items():
        if name in expected and expected[name].is_floating_point() and not tensor.is_floating_point():
            raise error(
                f"{source}: tensor {name!r} is {str(tensor.dtype).removeprefix('torch.')}, but the model's {name} "
                "holds floating-point weights; the file is damaged or was not written by vitkit."
            )


def check_finite(state: dict[str, torch.Tensor], source: str, error: type[VitkitError]) -> None:
    """Refuse weights holding NaN or infinity (a diverged run, a damaged file): every output of the
    model would be NaN. Every weights file vitkit reads passes here.

    Raises:
        ``error``: naming ``source`` and the first tensor that holds a non-finite value.
    """
    for name, tensor in state.items():
        if not tensor.is_floating_point() or bool(torch.isfinite(tensor.sum(dtype=torch.float32))):
            continue  # a sum screens several times faster than isfinite; an overflowing one is checked exactly
        if not bool(torch.isfinite(tensor).all()):
            bad = int((~torch.isfinite(tensor)).sum())
            kind = "NaN" if bool(torch.isnan(tensor).any()) else "infinite"
            raise error(
                f"{source}: tensor {name!r} holds {bad} {kind} value(s) of {tensor.numel()}; the weights are "
                "damaged (a diverged training run?), use another file or checkpoint."
            )


def load_model_and_extra(path: str | os.PathLike, **overrides: Any) -> tuple[VisionTransformer, dict[str, Any]]:
    """The model of :func:`load_model` and the ``extra`` metadata saved with it (normalisation,
    class names, image size, the training data options; ``DataInfo.from_extra(extra)`` gives the
    preprocessing). ``path`` may leave out the ``.safetensors`` that :func:`save_model` added."""
    path = Path(path)
    if not path.exists() and not path.suffix and path.with_name(path.name + MODEL_SUFFIX).is_file():
        path = path.with_name(path.name + MODEL_SUFFIX)
    config, state, extra = read_model(path)
    model = VisionTransformer(config.replace(**overrides))
    model.load_weights(state, source_grid=config.grid_size)
    return model, extra


def load_model(path: str | os.PathLike, **overrides: Any) -> VisionTransformer:
    """Rebuild a model from a ``.safetensors`` file written by :func:`save_model` or from a training
    ``.ckpt`` (the model its run releases: the EMA weights when kept, DINO's teacher). ``overrides`` change fields that keep the
    weights' shapes (``attn_impl``, ``drop_path_rate``, ``dynamic_img_size``) or ``img_size``, for
    which the position embedding is resampled bicubically. Never unpickles code and never imports
    Lightning."""
    return load_model_and_extra(path, **overrides)[0]


def load_checkpoint(path: str | os.PathLike, map_location: Any = "cpu") -> dict[str, Any]:
    """``torch.load(path, weights_only=True)`` with clear errors for a missing or unsafe file.

    Raises:
        FileNotFoundError: no file at ``path``.
        UnsafeCheckpointError: the file pickles something other than tensors and plain containers.
        CheckpointError: the file is truncated or not a PyTorch checkpoint, or ``path`` is a
            directory (a sharded checkpoint).
    """
    path = Path(path)
    if path.is_dir():
        raise CheckpointError(
            f"{path} is a directory: a sharded checkpoint of a trainer.strategy=fsdp run is one, and only that "
            "run's --resume reads it; every other tool takes the run's model.safetensors (the full weights)."
        )
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} {path_kind(path)}; expected a .ckpt file of a training run.")
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as error:
        raise UnsafeCheckpointError(
            f"refusing to load {path}: it contains pickled objects other than tensors and plain Python "
            f"containers ({first_line(error)}). vitkit checkpoints never do, so the file was not written by "
            "vitkit or has been tampered with; it is not loaded because unpickling it could run arbitrary code."
        ) from None
    except (RuntimeError, EOFError, KeyError, ValueError) as error:
        raise CheckpointError(
            f"{path} is not a readable PyTorch checkpoint: it is truncated or corrupt ({first_line(error)}); "
            "use another checkpoint of the run (checkpoints/last.ckpt or best.ckpt)."
        ) from None


def read_weights_file(
    path: str | os.PathLike, error: type[VitkitError] = CheckpointError, what: str = "weights file"
) -> dict[str, torch.Tensor]:
    """A state dict saved with safetensors (``.safetensors``) or ``torch.save`` (``.pth``, ``.bin``,
    ... read with ``weights_only=True``, so no pickled code runs), e.g. a timm model's weights.

    Raises:
        ``error``: the file is missing, unreadable, unsafe or holds no mapping of tensors; the
            message starts with ``what`` and names the file.
    """
    path = Path(path)
    if not path.is_file():
        raise error(f"{what}: {path} {path_kind(path)}; expected a weights file.")
    if path.suffix == ".safetensors":
        try:
            with safe_open(str(path), framework="pt") as handle:
                state = {key: handle.get_tensor(key) for key in handle.keys()}
        except (SafetensorError, OSError, ValueError) as problem:
            raise error(f"{what}: {path} is not a readable safetensors file ({first_line(problem)}).") from None
        check_finite(state, f"{what} {path}", error)
        return state
    try:
        state = load_checkpoint(path)
    except VitkitError as problem:
        raise error(f"{what}: {problem}") from None
    if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
        state = state["state_dict"]  # a checkpoint that wraps its weights
    if not isinstance(state, dict) or not state or not all(
        isinstance(key, str) and isinstance(value, torch.Tensor) for key, value in state.items()
    ):
        raise error(f"{what}: {path} holds no state dict (a mapping of parameter names to tensors).")
    check_finite(state, f"{what} {path}", error)
    return state


def first_line(error: BaseException) -> str:
    """The first line of ``error``'s message (its type's name without one), for a one-line error."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def released_prefix(hparams: dict[str, Any], weights: dict[str, Any]) -> str:
    """The state-dict prefix of the model a checkpoint's run releases: the one its hyper-parameters
    name (:data:`RELEASED_KEY`), else (checkpoints written before they named it) the EMA copy when
    kept, else the trained model."""
    def held(prefix: Any) -> bool:
        return isinstance(prefix, str) and any(isinstance(key, str) and key.startswith(prefix) for key in weights)

    recorded = hparams.get(RELEASED_KEY)
    return recorded if held(recorded) else EMA_PREFIX if held(EMA_PREFIX) else MODEL_PREFIX


def read_training_checkpoint(path: str | os.PathLike) -> tuple[ViTConfig, dict[str, torch.Tensor], dict[str, Any]]:
    """Config, weights (of the model its run releases: :func:`released_prefix`) and ``extra`` of a
    training checkpoint (the ``vit_config`` and ``extra`` hyper-parameters and the ``state_dict`` Lightning writes), validated as a model
    file's are (:func:`check_extra`, :func:`check_tensor_shapes`)."""
    path = Path(path)
    checkpoint = load_checkpoint(path)
    hparams = checkpoint.get("hyper_parameters") if isinstance(checkpoint, dict) else None
    weights = checkpoint.get("state_dict") if isinstance(checkpoint, dict) else None
    if not isinstance(hparams, dict) or not isinstance(hparams.get("vit_config"), dict) or not isinstance(weights, dict):
        raise CheckpointError(f"{path} is not a vitkit training checkpoint (no model config in its hyper-parameters).")
    source = f"the hyper-parameters of checkpoint {path}"
    version = hparams.get(FORMAT_KEY, "1")
    if version not in FORMAT_VERSIONS:
        raise CheckpointError(f"{path} is a vitkit checkpoint of format {version!r}, newer than this vitkit reads; upgrade vitkit.")
    prefix = released_prefix(hparams, weights)
    state = {key[len(prefix):]: value for key, value in weights.items() if isinstance(key, str) and key.startswith(prefix)}
    try:
        state = merge_lora_state_dict(state)  # a LoRA run's adapters folded into the weights they adapt
    except LoraError as problem:
        raise CheckpointError(f"checkpoint {path}: {problem}") from None
    shapes = {key: tuple(value.shape) if isinstance(value, torch.Tensor) else ("not a tensor",) for key, value in state.items()}
    config = _config(upgrade(hparams["vit_config"], version), source, CheckpointError)
    extra = check_extra(hparams.get("extra", {}), config, source, CheckpointError)
    check_tensor_shapes(config, upgraded_shapes(shapes, config, version), f"checkpoint {path}", CheckpointError)
    return config, upgrade_state(state, config, version), extra
