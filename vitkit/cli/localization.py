"""Do attention maps find the object? Rollout maps of a trained shapes model vs random weights.

    vitkit localize runs/<recipe>/<run>/model.safetensors --out loc/
    vitkit localize --recipe recipes/quickstart.yaml data.name=shapes data.img_size=32 \\
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

import torch

from vitkit import VisionTransformer
from vitkit.data import datasets_for
from vitkit.errors import UsageError
from vitkit.explain import evaluate_localization
from vitkit.explain.localization import pointing_tolerance
from vitkit.files import markdown_table, write_csv
from vitkit.io import load_model_and_extra
from vitkit.method_names import GRADIENT_METHODS
from vitkit.output_dirs import claim_output_dir
from vitkit.train import train

from .commands import run_command

#: The maps scored: rollout and the gradient methods.
METHODS = ("rollout", *GRADIENT_METHODS)


def main(argv: list[str] | None = None) -> int:
    """``vitkit localize`` in this process (``tools/localization.py``, tests)."""
    return run_command("localize", run, argv)


def run(args: argparse.Namespace) -> int:
    if args.checkpoint is not None and args.overrides:
        raise UsageError(f"recipe overrides ({' '.join(args.overrides)}) need --recipe; a model file is localized as it is.")
    checkpoint = args.checkpoint or train(args.recipe, args.overrides).run_dir / "model.safetensors"
    model, extra = load_model_and_extra(checkpoint)
    model.eval()
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

