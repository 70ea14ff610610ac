"""Issue 49 item 4: one efficiency table, token merging (ToMe), head pruning and int8 ONNX side by side.

    vitkit train fashion_mnist model.patch_size=4 data.img_size=32 trainer.max_epochs=6   # 64 tokens
    vitkit prune runs/fashion_mnist/latest/model.safetensors --orders importance --ratio 0.25 \
        --recover-epochs 1 --out prune25          # and --ratio 0.5 --out prune50
    python dev/efficiency_table.py --fashion-mnist runs/fashion_mnist/latest/model.safetensors \
        --pruned prune25/pruned_recovered.safetensors prune50/pruned_recovered.safetensors \
        --r 8 12 16 --rounds 7 --out efficiency --figure docs/efficiency_fashion_mnist.png
    python dev/efficiency_table.py --out efficiency_quick --quick   # ViT-S/16 only, few rounds: a smoke run

Models: ``--fashion-mnist`` (a model trained by a project recipe, at least 64 tokens: accuracy on
its test split) and ViT-S/16 at 224 px imported from timm with random weights (speed only).
Rows, each on the same machine and threads: the baseline; ToMe at each ``--r`` (Fashion-MNIST)
or ``--vit-r`` (ViT-S/16); head pruning at 25% and 50% (``--pruned``: model files written by
``vitkit prune MODEL --ratio F --recover-epochs N``, so with recovery; ViT-S/16 has the first
heads of every block removed, speed only); int8 ONNX (onnxruntime's dynamic quantisation); and
the combinations: prune + ToMe, ToMe + int8, prune + ToMe + int8 (ToMe at ``--combine-r``, the
middle r by default, on the 50% pruned model).
Columns: top-1 (Fashion-MNIST), GFLOPs per image (``vit_flops``; int8 rows as their float
graph), images/s at batch 64 on 1 and 2 threads (median of interleaved rounds,
:func:`vitkit.timing.interleaved_times`) and latency at batch 1 (ms, 1 thread).

Writes ``--out``/results.json and ``--out``/results.md (each model's rows as they finish) and
prints the Markdown table; ``--figure`` draws top-1 against images/s (2 threads).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import timm
import torch
from matplotlib.figure import Figure

import vitkit
from vitkit.export import OnnxClassifier, export_onnx, quantize_dynamic
from vitkit.io import load_model_and_extra
from vitkit.models import VisionTransformer, vit_flops
from vitkit.prune import prune_heads
from vitkit.timing import interleaved_times

Runner = Callable[[torch.Tensor], torch.Tensor]


def eager(model: VisionTransformer) -> Runner:
    model.eval()

    def run(images: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode():
            return model(images)

    return run


def merged(model: VisionTransformer, r: int) -> VisionTransformer:
    """A copy of ``model`` merging ``r`` tokens per block (the weights shared)."""
    copy = VisionTransformer(model.config).eval()
    copy.load_state_dict(model.state_dict())
    return vitkit.merge_tokens(copy, r)


def int8(model: VisionTransformer, extra: dict[str, Any], folder: Path) -> Runner:
    """onnxruntime's dynamic int8 graph of ``model`` (exported in float32 first), run on as many
    intra-op threads as torch has at the call (onnxruntime keeps its own pool: one session per count)."""
    index = len(list(folder.iterdir()))
    float_graph = export_onnx(model, folder / f"{index}.onnx", extra=extra)
    graph = quantize_dynamic(float_graph, folder / f"{index}-int8.onnx")
    sessions = {threads: OnnxClassifier(graph, num_threads=threads) for threads in (1, 2)}

    def run(images: torch.Tensor) -> torch.Tensor:
        return sessions[min(torch.get_num_threads(), 2)](images)

    return run


def first_heads_pruned(model: VisionTransformer, fraction: float) -> VisionTransformer:
    """A copy of ``model`` without the first ``fraction`` of every block's heads (speed only)."""
    copy = merged(model, 0)
    return prune_heads(copy, {layer: range(int(heads * fraction)) for layer, heads in enumerate(copy.heads_per_layer())})


def images_per_second(runners: dict[str, Runner], images: torch.Tensor, threads: int, rounds: int) -> dict[str, float]:
    torch.set_num_threads(threads)
    times = interleaved_times({name: (lambda r=run: r(images)) for name, run in runners.items()}, repeats=rounds)
    return {name: len(images) / statistics.median(seconds) for name, seconds in times.items()}


def test_accuracy(runners: dict[str, Runner], model: VisionTransformer, extra: dict[str, Any],
                  max_images: int | None) -> dict[str, float]:
    """Top-1 (%) of every runner on the test split the model file records."""
    from vitkit.data import data_config_for
    from vitkit.prune.measure import eval_loaders

    splits = eval_loaders(data_config_for(extra, [], model), 256)
    loader = splits.test if splits.test is not None else splits.val
    correct, total = dict.fromkeys(runners, 0), 0
    for images, labels in loader:
        for name, run in runners.items():
            correct[name] += int((run(images).argmax(dim=-1) == labels).sum())
        total += len(labels)
        if max_images is not None and total >= max_images:
            break
    return {name: 100 * count / total for name, count in correct.items()}


def model_rows(label: str, base: VisionTransformer, extra: dict[str, Any], pruned: dict[str, VisionTransformer],
               rs: list[int], combine_r: int, args: argparse.Namespace, folder: Path) -> list[dict[str, Any]]:
    """Every row of one model: (name, runner, FLOPs) measured side by side."""
    rows: dict[str, tuple[Runner, int]] = {"baseline": (eager(base), vit_flops(base.config))}
    for r in rs:
        model = merged(base, r)
        rows[f"ToMe r={r}"] = (eager(model), vit_flops(model.config))
    for name, model in pruned.items():
        rows[name] = (eager(model), vit_flops(model.config))
    rows["int8 ONNX"] = (int8(base, extra, folder), vit_flops(base.config))
    half = pruned.get("prune 50%")
    if half is not None:
        model = merged(half, combine_r)
        rows[f"prune 50% + ToMe r={combine_r}"] = (eager(model), vit_flops(model.config))
        rows[f"prune 50% + ToMe r={combine_r} + int8"] = (int8(model, extra, folder), vit_flops(model.config))
    model = merged(base, combine_r)
    rows[f"ToMe r={combine_r} + int8"] = (int8(model, extra, folder), vit_flops(model.config))
    runners = {name: runner for name, (runner, _) in rows.items()}
    shape = (base.config.in_chans, *base.config.img_size)
    speed = {threads: images_per_second(runners, torch.randn(64, *shape), threads, args.rounds) for threads in (1, 2)}
    latency = images_per_second(runners, torch.randn(1, *shape), 1, args.rounds)
    accuracy = test_accuracy(runners, base, extra, args.max_test_images) if extra.get("data_config") else {}
    return [
        {"model": label, "row": name, "top1": accuracy.get(name), "gflops": flops / 1e9,
         "ips_1": speed[1][name], "ips_2": speed[2][name], "latency_ms": 1000 / latency[name]}
        for name, (_, flops) in rows.items()
    ]


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["| model | row | top-1 | GFLOPs | img/s (b64, 1 thr) | img/s (b64, 2 thr) | speed-up (2 thr) | latency b1 (ms) |",
             "|---|---|---|---|---|---|---|---|"]
    baseline = {row["model"]: row["ips_2"] for row in rows if row["row"] == "baseline"}
    for row in rows:
        top1 = "n/a" if row["top1"] is None else f"{row['top1']:.2f}%"
        lines.append(f"| {row['model']} | {row['row']} | {top1} | {row['gflops']:.3g} | {row['ips_1']:,.0f} "
                     f"| {row['ips_2']:,.0f} | {row['ips_2'] / baseline[row['model']]:.2f}x | {row['latency_ms']:.1f} |")
    return "\n".join(lines)


def figure(rows: list[dict[str, Any]], path: Path) -> None:
    fig = Figure(figsize=(7, 4.5))
    axes = fig.subplots()
    for row in rows:
        if row["top1"] is not None:
            axes.scatter(row["ips_2"], row["top1"])
            axes.annotate(row["row"], (row["ips_2"], row["top1"]), fontsize=7, xytext=(3, 3), textcoords="offset points")
    axes.set_xlabel("images/s (batch 64, 2 threads)")
    axes.set_ylabel("top-1 (%)")
    axes.set_title("accuracy against throughput")
    fig.tight_layout()
    fig.savefig(path, dpi=150)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fashion-mnist", type=Path, help="a Fashion-MNIST model file (with its data config)")
    parser.add_argument("--pruned", type=Path, nargs=2, metavar=("P25", "P50"),
                        help="the Fashion-MNIST model pruned by 25%% and 50%% with recovery (vitkit prune)")
    parser.add_argument("--r", type=int, nargs=3, default=[2, 4, 6], help="ToMe's r on the Fashion-MNIST model")
    parser.add_argument("--vit-r", type=int, nargs=3, default=[8, 13, 16], help="ToMe's r on ViT-S/16")
    parser.add_argument("--no-vit", action="store_true", help="leave ViT-S/16 out")
    parser.add_argument("--rounds", type=int, default=20, help="interleaved timing rounds")
    parser.add_argument("--max-test-images", type=int, default=None)
    parser.add_argument("--quick", action="store_true", help="3 rounds, ViT-S/16 only unless a model is given")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--figure", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds = 3
    args.out.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []

    def save() -> None:
        (args.out / "results.json").write_text(json.dumps(rows, indent=1))
        (args.out / "results.md").write_text(markdown(rows) + "\n")

    with tempfile.TemporaryDirectory(prefix="vitkit-efficiency-") as folder:
        if args.fashion_mnist is not None:
            base, extra = load_model_and_extra(args.fashion_mnist)
            pruned = {}
            if args.pruned:
                pruned = {name: load_model_and_extra(path)[0].eval()
                          for name, path in zip(("prune 25%", "prune 50%"), args.pruned)}
            rows += model_rows("Fashion-MNIST", base.eval(), extra, pruned, args.r, args.r[1], args, Path(folder))
            save()
        if not args.no_vit:
            base = vitkit.from_timm(timm.create_model("vit_small_patch16_224", pretrained=False)).eval()
            pruned = {f"prune {int(f * 100)}%": first_heads_pruned(base, f) for f in (0.25, 0.5)}
            rows += model_rows("ViT-S/16 224 (random)", base, {}, pruned, args.vit_r, args.vit_r[1], args, Path(folder))
            save()
    print(markdown(rows))
    if args.figure is not None:
        figure(rows, args.figure)


if __name__ == "__main__":
    main()
