"""Head diagnostics of a ViT (a checklist of attention pathologies, automated).

    vitkit report runs/quickstart/<run>/model.safetensors --out report/
    vitkit report --model vit_small_patch16_224 --timm-weights vit_s.safetensors \\
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

from torch.utils.data import DataLoader

from vitkit.data import datasets_for
from vitkit.errors import UsageError
from vitkit.explain import HeadThresholds, head_warnings, model_head_stats
from vitkit.explain.render import head_grid_figure
from vitkit.files import write_csv
from vitkit.output_dirs import claim_output_dir

from .commands import run_command
from .explain_io import load_model_from_arguments


def main(argv: list[str] | None = None) -> int:
    """``vitkit report`` in this process (``tools/attention_report.py``, tests)."""
    return run_command("report", run, argv)


def run(args: argparse.Namespace) -> int:
    model, extra = load_model_from_arguments(args)
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
    if warnings:  # no file at all when there is nothing to warn of
        (out / "warnings.txt").write_text("".join(f"{w}\n" for w in warnings))

    print(f"head statistics of {len(rows)} heads over {stats.num_images} images written to {out}")
    cls_share, reg_share = stats.sink_shares()
    sinks = []
    for layer, (to_cls, to_reg) in enumerate(zip(cls_share.tolist(), reg_share.tolist())):
        shares = [f"{label} {share:.1%}" for label, share in (("class token", to_cls), ("registers", to_reg))
                  if share == share]  # NaN: the model has no such token
        if shares:
            sinks.append(f"  layer {layer}: {', '.join(shares)}")
    if sinks:
        print("attention to the prefix tokens (sinks; information, not warnings):", *sinks, sep="\n")
    for warning in warnings:
        print(f"warning: {warning}")
    if not warnings:
        print("no warnings: every head is focused, mixes tokens and differs from the others.")
    return 0

