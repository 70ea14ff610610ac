"""Checkpoints written atomically and read without unpickling code.

:class:`AtomicCheckpointIO` is Lightning's checkpoint plugin: every save goes to a temporary file
beside the target that replaces it only once complete and synced (a crash mid-save keeps the previous
good file; the orphan temporary files of a killed save are removed at the next save or resume), and
every load uses ``torch.load(weights_only=True)``, which refuses pickled objects other than tensors
and plain containers. :func:`check_resumable` refuses a checkpoint that cannot continue a recipe
(model, data, or any piece of the training state) before anything is written, and
:func:`check_recipe_unchanged` a recipe that differs from the one the run started with. Reading a checkpoint
(:func:`~vitkit.io.load_checkpoint`) and rebuilding its model (:func:`vitkit.load_model`) live in
:mod:`vitkit.io`, which needs no Lightning.
"""

from __future__ import annotations

import collections
import io
import json
import os
import pathlib
import pickle
import shutil
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO
from torch.distributed.checkpoint import filesystem as dcp_filesystem
from torch.distributed.checkpoint import metadata as dcp_metadata
from torch.distributed.checkpoint.metadata import Metadata

from ..errors import VitkitError
from ..files import atomic_write, remove_unlinked_versions
from ..io import CheckpointError, UnsafeCheckpointError, first_line, load_checkpoint, upgrade_checkpoint
from ..models import ViTConfig
from ..schema import RecipeError
from .artifacts import CONFIG_FILE
from .checkpoint_format import completed_steps, non_finite_tensors, step_records
from .config import RecipeConfig, load_recipe
from .module import ViTModule

#: Key Lightning writes into every training checkpoint.
LIGHTNING_VERSION_KEY = "pytorch-lightning_version"
#: Glob of the temporary files :func:`~vitkit.files.atomic_write` (or the staging directories of
#: :func:`~vitkit.files.commit_directory`) leaves behind when killed mid-save.
ORPHAN_GLOB = ".*.ckpt.*.tmp"
#: The file of a sharded checkpoint (a directory) holding everything but the weights and optimiser
#: state: Lightning's name for it (``ModelParallelStrategy``).
SHARDED_METADATA = "meta.pt"


def is_sharded_checkpoint(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a sharded checkpoint of ``trainer.strategy=fsdp``: a directory of
    ``torch.distributed.checkpoint`` shards and :data:`SHARDED_METADATA`."""
    return Path(path).is_dir() and (Path(path) / SHARDED_METADATA).is_file()


def check_resumable(path: str | os.PathLike, module: ViTModule, dataset: str, sharded: bool = False) -> None:
    """Refuse to resume from ``path`` unless it is a readable vitkit training checkpoint that
    ``module`` can continue from: the model the recipe builds (``vit_config``: architecture, image
    size, channels, classes) on the same ``dataset``, with every piece of training state Lightning
    restores (weights of the right names and shapes, the optimiser's state for this model's parameter
    groups, the schedule, the loop counters), saved sharded (a directory) exactly when this run is
    (``sharded``: ``trainer.strategy=fsdp``). Reads only (of a sharded one, the metadata); changes nothing.

    Raises:
        FileNotFoundError, UnsafeCheckpointError, CheckpointError: the message names each difference.
    """
    path = Path(path)
    if path.suffix == ".safetensors":
        raise CheckpointError(
            f"--resume {path}: a .safetensors model file holds the weights only, without the optimiser and "
            "schedule state a run continues from; give the run's checkpoints/last.ckpt instead."
        )
    if is_sharded_checkpoint(path) != sharded:
        saved, run = ("sharded", "without") if not sharded else ("whole", "with")
        start = "its run's model.safetensors (a sharded checkpoint is read by --resume only)" if saved == "sharded" \
            else "the checkpoint"
        raise CheckpointError(
            f"--resume {path}: the checkpoint was saved {saved} ({'by' if saved == 'sharded' else 'without'} "
            f"trainer.strategy=fsdp) and this run trains {run} it; resume with the run's own trainer.strategy, or "
            f"start a new run from {start} with model.pretrained=FILE."
        )
    checkpoint = upgrade_checkpoint(load_checkpoint(path / SHARDED_METADATA if sharded else path))
    is_dict = isinstance(checkpoint, dict)
    hparams = checkpoint.get("hyper_parameters", {}) if is_dict else {}
    extra = hparams.get("extra", {}) if isinstance(hparams, dict) else None
    if not is_dict or LIGHTNING_VERSION_KEY not in checkpoint or not isinstance(hparams, dict) \
            or not isinstance(hparams.get("vit_config"), dict) or not isinstance(extra, dict):
        raise CheckpointError(
            f"--resume {path}: not a vitkit training checkpoint (no Lightning training state or model config); "
            "give the run's checkpoints/last.ckpt."
        )
    saved = {**_meaning(hparams["vit_config"]), "dataset": extra.get("dataset")}
    wanted = {**_meaning(module.hparams["vit_config"]), "dataset": dataset}
    differences = [
        f"{key} (checkpoint {saved.get(key)!r}, recipe {wanted.get(key)!r})"
        for key in sorted(set(saved) | set(wanted))
        if saved.get(key) != wanted.get(key)
    ]
    if differences:
        raise CheckpointError(
            f"--resume {path}: the checkpoint was trained with a different model or data than this recipe "
            f"builds: {'; '.join(differences)}. Resume with the run's own config.yaml (beside checkpoints/), "
            "or start a new run."
        )
    problem = _sharded_state_problem(path, checkpoint, module) if sharded else _training_state_problem(checkpoint, module)
    if problem:
        raise CheckpointError(
            f"--resume {path}: the checkpoint cannot continue this run: {problem}. It was not saved by a vitkit "
            "training run, or was edited; resume from another checkpoint, or start a new run (a model file or "
            "weights-only checkpoint can still be evaluated)."
        )


#: What Lightning restores on resume, besides the weights.
TRAINING_STATE_KEYS = ("state_dict", "optimizer_states", "lr_schedulers", "epoch", "global_step", "loops")


def _training_state_problem(checkpoint: dict[str, Any], module: ViTModule, with_optimizer: bool = True) -> str | None:
    """Why ``checkpoint`` cannot be restored into ``module`` and its optimiser, or ``None``. Compares
    names, shapes and group sizes only: nothing is copied or allocated. Without ``with_optimizer``,
    the weights only (the caller checks the optimiser state)."""
    missing = [key for key in TRAINING_STATE_KEYS if key not in checkpoint]
    if missing:
        return f"it lacks {', '.join(missing)} (a weights-only checkpoint?)"
    weights = checkpoint["state_dict"]
    if not isinstance(weights, dict):
        return "its state_dict is not a mapping of tensors"
    expected = {name: tuple(t.shape) for name, t in module.state_dict().items()}
    found = {name: tuple(t.shape) if isinstance(t, torch.Tensor) else None for name, t in weights.items()}
    wrong = [
        f"{name} (checkpoint {list(found[name]) if found.get(name) is not None else found.get(name, 'missing')}, "
        f"model {list(expected[name]) if name in expected else 'none'})"
        for name in sorted(set(expected) | set(found))
        if found.get(name, "missing") != expected.get(name, "none")
    ]
    if wrong:
        shown = "; ".join(wrong[:3]) + (f"; and {len(wrong) - 3} more" if len(wrong) > 3 else "")
        return f"its weights do not fit the model: {shown}"
    records = [record for record in step_records(checkpoint) if record is not None]
    if not records or any(completed_steps(record) is None for record in records):
        return "its loop state does not count the optimiser steps taken (no well-formed step progress)"
    if not with_optimizer:
        return None
    optimizer = module.build_optimizer()
    states, schedulers = checkpoint["optimizer_states"], checkpoint["lr_schedulers"]
    if not (isinstance(states, list) and len(states) == 1 and isinstance(states[0], dict)):
        return "it does not hold exactly one optimiser state"
    if not (isinstance(schedulers, list) and len(schedulers) == 1 and isinstance(schedulers[0], dict)):
        return "it does not hold exactly one learning-rate schedule"
    groups, state = states[0].get("param_groups"), states[0].get("state")
    ours = optimizer.param_groups
    if not (isinstance(groups, list) and isinstance(state, dict) and len(groups) == len(ours)):
        return f"its optimiser state has {len(groups) if isinstance(groups, list) else 'no'} parameter groups, this run {len(ours)}"
    params = [param for group in ours for param in group["params"]]
    for saved_group, group in zip(groups, ours):
        if not isinstance(saved_group, dict) or len(saved_group.get("params", ())) != len(group["params"]):
            return "its optimiser's parameter groups differ in size from this run's"
    ids = [index for group in groups for index in group["params"]]
    for index, param in zip(ids, params):
        for name, value in (state.get(index) or {}).items():
            if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape != param.shape:
                return f"optimiser state {name!r} of parameter {index} has shape {list(value.shape)}, the parameter {list(param.shape)}"
    return None


def _sharded_state_problem(path: Path, checkpoint: dict[str, Any], module: ViTModule) -> str | None:
    """:func:`_training_state_problem` for a sharded checkpoint: the same comparisons, made on the
    names and global shapes that its ``torch.distributed.checkpoint`` metadata lists (read without
    unpickling code, as are its non-tensor entries: :func:`read_sharded_metadata`)."""
    missing = [key for key in ("lr_schedulers", "epoch", "global_step", "loops") if key not in checkpoint]
    if missing:
        return f"its {SHARDED_METADATA} lacks {', '.join(missing)}"
    shapes = read_sharded_metadata(path)
    weights = {key.removeprefix("state_dict."): shape for key, shape in shapes.items() if key.startswith("state_dict.")}
    optimizer = {key.removeprefix("optimizer_0."): shape for key, shape in shapes.items() if key.startswith("optimizer_0.")}
    problem = _training_state_problem(
        {**checkpoint, "state_dict": {name: torch.empty(shape, device="meta") for name, shape in weights.items()},
         "optimizer_states": [{"state": {}, "param_groups": []}]},
        module, with_optimizer=False,
    )
    if problem:
        return problem
    groups = {key.split(".")[1] for key in optimizer if key.startswith("param_groups.")}
    ours = module.build_optimizer().param_groups
    if len(groups) != len(ours):
        return f"its optimiser state has {len(groups)} parameter groups, this run {len(ours)}"
    expected = {name: tuple(t.shape) for name, t in module.named_parameters()}
    for key, shape in optimizer.items():
        name, _, stat = key.removeprefix("state.").rpartition(".")
        if key.startswith("state.") and (name not in expected or (shape and tuple(shape) != expected[name])):
            return f"optimiser state {stat!r} of {name} has shape {list(shape or ())}, the parameter {list(expected.get(name, ()))}"
    return None


#: The exact globals a ``torch.distributed.checkpoint`` metadata file names (its record classes,
#: the memory-format enum, shapes, paths, dtypes and layouts), as ``module -> names``. Nothing else
#: resolves: no dotted name, no other attribute of these modules (``metadata`` imports ``os``).
_SHARDED_METADATA_CLASSES = {
    "torch.distributed.checkpoint.metadata": (
        "Metadata", "MetadataIndex", "StorageMeta", "TensorProperties", "TensorStorageMetadata",
        "BytesStorageMetadata", "ChunkStorageMetadata", "_MEM_FORMAT_ENCODING",
    ),
    "torch.distributed.checkpoint.filesystem": ("_StorageInfo",),
    "pathlib": ("PosixPath", "PurePosixPath", "Path"),
    "collections": ("OrderedDict",),
    "torch": ("Size",),
}


def _layout(name: str) -> torch.layout:
    """``torch.serialization._get_layout``'s answer (how a ``torch.layout`` pickles), looked up among
    torch's layouts only, so an unknown name is an unpickling error."""
    layouts = {str(value): value for value in vars(torch).values() if isinstance(value, torch.layout)}
    if name not in layouts:
        raise pickle.UnpicklingError(f"{name!r} is not a torch layout")
    return layouts[name]


def _sharded_metadata_globals() -> dict[tuple[str, str], Any]:
    """``(module, name) -> object`` for every global :class:`_MetadataUnpickler` resolves: the classes
    above (each checked to be a class), torch's dtypes, and :func:`_layout` for torch's layout hook."""
    modules = {"torch.distributed.checkpoint.metadata": dcp_metadata, "torch.distributed.checkpoint.filesystem": dcp_filesystem,
               "pathlib": pathlib, "collections": collections, "torch": torch}
    allowed: dict[tuple[str, str], Any] = {("torch.serialization", "_get_layout"): _layout}
    for module_name, names in _SHARDED_METADATA_CLASSES.items():
        module = modules[module_name]
        for name in names:
            value = getattr(module, name)
            if not isinstance(value, type):
                raise TypeError(f"{module_name}.{name} is not a class")  # a torch upgrade changed it: a bug
            allowed[(module_name, name)] = value
    allowed.update({("torch", name): value for name, value in vars(torch).items() if isinstance(value, torch.dtype)})
    return allowed


class _MetadataUnpickler(pickle.Unpickler):
    """Resolves only the exact ``(module, name)`` pairs of :func:`_sharded_metadata_globals`, never
    through the module's own lookup: a dotted name (protocol 4's ``os.system`` reached through a
    module attribute) or any other attribute is refused, whatever the protocol."""

    def __init__(self, handle: Any) -> None:
        super().__init__(handle)
        self._allowed = _sharded_metadata_globals()

    def find_class(self, module: str, name: str) -> Any:
        try:
            return self._allowed[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(f"global '{module}.{name}' is not allowed in a checkpoint's metadata") from None


def read_sharded_metadata(path: str | os.PathLike) -> dict[str, torch.Size | None]:
    """The entries of the sharded checkpoint ``path``: each key with the global shape of its tensor
    (``None`` for a non-tensor entry). ``torch.distributed.checkpoint`` unpickles its metadata file
    and its non-tensor entries (the optimiser's parameter groups) with no restriction; here the
    metadata is read with an allow-list and every non-tensor entry with ``weights_only=True`` first,
    so a checkpoint that would run code when loaded is refused before Lightning loads it.

    Raises:
        UnsafeCheckpointError: the metadata or an entry pickles anything else.
        CheckpointError: the metadata is missing or unreadable.
    """
    path = Path(path)
    try:
        with open(path / ".metadata", "rb") as handle:
            metadata = _MetadataUnpickler(handle).load()
        if not isinstance(metadata, Metadata):
            raise ValueError(f"its .metadata holds a {type(metadata).__name__}, not a checkpoint's Metadata")
        shapes = {key: getattr(entry, "size", None) for key, entry in metadata.state_dict_metadata.items()}
        for index, stored in metadata.storage_data.items():
            if shapes.get(index.fqn, ()) is None:  # a non-tensor entry: pickled bytes
                if Path(stored.relative_path).name != stored.relative_path or stored.relative_path in ("", ".", ".."):
                    raise ValueError(f"an entry names the file {stored.relative_path!r} outside the checkpoint")
                with open(path / stored.relative_path, "rb") as handle:
                    handle.seek(stored.offset)
                    torch.load(io.BytesIO(handle.read(stored.length)), weights_only=True)
    except pickle.UnpicklingError as error:
        raise UnsafeCheckpointError(
            f"refusing to load {path}: it contains pickled objects other than tensors and plain Python containers "
            f"({first_line(error)}); vitkit checkpoints never do, so it is not loaded."
        ) from None
    except (OSError, EOFError, AttributeError, RuntimeError, ValueError, TypeError, KeyError, IndexError,
            OverflowError) as error:  # malformed records: what unpickling allowed classes with wrong values raises
        raise CheckpointError(f"{path} is not a readable sharded checkpoint ({first_line(error)}).") from None
    return shapes


def _meaning(values: dict[str, Any]) -> dict[str, Any]:
    """A model config as JSON would give it back (tuples as lists), with every field a config
    written before that field existed leaves to its default, and the position embedding an unset
    ``pos_embed`` means, for comparison."""
    plain = json.loads(json.dumps(values))
    try:
        config = ViTConfig.from_dict(plain)
    except ValueError:  # an invalid config differs anyway; the comparison names it
        return plain
    return {**config.to_dict(), "pos_embed": config.resolved_pos_embed}


def remove_orphan_temp_files(folder: str | os.PathLike, pattern: str = ORPHAN_GLOB) -> list[Path]:
    """Delete the temporary files a save killed mid-write left in ``folder``: ``.<name>.ckpt.<random>.tmp``
    (``pattern``: another glob, e.g. every ``.*.tmp`` of :func:`~vitkit.io.atomic_write`), the
    staging directories of a killed sharded save, and the versions of a sharded checkpoint that its
    link no longer names (:func:`~vitkit.files.commit_directory`)."""
    orphans = [path for path in Path(folder).glob(pattern) if path.is_file() or path.is_symlink() or path.is_dir()]
    for orphan in orphans:
        if orphan.is_dir() and not orphan.is_symlink():
            shutil.rmtree(orphan, ignore_errors=True)
        else:
            orphan.unlink(missing_ok=True)
    for link in Path(folder).glob("*.ckpt"):
        if link.is_symlink():
            orphans += remove_unlinked_versions(link)
    return orphans


def newest_finite_checkpoint(folder: str | os.PathLike) -> Path | None:
    """The most recently written ``*.ckpt`` in ``folder`` whose weights and optimiser state are all
    finite (loaded to check), or ``None``. A sharded one is finite by construction: its save is
    refused on every rank when any rank's shards are not (``ViTModule.on_save_checkpoint``)."""
    for candidate in sorted(Path(folder).glob("*.ckpt"), key=lambda p: p.stat().st_mtime, reverse=True):
        if is_sharded_checkpoint(candidate):
            return candidate
        try:
            checkpoint = load_checkpoint(candidate)
        except VitkitError:
            continue
        if not non_finite_tensors(checkpoint):
            return candidate
    return None


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning checkpoint IO: atomic saves (temp file beside the target, fsync, ``os.replace``),
    ``weights_only`` loads.

    Kept instead of Lightning's own save (2.6: ``_atomic_save``): that one serialises the whole
    checkpoint into memory, then commits an fsspec transaction whose temporary file is made in the
    system temp folder and moved with ``shutil.move``; when that folder is another filesystem (a
    tmpfs ``/tmp``), the move copies into the target in place, so a kill mid-copy leaves a truncated
    checkpoint, and nothing is fsynced."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | os.PathLike, storage_options: Any = None) -> None:
        remove_orphan_temp_files(Path(path).parent)
        atomic_write(path, lambda tmp: torch.save(checkpoint, tmp))

    def load_checkpoint(
        self, path: str | os.PathLike, map_location: Any = None, weights_only: bool | None = None
    ) -> dict[str, Any]:
        return upgrade_checkpoint(load_checkpoint(path, map_location=map_location or "cpu"))


#: Recipe keys a resumed run may change: how long and on what it runs, not what it learns.
RESUME_MAY_CHANGE = frozenset({
    "trainer.max_epochs", "trainer.enable_progress_bar", "trainer.num_threads", "trainer.log_every",
    "trainer.devices", "trainer.accelerator", "trainer.num_nodes", "trainer.strategy", "data.num_workers",
    "trainer.checkpoint_every_n_steps",
})


def check_recipe_unchanged(config: RecipeConfig, run_dir: Path | None, filled: set[str] = frozenset()) -> None:
    """Refuse to continue in ``run_dir`` with a recipe that differs from the one it started with
    (its ``config.yaml``) other than in :data:`RESUME_MAY_CHANGE`: an edited learning rate, batch
    size or augmentation would otherwise be adopted silently and the run's record rewritten.
    ``filled``: keys the recipe left unset that the weights filled in this time (a resumed run reads
    them off its checkpoint, which may know one the original weights did not): unset there is no change."""
    saved_path = None if run_dir is None else run_dir / CONFIG_FILE
    if saved_path is None or not saved_path.is_file():
        return
    saved, now = _dotted(load_recipe(saved_path).to_dict()), _dotted(config.to_dict())
    # A change to or from null is a change (optim.clip_grad=null stops clipping). Values that
    # pretrained weights fill in (data.mean, data.std) are filled on both sides: config.yaml
    # records them, and a resumed run reads them off its checkpoint.
    changed = [key for key in sorted(set(saved) | set(now))
               if saved.get(key) != now.get(key) and key not in RESUME_MAY_CHANGE and not key.startswith("output.")
               and not (key in filled and saved.get(key) is None)]
    if changed:
        shown = "; ".join(f"{key} {saved.get(key)!r} -> {now.get(key)!r}" for key in changed[:3])
        more = f" and {len(changed) - 3} more" if len(changed) > 3 else ""
        raise RecipeError(
            f"the recipe differs from the one {run_dir} started with: {shown}{more}; resume with the run's own "
            f"recipe (vitkit train {saved_path} --resume CHECKPOINT, trainer.max_epochs=N to extend it), or start a "
            "new run from the checkpoint with model.pretrained=CHECKPOINT."
        )


def _dotted(values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, dict) and value:
            flat.update(_dotted(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat
