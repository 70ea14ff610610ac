"""Attention maps of a ViT for image files: one PNG per image.

    vitkit maps runs/shapes/model.safetensors images/ --out maps/
    vitkit maps runs/quickstart/latest/model.safetensors --test-images 4 --out maps/
    vitkit maps --model vit_small_patch16_224 --timm-weights vit_s.safetensors \\
        cat.jpg dog.png --out maps/ --method all --layer -1 --discard-ratio 0.9

Each PNG shows the image as the model saw it, the AttnLRP, Chefer et al. relevance and
gradient-rollout overlays for the predicted (or ``--target``) class, the attention rollout and the
per-head attention of block ``--layer`` (left out when that block's heads were all pruned; layers and heads
count from 0), with a colour bar. The title gives the predicted class and its probability, and the
true class for --test-images. Each map's title gives its deletion and insertion areas for this image
(the class's probability as the map's most relevant patches are deleted, or revealed on the mean
image, over --score-steps steps: low deletion and high insertion mean a faithful map; --no-scores
leaves them out). Maps are read out as the model pools (class token or average).
A model without a classifier (num_classes=0, e.g. timm's DINOv2) gets the rollout and per-head
maps of its read-out, and no gradient or LRP maps: those explain a class (--method all leaves them
out with a note; --method grad_rollout, chefer or lrp, and --target, are refused).

Figure names keep the images' folders: each figure mirrors its image's path below the images'
deepest common folder, with the suffix .png (images/a/img.jpg and images/b/img.jpg give
OUT/a/img.png and OUT/b/img.png); images that would share a name (img.png and img.jpg in one
folder) keep their suffix (img.png.png, img.jpg.png). --test-images N writes
OUT/test_000_<class>.png and on (spaces in class names become _). --out may not lie inside an input folder.

Images are converted to the model's channels and size (one note says what was converted and how).
Unreadable files (and FIFOs or other non-regular files) are reported by name and skipped.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import NamedTuple

import torch

from vitkit import VisionTransformer
from vitkit.data import DataInfo, display_image
from vitkit.errors import UsageError
from vitkit.explain import (
    CLASS_METHODS,
    GRADIENT_METHODS,
    METHODS,
    AttentionCapture,
    capture_attention,
    image_maps,
    patch_maps,
)
from vitkit.explain.faithfulness import map_scores
from vitkit.explain.render import attention_figure
from vitkit.method_names import LABELS
from vitkit.output_dirs import claim_output_dir

from .commands import run_command
from .common import SKIPPED_INPUTS
from .explain_io import (
    ConversionNote,
    figure_names,
    file_safe,
    find_images,
    load_image_files,
    load_model_from_arguments,
    load_test_images,
    output_clashes,
)


class Sample(NamedTuple):
    """One image to explain and where its figure goes."""

    name: str  # shown in the title
    image: torch.Tensor  # preprocessed [C, H, W]
    label: str | None  # the true class's name, when known
    figure: Path


#: The map panels in drawing order: AttnLRP, the most faithful of them on Fashion-MNIST and the
#: digits (docs/results.md, "Which map explains the prediction?"), comes first.
PANELS = ("lrp", "chefer", "grad_rollout", "rollout")
#: How the figures' titles name each read-out (:attr:`vitkit.explain.AttentionCapture.pooling`).
READ_OUTS = {"token": "the class token", "avg": "the patch tokens' mean", "distilled": "the class and distillation tokens"}


def option_problems(args: argparse.Namespace, num_classes: int, depth: int) -> list[str]:
    """What is wrong with ``--method``, ``--target``, ``--layer`` or ``--discard-ratio`` (empty when nothing)."""
    problems = []
    if num_classes == 0:
        if args.method in CLASS_METHODS:
            problems.append(
                f"--method {args.method} explains a class and this model has no classifier (num_classes=0); "
                "use --method rollout, heads or all"
            )
        if args.target is not None:
            problems.append("--target names a class and this model has no classifier (num_classes=0)")
    elif args.target is not None and not 0 <= args.target < num_classes:
        problems.append(f"--target {args.target} is not a class index of this model (0..{num_classes - 1})")
    if not -depth <= args.layer < depth:
        problems.append(f"--layer {args.layer} is out of range for {depth} blocks (0..{depth - 1}, or -1 for the last)")
    if not 0.0 <= args.discard_ratio < 1.0:
        problems.append(f"--discard-ratio must lie in [0, 1), got {args.discard_ratio}")
    return problems


def render_batch(model: VisionTransformer, batch: list[Sample], args: argparse.Namespace, info: DataInfo) -> None:
    """Capture one batch and write one figure per sample."""
    methods = METHODS if args.method == "all" else (args.method,)
    if args.method == "all" and model.heads_per_layer()[args.layer] == 0:
        methods = tuple(m for m in methods if m != "heads")  # that block's heads were all pruned
    if args.method == "all" and info.num_classes == 0:
        methods = tuple(m for m in methods if m not in CLASS_METHODS)  # no class to explain
    images = torch.stack([sample.image for sample in batch])
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.precision == "bf16"):
        capture = capture_attention(
            model, images, args.target, with_gradients=any(m in GRADIENT_METHODS for m in methods),
            with_relevance="lrp" in methods,
        )
        options = dict(layer=args.layer, head_fusion=args.head_fusion, discard_ratio=args.discard_ratio)
        patches = {method: patch_maps(capture, method, **options) for method in methods}  # once: drawn and scored
        maps = {method: image_maps(capture, method, patch) for method, patch in patches.items()}
        scores = {} if args.no_scores or info.num_classes == 0 else scores_of_maps(model, images, capture, patches, args)
    probabilities = capture.logits.softmax(dim=-1)
    num_layers = len(capture.attentions)
    names = info.class_names
    for index, sample in enumerate(batch):
        if info.num_classes == 0:
            title = f"{sample.name}: no classifier, attention read out from {READ_OUTS[capture.pooling]}"
        else:
            predicted = int(probabilities[index].argmax())
            title = f"{sample.name}: predicted {names[predicted]} ({probabilities[index, predicted]:.1%})"
        if sample.label is not None:
            title += f", true {sample.label}"
        panels = []
        for method in PANELS:
            if method in maps:
                label = LABELS[method]
                if method != "rollout":
                    label += f": {names[int(capture.targets[index])]}"
                if method in scores:
                    deletion, insertion = (float(scores[method][test][index]) for test in ("deletion", "insertion"))
                    label += f" (del {deletion:.2f}, ins {insertion:.2f})"
                panels.append((label, maps[method][index]))
        heads = maps["heads"][index] if "heads" in maps else None
        sample.figure.parent.mkdir(parents=True, exist_ok=True)
        picture = display_image(sample.image, info)
        attention_figure(picture, panels, heads, args.layer % num_layers, num_layers, title, sample.figure)


def scores_of_maps(
    model: VisionTransformer, images: torch.Tensor, capture: AttentionCapture, patches: dict[str, torch.Tensor],
    args: argparse.Namespace,
) -> dict[str, dict[str, torch.Tensor]]:
    """The deletion and insertion areas ``[B]`` per image over ``--score-steps`` steps of each of
    ``patches`` (method -> :func:`vitkit.explain.patch_maps`, :func:`vitkit.explain.faithfulness.map_scores`);
    per-head grids get none."""
    maps = {method: patch.view(len(images), *capture.grid) for method, patch in patches.items() if method != "heads"}
    if not maps:
        return {}
    return map_scores(model, images, maps, tuple(model.config.patch_size), capture.targets, args.score_steps)


def test_samples(model: VisionTransformer, extra: dict, info: DataInfo, count: int, out: Path, seed: int) -> list[Sample]:
    """``count`` preprocessed test images of the model's dataset spread over its classes by ``seed``,
    figures named after their label."""
    return [
        Sample(loaded.name, loaded.image, loaded.class_name, out / f"test_{index:03d}_{file_safe(loaded.class_name)}.png")
        for index, loaded in enumerate(load_test_images(model, extra, count, seed))
    ]


def read_samples(
    paths: list[Path], figures: list[Path], info: DataInfo, note: ConversionNote
) -> tuple[list[Sample], list[str]]:
    """``paths`` read and preprocessed for the model (conversions recorded in ``note``), and the
    files that could not be read (reported on stderr)."""
    figure_of = dict(zip(paths, figures))
    loaded, failed = load_image_files(paths, info, note)
    return [Sample(image.name, image.image, None, figure_of[image.path]) for image in loaded], failed


def main(argv: list[str] | None = None) -> int:
    """``vitkit maps`` in this process (``tools/attention_maps.py``, tests)."""
    return run_command("maps", run, argv)


def run(args: argparse.Namespace) -> int:
    model, extra = load_model_from_arguments(args)
    info = DataInfo.from_extra(extra)
    problems = option_problems(args, info.num_classes, len(model.blocks))
    if problems:
        raise UsageError(f"{'; '.join(problems)}.")
    out = Path(args.out)
    paths = find_images(args.images)
    if not paths and not args.test_images:
        raise UsageError("no image files in the given paths: give image files, folders or --test-images N.")
    start = time.perf_counter()
    samples: list[Sample] = []
    if args.test_images:
        samples = test_samples(model, extra, info, args.test_images, out, args.seed)
    figures = [out / name for name in figure_names(paths, {s.figure.relative_to(out) for s in samples})]
    clashes = output_clashes(out, args.images, paths, [*figures, *(s.figure for s in samples)])
    if clashes:
        raise UsageError(f"{'; '.join(clashes)}.")
    claim_output_dir(out, "attention_maps")
    if args.method == "all" and model.heads_per_layer()[args.layer] == 0:
        print(f"note: every head of layer {args.layer % len(model.blocks)} was pruned: the figures have no per-head grid; "
              "pick another --layer to see one.")
    if args.method == "all" and info.num_classes == 0:
        print(f"note: the model has no classifier (num_classes=0): no {', '.join(CLASS_METHODS[:-1])} or {CLASS_METHODS[-1]} maps, which explain a class.")
    note = ConversionNote(info)
    failed: list[str] = []
    written = 0
    for first in range(0, len(samples), args.batch_size):
        render_batch(model, samples[first : first + args.batch_size], args, info)
    written += len(samples)
    for first in range(0, len(paths), args.batch_size):
        batch, unread = read_samples(
            paths[first : first + args.batch_size], figures[first : first + args.batch_size], info, note
        )
        failed += unread
        if batch:
            render_batch(model, batch, args, info)
            written += len(batch)
    if (message := note.message()) is not None:
        print(message)
    seconds = time.perf_counter() - start
    per_image = seconds / max(written, 1)
    print(f"wrote {written} figure(s) to {out} in {seconds:.1f} s ({per_image:.2f} s/image).")
    if failed:
        print(f"{len(failed)} file(s) could not be read: {', '.join(failed)}", file=sys.stderr)
    return SKIPPED_INPUTS if failed else 0

