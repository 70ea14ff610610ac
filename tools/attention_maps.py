"""Attention maps of a ViT for image files: one PNG per image.

    python tools/attention_maps.py --checkpoint runs/shapes/model.safetensors images/ --out maps/
    python tools/attention_maps.py --checkpoint runs/quickstart/latest/model.safetensors --test-images 4 --out maps/
    python tools/attention_maps.py --model vit_small_patch16_224 --timm-weights vit_s.safetensors \\
        cat.jpg dog.png --out maps/ --method all --layer -1 --discard-ratio 0.9

Each PNG shows the image as the model saw it, the attention-rollout overlay, the gradient-rollout
and Chefer et al. relevance overlays for the predicted (or ``--target``) class and the per-head
attention of block ``--layer`` (left out when that block's heads were all pruned), titled with the
predicted class and its probability. Maps are read out as the model pools (class token or average). Unreadable files are reported by
name and skipped; the exit code is 1 if any failed.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")

from vitkit import VisionTransformer  # noqa: E402
from vitkit.errors import UsageError, cli_errors, positive_int  # noqa: E402
from vitkit.data import DataInfo, ImageReadError, build_datasets, build_eval_transform, load_image  # noqa: E402
from vitkit.explain import GRADIENT_METHODS, HEAD_FUSIONS, METHODS, capture_attention, maps_from_capture  # noqa: E402
from vitkit.explain.cli import add_model_arguments, display_image, find_images, load_explained_model  # noqa: E402
from vitkit.explain.render import attention_figure  # noqa: E402
from vitkit.train.evaluate import data_config_for  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_arguments(parser)
    parser.add_argument("images", nargs="*", help="image files and/or folders")
    parser.add_argument(
        "--test-images", type=int, default=0, metavar="N",
        help="also explain the first N test images of the dataset the checkpoint was trained on",
    )
    parser.add_argument("--out", required=True, help="output folder for the PNGs")
    parser.add_argument("--method", choices=(*METHODS, "all"), default="all")
    parser.add_argument("--layer", type=int, default=-1, help="block shown in the per-head grid (default: last)")
    parser.add_argument("--head-fusion", choices=HEAD_FUSIONS, default="mean", help="rollout: how heads are combined")
    parser.add_argument(
        "--discard-ratio", type=float, default=0.0, help="both rollouts: share of each layer's weakest entries zeroed"
    )
    parser.add_argument("--target", type=int, default=None, help="class for gradient rollout (default: predicted)")
    parser.add_argument("--batch-size", type=positive_int, default=16)
    parser.add_argument(
        "--precision", choices=("fp32", "bf16"), default="fp32",
        help="bf16: run the model under bfloat16 autocast (~2.5x faster on CPUs with AMX; maps still in float32)",
    )
    return parser.parse_args(argv)


def option_problems(args: argparse.Namespace, num_classes: int, depth: int) -> list[str]:
    """What is wrong with ``--target``, ``--layer`` or ``--discard-ratio`` (empty when nothing)."""
    problems = []
    if args.target is not None and not 0 <= args.target < num_classes:
        problems.append(f"--target {args.target} is not a class index of this model (0..{num_classes - 1})")
    if not -depth <= args.layer < depth:
        problems.append(f"--layer {args.layer} is out of range for {depth} blocks (0..{depth - 1}, or -1 for the last)")
    if not 0.0 <= args.discard_ratio < 1.0:
        problems.append(f"--discard-ratio must lie in [0, 1), got {args.discard_ratio}")
    return problems


def render_batch(
    model: VisionTransformer,
    batch: list[tuple[Path, torch.Tensor]],
    args: argparse.Namespace,
    info: DataInfo,
    out: Path,
) -> None:
    """Capture one batch of ``(path, preprocessed image)`` and write one figure per image."""
    methods = METHODS if args.method == "all" else (args.method,)
    if args.method == "all" and model.heads_per_layer()[args.layer] == 0:
        methods = tuple(m for m in methods if m != "heads")  # that block's heads were all pruned
    images = torch.stack([image for _, image in batch])
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.precision == "bf16"):
        capture = capture_attention(
            model, images, args.target, with_gradients=any(m in GRADIENT_METHODS for m in methods)
        )
    options = dict(layer=args.layer, head_fusion=args.head_fusion, discard_ratio=args.discard_ratio)
    maps = {method: maps_from_capture(capture, method, **options) for method in methods}
    probabilities = capture.logits.softmax(dim=-1)
    layer = args.layer % len(capture.attentions)
    names = info.class_names
    for index, (path, image) in enumerate(batch):
        predicted = int(probabilities[index].argmax())
        title = f"{path.name}: {names[predicted]} ({probabilities[index, predicted]:.1%})"
        panels = []
        if "rollout" in maps:
            panels.append(("attention rollout", maps["rollout"][index]))
        for method, label in (("grad_rollout", "grad rollout"), ("chefer", "Chefer et al.")):
            if method in maps:
                panels.append((f"{label}: {names[int(capture.targets[index])]}", maps[method][index]))
        heads = maps["heads"][index] if "heads" in maps else None
        picture = display_image(image, info)
        attention_figure(picture, panels, heads, layer, title, out / f"{path.stem}_{path.suffix.lstrip('.')}.png")


def test_samples(extra: dict, info: DataInfo, count: int) -> list[tuple[Path, torch.Tensor]]:
    """The first ``count`` preprocessed test images of the model's dataset, named after their label."""
    test_set = build_datasets(data_config_for(extra)).test
    samples = []
    for index in range(min(count, len(test_set))):
        image, label = test_set[index]
        samples.append((Path(f"test_{index:03d}_{info.class_names[label]}.png"), image))
    return samples


def main(argv: list[str] | None = None) -> int:
    """Exit status 0; 1 when an image could not be read or none was found; 2 with one ``error: ...``
    line for a bad argument, model file or output folder."""
    return cli_errors(_main, argv)


def _main(argv: list[str] | None) -> int:
    args = parse_args(argv)
    model, extra = load_explained_model(args.checkpoint, args.model, args.timm_weights)
    info = DataInfo.from_extra(extra)
    transform = build_eval_transform(info)
    problems = option_problems(args, info.num_classes, len(model.blocks))
    if problems:
        raise UsageError(f"{'; '.join(problems)}.")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    paths = find_images(args.images)
    failed: list[str] = []
    written = 0
    start = time.perf_counter()
    if args.test_images:
        samples = test_samples(extra, info, args.test_images)
        for first in range(0, len(samples), args.batch_size):
            render_batch(model, samples[first : first + args.batch_size], args, info, out)
        written += len(samples)
    for first in range(0, len(paths), args.batch_size):
        batch = []
        for path in paths[first : first + args.batch_size]:
            try:
                batch.append((path, transform(load_image(path, info.in_chans))))
            except ImageReadError as error:
                print(f"error: {error}; skipped.", file=sys.stderr)
                failed.append(str(path))
        if batch:
            render_batch(model, batch, args, info, out)
            written += len(batch)
    seconds = time.perf_counter() - start
    per_image = seconds / max(written, 1)
    print(f"wrote {written} figure(s) to {out} in {seconds:.1f} s ({per_image:.2f} s/image).")
    if failed:
        print(f"{len(failed)} file(s) could not be read: {', '.join(failed)}", file=sys.stderr)
    elif not written:
        print("no image files found in the given paths (give files, folders or --test-images N).", file=sys.stderr)
    return 1 if failed or not written else 0


if __name__ == "__main__":
    sys.exit(main())
