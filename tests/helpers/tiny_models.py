"""Tiny models shared by tests (imported by test modules): a 2-block, 4-head model on 8x8 images
with toy batches for pruning, and a 3-head model on 32x32 shapes saved as a model file."""

from __future__ import annotations

from pathlib import Path

import torch
from torch.utils.data import Dataset

import vitkit
from vitkit.data import shapes_info

#: The shapes data a :func:`save_tiny` model file names as its training data.
TINY_SHAPES = {"name": "shapes", "img_size": 32, "num_workers": 0, "shapes_num_samples": 60, "test_fraction": 0.2}
#: Depth, heads per layer and width of :func:`tiny_model`.
DEPTH, HEADS, DIM = 2, 4, 16


def tiny_model() -> vitkit.VisionTransformer:
    """A random 3-class ViT on 8x8 RGB images (4 patches), in eval mode."""
    return vitkit.create_model(
        "vit_cifar_tiny", img_size=8, patch_size=4, embed_dim=DIM, depth=DEPTH, num_heads=HEADS, num_classes=3
    ).eval()


def toy_batches(count: int = 2, batch: int = 8) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``count`` seeded batches of ``batch`` random 8x8 images with random labels of 3 classes."""
    generator = torch.Generator().manual_seed(1)
    return [
        (torch.randn(batch, 3, 8, 8, generator=generator), torch.randint(0, 3, (batch,), generator=generator))
        for _ in range(count)
    ]


def tiny_shapes_model() -> vitkit.VisionTransformer:
    """A random 6-class ViT on 32x32 RGB images (16 patches of 8x8), in eval mode."""
    return vitkit.create_model("vit_cifar_tiny", patch_size=8, embed_dim=24, depth=2, num_heads=3, num_classes=6).eval()


def save_tiny(model: vitkit.VisionTransformer, path: Path) -> Path:
    """``model`` saved at ``path`` with the shapes data's preprocessing and :data:`TINY_SHAPES`."""
    extra = {**shapes_info(32).to_extra(), "data_config": TINY_SHAPES}
    return vitkit.save_model(model, path, extra=extra)


def hand_accuracy(model: torch.nn.Module, split: Dataset) -> float:
    """Percent of ``split``'s images whose largest logit is their label, all in one batch."""
    images, labels = zip(*(split[i] for i in range(len(split))))
    with torch.no_grad():
        predictions = model.eval()(torch.stack(images)).argmax(dim=-1)
    return 100.0 * sum(int(p) == int(y) for p, y in zip(predictions, labels)) / len(labels)
