"""Do attention maps find the object? Rollout maps of a trained shapes model vs random weights.

    python tools/localization.py --checkpoint runs/<recipe>/<run>/model.safetensors --out loc/
    python tools/localization.py --recipe recipes/quickstart.yaml data.name=shapes data.img_size=32 \\
        model.patch_size=4 --out loc/              # trains first, then scores

On the test split of the ``shapes`` dataset (each image's object box known), every method's map is
scored with the pointing game (is the map's maximum within ``--tolerance`` pixels of the box; the
gradient methods explain the ground-truth label, Zhang et al. 2016's protocol, or with
``--explain predicted`` the prediction) and the share of map mass in the box, for the trained
model and, as a model-randomisation sanity check (Adebayo et al. 2018, arXiv 1810.03292), for the
same architecture with random weights. The chance
level of the mass share is the box's share of the image. Prints a Markdown table and, with
``--out``, writes ``localization.csv`` and ``localization.md``.
"""

from __future__ import annotations

import argparse
import sys

import torch

from vitkit import VisionTransformer
from vitkit.errors import UsageError, cli_errors, number_in, positive_int
from vitkit.explain import HEAD_FUSIONS, evaluate_localization
from vitkit.explain.localization import pointing_tolerance
from vitkit.output_dirs import claim_output_dir
from vitkit.prune.report import markdown_table, write_csv
from vitkit.train import load_for_inference, train
from vitkit.train.evaluate import datasets_for

METHODS = ("rollout", "grad_rollout", "chefer")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--checkpoint", help="model trained on shapes (.safetensors or .ckpt)")
    source.add_argument("--recipe", help="train this recipe first (with the dotted overrides given after it)")
    parser.add_argument("overrides", nargs="*", help="recipe overrides, e.g. data.name=shapes trainer.max_epochs=10")
    parser.add_argument("--data", nargs="*", default=[], metavar="KEY=VALUE", help="data option changes")
    parser.add_argument("--num-images", type=positive_int, default=500)
    parser.add_argument("--head-fusion", choices=HEAD_FUSIONS, default="mean")
    parser.add_argument("--discard-ratio", type=number_in(0, 1, high_open=True), default=0.0,
                        help="share of the lowest attention weights dropped per head, in [0, 1)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random-weight model")
    parser.add_argument("--explain", choices=("label", "predicted"), default="label",
                        help="class the gradient methods explain (the pointing game cues the true label)")
    parser.add_argument("--tolerance", type=number_in(0), default=None,
                        help="pointing-game tolerance in pixels (default: TorchRay's 15 px at 224 px, scaled)")
    parser.add_argument("--out", help="folder for localization.csv / localization.md")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Exit status 0, or 2 with one ``error: ...`` line for a bad argument, model, recipe or output folder."""
    return cli_errors(_main, argv)


def _main(argv: list[str] | None) -> int:
    args = parse_args(argv)
    checkpoint = args.checkpoint or train(args.recipe, args.overrides).run_dir / "model.safetensors"
    model, extra = load_for_inference(checkpoint)
    dataset = datasets_for(model, extra, args.data).test
    boxes = getattr(dataset, "boxes", None)
    if boxes is None:
        dataset_name = extra.get("dataset")
        raise UsageError(f"the test split of {dataset_name!r} has no object boxes; use a model trained on shapes.")
    torch.manual_seed(args.seed)
    models = {"trained": model, "random weights": VisionTransformer(model.config).eval()}
    tolerance = args.tolerance if args.tolerance is not None else pointing_tolerance(tuple(extra["img_size"]))
    options = dict(head_fusion=args.head_fusion, discard_ratio=args.discard_ratio, explain_class=args.explain,
                   tolerance=tolerance)
    rows: list[dict[str, object]] = []
    for name, candidate in models.items():
        for method in METHODS:
            scores = evaluate_localization(candidate, dataset, boxes, method, max_images=args.num_images, **options)
            summary = scores.summary()
            rows.append({
                "model": name,
                "method": method,
                "pointing game %": f"{summary['pointing_game']:.1f}",
                "mass in box %": f"{summary['mass_in_box']:.1f}",
                "box area % (chance)": f"{summary['box_area']:.1f}",
            })
    table = markdown_table(rows)
    print(f"{len(scores.pointing)} test images of {extra.get('dataset')!r}, model {checkpoint}, explaining the "
          f"{args.explain} class, pointing tolerance {tolerance:g} px\n\n{table}", end="")
    if args.out:
        out = claim_output_dir(args.out, "localization")
        write_csv(out / "localization.csv", rows)
        (out / "localization.md").write_text(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
