"""Head diagnostics of a ViT (a checklist of attention pathologies, automated).

    python tools/attention_report.py --checkpoint runs/quickstart/<run>/model.safetensors --out report/
    python tools/attention_report.py --model vit_small_patch16_224 --timm-weights vit_s.safetensors \\
        --data name=imagefolder root=/data/imagenette --out report/

Over a batch of the model's own data (its saved data options, changed with ``--data key=value``),
for every layer and head: normalised attention entropy (unfocused heads), diagonal share (tokens
attending to themselves), class-token share (attention sinks) and the JS similarity to the most
similar head of the same layer (collapse). Writes ``head_stats.csv``, one layer x head heat map per
metric and ``warnings.txt``, and prints the warnings. Thresholds: ``vitkit.explain.HeadThresholds``
(entropy >= 0.9 of the maximum, diagonal >= 0.5, class-token share >= 0.5, similarity >= 0.9),
each settable below.
"""

from __future__ import annotations

import argparse
import sys

from torch.utils.data import DataLoader

from vitkit.errors import UsageError, cli_errors, positive_int
from vitkit.explain import HeadThresholds, head_warnings, model_head_stats
from vitkit.explain.cli import add_model_arguments, load_explained_model
from vitkit.explain.render import head_grid_figure
from vitkit.output_dirs import claim_output_dir
from vitkit.prune.report import write_csv
from vitkit.train.evaluate import datasets_for

DEFAULTS = HeadThresholds()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_arguments(parser)
    parser.add_argument(
        "--data", nargs="*", default=[], metavar="KEY=VALUE", help="changes to the saved data options (DataConfig)"
    )
    parser.add_argument("--split", choices=("test", "val"), default="test")
    parser.add_argument("--num-images", type=positive_int, default=128, help="images averaged over")
    parser.add_argument("--batch-size", type=positive_int, default=32)
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument("--uniform-entropy", type=float, default=DEFAULTS.uniform_entropy)
    parser.add_argument("--self-attention", type=float, default=DEFAULTS.self_attention)
    parser.add_argument("--cls-sink", type=float, default=DEFAULTS.cls_sink)
    parser.add_argument("--collapse-similarity", type=float, default=DEFAULTS.collapse_similarity)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Exit status 0, or 2 with one ``error: ...`` line for a bad argument, model file, data or output folder."""
    return cli_errors(_main, argv)


def _main(argv: list[str] | None) -> int:
    args = parse_args(argv)
    model, extra = load_explained_model(args.checkpoint, args.model, args.timm_weights)
    if not sum(model.heads_per_layer()):
        raise UsageError(f"{args.checkpoint} has no attention heads left (all were pruned): there is no head to report on.")
    dataset = getattr(datasets_for(model, extra, args.data), args.split)
    batches = (images for images, _ in DataLoader(dataset, batch_size=args.batch_size))
    stats = model_head_stats(model, batches, max_images=args.num_images)
    thresholds = HeadThresholds(args.uniform_entropy, args.self_attention, args.cls_sink, args.collapse_similarity)
    warnings = head_warnings(stats, thresholds)

    out = claim_output_dir(args.out, "attention_report")
    rows = stats.rows()
    write_csv(out / "head_stats.csv", rows)
    best, _ = stats.most_similar()
    metrics = {
        "entropy": (stats.entropy, "normalised attention entropy (1 = uniform)"),
        "diagonal": (stats.diagonal, "attention of each token to itself"),
        "cls_share": (stats.cls_share, "attention to the class token"),
        "similarity": (best, "JS similarity to the most similar head"),
    }
    if model.config.reg_tokens:
        metrics["reg_share"] = (stats.reg_share, "attention to the register tokens")
    for name, (values, title) in metrics.items():
        head_grid_figure(values, title, out / f"{name}.png")
    (out / "warnings.txt").write_text("".join(f"{w}\n" for w in warnings))

    print(f"head statistics of {len(rows)} heads over {stats.num_images} images written to {out}")
    cls_share, reg_share = stats.sink_shares()
    for layer, (to_cls, to_reg) in enumerate(zip(cls_share.tolist(), reg_share.tolist())):
        shares = [f"{label} {share:.1%}" for label, share in (("class token", to_cls), ("registers", to_reg))
                  if share == share]  # NaN: the model has no such token
        if shares:
            print(f"layer {layer} attention sink: {', '.join(shares)}")
    for warning in warnings:
        print(f"warning: {warning}")
    if not warnings:
        print("no warnings: every head is focused, mixes tokens and differs from the others.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
