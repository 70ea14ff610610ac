"""Shared by the explanation commands (maps, explore, report) and predict: loading the model a
command names (with the metadata it was trained with), image discovery in folders and loading
(files or the model's test set), figure names that keep the images' folders, the note that says
how images were adapted to the model, and display images."""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections import Counter
from collections.abc import Collection, Iterable, Sequence
from pathlib import Path
from typing import Any, Literal, NamedTuple

import timm
import torch
from PIL import Image
from timm.data import DEFAULT_CROP_PCT, IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD

from ..data import DataInfo, DatasetBundle, ImageReadError, build_eval_transform, datasets_for, load_image
from ..data.arrays import spread_over_classes
from ..data.images import convert_channels, describe_conversion, files_under
from ..errors import UnsupportedModelError, UsageError, VitkitError
from ..files import path_kind
from ..io import MODEL_SUFFIX, load_model_and_extra, read_weights_file
from ..models import VisionTransformer, from_timm, merge_tokens
from ..models.timm_interop import pretrained_preprocessing


class FigureNameError(VitkitError, ValueError):
    """Two figures that the naming rules of :func:`figure_names` cannot tell apart."""


IMAGE_SUFFIXES = frozenset({".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp"})

def load_model_from_arguments(args: argparse.Namespace) -> tuple[VisionTransformer, dict[str, Any]]:
    """:func:`load_explained_model` of ``vitkit.cli.parsers.model_arguments``' options; with --timm-weights,
    prints a ``note:`` line saying which normalisation and crop the images get, and from where."""
    overrides = {key: getattr(args, key) for key in ("mean", "std", "crop_pct") if getattr(args, key) is not None}
    if overrides and args.timm_weights is None:
        flags = ", ".join(_flag(key) for key in overrides)
        raise UsageError(f"{flags} only apply to --timm-weights; a vitkit model file keeps its own preprocessing.")
    model, extra = load_explained_model(args.checkpoint, args.model, args.timm_weights, **overrides)
    if getattr(args, "merge_tokens", None) is not None:
        merge_tokens(model, *args.merge_tokens)
    if args.timm_weights is not None:
        info = DataInfo.from_extra(extra)
        print(
            f"note: --timm-weights images are normalised with mean {info.mean} and std {info.std}, resized "
            f"({info.interpolation}, crop_pct {info.crop_pct}, {info.crop_mode} crop) to {info.img_size[1]}x"
            f"{info.img_size[0]}: {extra['preprocessing']}."
        )
    return model, extra


def model_inputs(args: argparse.Namespace) -> list[Path]:
    """The files :func:`load_model_from_arguments` reads for ``args`` (the model file, as
    :func:`~vitkit.io.load_model_and_extra` finds it, and ``--timm-weights``): a command never
    writes over them (:func:`~vitkit.output_dirs.check_output_file`'s ``inputs``)."""
    files = [Path(source) for source in (args.checkpoint, args.timm_weights) if source is not None]
    return [*files, *(file.with_name(file.name + MODEL_SUFFIX) for file in files if not file.suffix)]


def load_explained_model(
    checkpoint: str | os.PathLike | None = None,
    model_name: str | None = None,
    timm_weights: str | os.PathLike | None = None,
    **overrides: Any,
) -> tuple[VisionTransformer, dict[str, Any]]:
    """A model in eval mode and its saved metadata ``extra`` (``DataInfo.from_extra(extra)`` gives
    the preprocessing; ``extra["data_config"]``, when present, the training data).

    Either ``checkpoint`` (a vitkit ``.safetensors`` model file or training ``.ckpt``, whose saved
    metadata gives size, normalisation and class names) or ``model_name`` with ``timm_weights`` (a
    timm ViT state dict as ``.safetensors`` or a torch file read with ``weights_only=True``; classes
    named by index). Timm weights are preprocessed as ``timm.get_pretrained_cfg(model_name)`` says
    (``model_name`` may carry timm's tag: ``vit_small_patch16_224.dino``), with ImageNet mean/std
    and crop 0.875 where timm has no such config; ``overrides`` (``mean``, ``std``, ``crop_pct``)
    replace those values, and ``extra["preprocessing"]`` says where they came from.
    """
    if checkpoint is not None:
        model, extra = load_model_and_extra(checkpoint)
        return model.eval(), extra
    if model_name is None or timm_weights is None:
        raise UsageError("give either a vitkit checkpoint, or a model name together with a timm weights file.")
    path = Path(timm_weights)
    if not path.is_file():
        raise FileNotFoundError(f"timm weights file {path} {path_kind(path)}; expected a state dict file.")
    try:
        pretrained_cfg = timm.get_pretrained_cfg(model_name)
    except RuntimeError:  # timm's "Invalid pretrained tag"
        architecture = model_name.split(".")[0]
        tags = [name.split(".", 1)[1] for name in timm.list_pretrained(f"{architecture}.*")]
        raise UsageError(
            f"--model {model_name}: timm has no tag {model_name.split('.', 1)[1]!r} for {architecture}; "
            f"its tags are {', '.join(tags) or 'none'} (or give {architecture} alone)."
        ) from None
    state = read_weights_file(path, error=UsageError, what="--timm-weights")  # weights_only: no pickled code
    if "patch_embed.proj.weight" not in state:
        raise UsageError(f"{path} is not a timm ViT state dict (no 'patch_embed.proj.weight' tensor).")
    try:
        model = from_timm(state, name=model_name.split(".")[0]).eval()
    except UnsupportedModelError:
        raise  # its own line names what vitkit lacks
    except (RuntimeError, ValueError, KeyError, TypeError) as error:  # load_state_dict's size mismatches
        first = str(error).strip().splitlines()
        raise UsageError(
            f"{path} does not fit model {model_name!r}: {first[0] if first else type(error).__name__}; "
            "give the weights of that architecture."
        ) from None
    config = model.config
    timm_cfg = pretrained_preprocessing(pretrained_cfg, config)
    if timm_cfg is not None:
        source = f"timm's pretrained_cfg of {timm_cfg['architecture']}.{timm_cfg['tag']}"
    else:
        timm_cfg = {
            "input_size": (config.in_chans, *config.img_size),
            "mean": IMAGENET_DEFAULT_MEAN,
            "std": IMAGENET_DEFAULT_STD,
            "crop_pct": DEFAULT_CROP_PCT,
        }
        source = f"ImageNet defaults (timm has no pretrained_cfg for {model_name})"
    if overrides:
        source += f", with {', '.join(_flag(key) for key in overrides)} given"
    try:
        info = DataInfo.from_pretrained_cfg({**timm_cfg, **overrides}, config.num_classes)
    except ValueError as error:
        raise UsageError(f"--mean/--std/--crop-pct: {error}") from None
    return model, {**info.to_extra(), "preprocessing": source}


def _flag(key: str) -> str:
    return f"--{key.replace('_', '-')}"


def find_images(paths: Iterable[str | os.PathLike]) -> list[Path]:
    """Files given directly, plus the image files (by suffix, recursively through symlinked folders
    as training reads them, sorted) of folders; a file found twice (given and inside a given folder)
    is listed once."""
    found: dict[str, Path] = {}
    for entry in map(Path, paths):
        if entry.is_dir():
            files = sorted(p for p in files_under(entry) if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
        else:
            files = [entry]
        for file in files:
            found.setdefault(os.path.abspath(file), file)
    return list(found.values())


def file_safe(text: str) -> str:
    """``text`` usable in a file name without quoting: runs of whitespace and path separators
    become ``_`` (a class "Ankle boot" gives ``test_000_Ankle_boot.png``)."""
    return re.sub(r"[\s/\\]+", "_", text.strip())


def figure_names(files: Sequence[Path], reserved: Collection[Path] = ()) -> list[Path]:
    """Names of the figures of ``files``, relative to the output folder, none in ``reserved`` and
    no two alike.

    A figure mirrors its image's path below the images' deepest common folder, with the suffix
    ``.png`` (``x/a/img.jpg`` and ``x/b/img.jpg`` -> ``a/img.png`` and ``b/img.png``). Images
    that would share a name, such as ``img.png`` and ``img.jpg`` in one folder, keep their own
    suffix (``img.png.png``, ``img.jpg.png``).

    Raises:
        FigureNameError: two figures cannot be told apart by these rules (a file without suffix named
            like a reserved figure).
    """
    if not files:
        return []
    absolute = [Path(os.path.abspath(file)) for file in files]
    common = Path(os.path.commonpath([path.parent for path in absolute]))
    relative = [path.relative_to(common) for path in absolute]
    names = [path.with_suffix(".png") for path in relative]
    while True:
        counts = Counter([*names, *reserved])
        clashing = [i for i, name in enumerate(names) if counts[name] > 1]
        if not clashing:
            return names
        moved = False
        for i in clashing:
            with_suffix = relative[i].parent / f"{relative[i].name}.png"  # a folder never holds a name twice
            moved |= names[i] != with_suffix
            names[i] = with_suffix
        if not moved:
            raise FigureNameError(
                f"the figure of {files[clashing[0]]} would be named {names[clashing[0]]}, like another figure; "
                "rename the image."
            )


def output_clashes(
    out: Path, sources: Iterable[str | os.PathLike], files: Iterable[Path], figures: Iterable[Path]
) -> list[str]:
    """Why writing ``figures`` into ``out`` would overwrite or mix with their images (empty when
    it would not): ``out`` inside a folder of ``sources``, or a figure that is one of ``files``."""
    real_out = out.resolve()
    problems = [
        f"--out {out} lies inside the input folder {source}: figures would mix with its images (and be read as "
        "images next time); choose an output folder outside it"
        for source in map(Path, sources)
        if source.is_dir() and real_out.is_relative_to(source.resolve())
    ]
    inputs = {file.resolve() for file in files}
    problems += [
        f"the figure {figure} would overwrite that input image; choose another --out"
        for figure in figures
        if figure.resolve() in inputs
    ]
    return problems


class ConversionNote:
    """How input images were adapted to the model (channels, size): collected per image, said once.

    Args:
        info: the model's preprocessing (``in_chans``, ``img_size``).
    """

    def __init__(self, info: DataInfo) -> None:
        self.info = info
        self.channels: dict[str, list[Path]] = {}
        self.resized: list[tuple[Path, tuple[int, int]]] = []

    def add(self, path: Path, image: Image.Image) -> None:
        """Record ``image``, read from ``path`` in its own mode and size."""
        how = describe_conversion(image, self.info.in_chans)
        if how is not None:
            self.channels.setdefault(how, []).append(path)
        if (image.height, image.width) != tuple(self.info.img_size):
            self.resized.append((path, image.size))

    def message(self) -> str | None:
        """One line saying what was converted and how, or ``None`` when nothing was."""
        height, width = self.info.img_size
        parts = [f"{len(paths)} image(s) {how} (e.g. {paths[0]})" for how, paths in self.channels.items()]
        if self.resized:
            path, (file_width, file_height) = self.resized[0]
            parts.append(
                f"{len(self.resized)} image(s) of another size (e.g. {path}, {file_width}x{file_height}) resized "
                f"(shorter side) and centre-cropped to {width}x{height}, as in evaluation"
            )
        if not parts:
            return None
        kind = "grayscale" if self.info.in_chans == 1 else "RGB"
        return f"note: images converted to the model's input ({kind}, {width}x{height}): {'; '.join(parts)}."


class LoadedImage(NamedTuple):
    """One image preprocessed for the model."""

    name: str  # how to call it in titles: the file, or "test image <i>"
    image: torch.Tensor  # [C, H, W], normalised as in evaluation
    label: int | None  # the true class, when known
    path: Path | None  # the file it was read from (None for test images)
    class_name: str | None = None  # the true class's name (the data's: a model without a classifier has none)


def load_test_images(
    model: VisionTransformer, extra: dict[str, Any], count: int, seed: int, overrides: Sequence[str] = ()
) -> list[LoadedImage]:
    """``count`` preprocessed test images of the dataset the model was trained on
    (``extra["data_config"]`` changed by ``overrides``, see :func:`load_explained_model`), as
    :func:`draw_images` draws them. Data that no longer fits ``model`` is refused
    (:func:`~vitkit.data.datasets_for`)."""
    return draw_images(datasets_for(model, extra, list(overrides), features_only=True), "test", count, seed)


def draw_images(bundle: DatasetBundle, split: Literal["test", "val"], count: int, seed: int) -> list[LoadedImage]:
    """``count`` preprocessed images of ``bundle``'s ``split`` (test, or validation), spread over
    its classes by ``seed`` (:func:`~vitkit.data.arrays.spread_over_classes`), with their labels;
    prints a ``note:`` saying so. An empty split is refused."""
    images = bundle.test if split == "test" else bundle.val
    noun = "test" if split == "test" else "validation"
    if len(images) == 0:
        raise UsageError(f"the {noun} split is empty: give data with a {noun} split (--data ...).")
    chosen = spread_over_classes(images.labels, count, seed)
    classes = len(set(images.labels[chosen].tolist()))
    print(f"note: {len(chosen)} {noun} images drawn across {classes} classes (seed {seed}; --seed to draw others).")
    names = bundle.info.class_names
    return [
        LoadedImage(f"{noun} image {index}", image, label, None, names[label])
        for index in chosen.tolist()
        for image, label in [images[index]]
    ]


def load_image_files(
    paths: Iterable[Path], info: DataInfo, note: ConversionNote
) -> tuple[list[LoadedImage], list[str]]:
    """``paths`` read and preprocessed for the model (conversions recorded in ``note``), and the
    files that could not be read (each reported on stderr as it fails)."""
    transform = build_eval_transform(info)
    loaded, failed = [], []
    for path in paths:
        try:
            image = load_image(path)
        except ImageReadError as error:
            print(f"error: {error}; skipped.", file=sys.stderr)
            failed.append(str(path))
            continue
        note.add(path, image)
        loaded.append(LoadedImage(str(path), transform(convert_channels(image, info.in_chans)), None, path))
    return loaded, failed
