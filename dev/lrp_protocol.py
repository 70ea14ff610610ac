"""Issue 53 item 5: lrp's rules judged on models that chose nothing.

    python dev/lrp_protocol.py MODEL.safetensors [MODEL ...] --images 200 --out lrp_protocol.md

For each model file (a project recipe's model: its data config is saved with it), every preset of
:data:`vitkit.explain.LRP_PRESETS` is measured on ``--images`` test images (deletion and insertion
areas, mean baseline, one patch per step), and ``--lrp-rules auto``'s choice is made on
``--choice-images`` validation images of the same model, as ``vitkit faithfulness`` makes it. The
table has one row per model: each preset's insertion minus deletion on the test images, the preset
auto chose, the score that choice gets on the test images, and the best preset there. No model
listed here chose a preset's settings, so every row is held out.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

from vitkit.cli.explain_io import draw_images
from vitkit.data import datasets_for
from vitkit.explain import LRP_PRESETS, choose_lrp_rules, faithfulness, map_method
from vitkit.io import load_model_and_extra


def measure(path: Path, images: int, choice_images: int, seed: int) -> dict[str, object]:
    model, extra = load_model_and_extra(path)
    model.eval()
    bundle = datasets_for(model, extra, features_only=True)
    test, val = draw_images(bundle, "test", images, seed), draw_images(bundle, "val", choice_images, seed)
    choice = choose_lrp_rules(model, torch.stack([image.image for image in val]))
    methods = [(name, map_method("lrp", rules=rules)) for name, rules in LRP_PRESETS.items()]
    report = faithfulness(model, torch.stack([image.image for image in test]),
                          torch.tensor([image.label for image in test]), methods, sanity=False)
    scores = {name: report.result(name).mean("insertion") - report.result(name).mean("deletion") for name in LRP_PRESETS}
    return {"model": str(path), "scores": scores, "auto": choice.name, "best": max(scores, key=scores.get)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", type=Path, nargs="+")
    parser.add_argument("--images", type=int, default=200)
    parser.add_argument("--choice-images", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    rows = [measure(path, args.images, args.choice_images, args.seed) for path in args.models]
    names = list(LRP_PRESETS)
    lines = [f"| model | {' | '.join(names)} | auto's choice | auto | best on test |",
             "|---|" + "---|" * (len(names) + 3)]
    for row in rows:
        scores = row["scores"]
        lines.append(f"| {row['model']} | " + " | ".join(f"{scores[name]:.3f}" for name in names)
                     + f" | {row['auto']} | {scores[row['auto']]:.3f} | {row['best']} |")
    means = {name: statistics.mean(row["scores"][name] for row in rows) for name in names}
    auto_mean = statistics.mean(row["scores"][row["auto"]] for row in rows)
    lines.append("| mean | " + " | ".join(f"{means[name]:.3f}" for name in names) + f" | | {auto_mean:.3f} | |")
    table = "\n".join(lines) + "\n"
    args.out.write_text(table, encoding="utf-8")
    print(table, end="")
    print(f"insertion minus deletion (higher is more faithful) on {args.images} test images per model; wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
