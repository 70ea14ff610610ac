"""Issue 17 item 5's measurements on trained Fashion-MNIST models (docs/results.md has the tables).

    python dev/modern_vit_fashion_mnist.py resolution MODEL [MODEL ...] --sizes 28 35 42
    python dev/modern_vit_fashion_mnist.py registers MODEL [MODEL ...]

``resolution``: test top-1 of each model (``dynamic_img_size``) on the test images resized to each
size (vitkit's data pipeline upsamples them), through :func:`vitkit.train.evaluate`.

``registers``: over the test set at the training size, per layer, (1) the share of the class
token's attention that goes to its most-attended token (mean over images and heads) and how often
that token is a register, (2) the attention mass on the class token and on the registers
(:func:`vitkit.explain.head_stats.attention_statistics`, the ``vitkit report`` numbers), and
(3) Darcet et al.'s (arXiv 2309.16588) artifact: patch tokens out of the last block whose norm is
above ``--factor`` times the median patch-token norm over the test set.

Prints one JSON object per model.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from torch.utils.data import DataLoader

from vitkit.data import datasets_for
from vitkit.explain.head_stats import HeadStats, attention_statistics
from vitkit.train import evaluate
from vitkit.train.checkpoint import load_for_inference


def resolution_accuracy(model_path: Path, sizes: list[int]) -> dict[str, float]:
    """Test top-1 (percent) of ``model_path`` at each square image size."""
    return {str(size): evaluate(model_path, [f"img_size={size}", "num_workers=0"])["top1"] for size in sizes}


@torch.no_grad()
def register_statistics(model_path: Path, factor: float, batch_size: int = 250) -> dict[str, object]:
    """The class token's top-attention share per layer, the sink shares and the high-norm patch count."""
    model, extra = load_for_inference(model_path)
    prefix, registers = model.num_prefix_tokens, model.config.reg_tokens
    test = datasets_for(model, extra, ["num_workers=0"]).test
    top_share: list[torch.Tensor] = []  # per batch [L], summed over images and heads
    top_is_register: list[torch.Tensor] = []
    norms: list[torch.Tensor] = []  # per batch [B, P]: last block's patch tokens, before the final norm
    stats: HeadStats | None = None
    heads = 0
    for images, _ in DataLoader(test, batch_size=batch_size):
        out = model.forward_intermediates(images, output_fmt="NLC", intermediates_only=True, return_attention=True)
        cls_rows = torch.stack([a[:, :, 0, :] for a in out.attentions])  # [L, B, H, N]
        heads = cls_rows.shape[2]
        share, index = cls_rows.max(dim=-1)  # [L, B, H]
        top_share.append(share.sum(dim=(1, 2)))
        top_is_register.append(((index >= prefix - registers) & (index < prefix)).sum(dim=(1, 2)).float())
        norms.append(out.intermediates[-1].norm(dim=-1))
        batch_stats = attention_statistics(out.attentions, prefix, registers)
        stats = batch_stats if stats is None else stats.merge(batch_stats)
    assert stats is not None
    count = stats.num_images * heads
    patch_norms = torch.cat(norms)  # [images, P]
    median = patch_norms.median()
    high = patch_norms > factor * median
    cls_sink, reg_sink = stats.sink_shares()
    return {
        "reg_tokens": registers,
        "images": stats.num_images,
        "cls_top_share": [round(v, 4) for v in (torch.stack(top_share).sum(0) / count).tolist()],
        "cls_top_is_register": [round(v, 4) for v in (torch.stack(top_is_register).sum(0) / count).tolist()],
        "cls_sink": [round(v, 4) for v in cls_sink.tolist()],
        "reg_sink": [round(v, 4) for v in reg_sink.nan_to_num(0.0).tolist()],
        "median_norm": round(float(median), 3),
        "max_over_median": round(float(patch_norms.max() / median), 3),
        "high_norm_tokens": int(high.sum()),
        "images_with_high_norm": int(high.any(dim=1).sum()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("measure", choices=["resolution", "registers"])
    parser.add_argument("models", nargs="+", type=Path, help="model.safetensors files of dynamic_img_size runs")
    parser.add_argument("--sizes", nargs="+", type=int, default=[28, 35, 42], help="test image sizes (resolution)")
    parser.add_argument("--factor", type=float, default=4.0, help="high norm: above this times the median")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    for path in args.models:
        if args.measure == "resolution":
            result: dict[str, object] = {"top1": resolution_accuracy(path, args.sizes)}
        else:
            result = register_statistics(path, args.factor)
        print(json.dumps({"model": str(path), **result}), flush=True)


if __name__ == "__main__":
    main()
