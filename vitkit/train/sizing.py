"""A model sized to the user's images: ``model.fit_to_images: true`` (the ``*_imagefolder``
pre-training recipes) picks the image size and the encoder from the images' median shorter side
(:class:`~vitkit.data.FolderSample`), for a 15-minute budget on 2 CPU cores.

Every tier has a 4x4 to 8x8 grid of tokens, small enough for a CPU epoch over tens of thousands of
images in a minute or two; larger images get a wider, deeper encoder, as their patches hold more.
A key the recipe line sets itself (``data.img_size=96``, ``model.depth=8``) wins over the tier.
The table is in docs/pretrain.md.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from ..data import FolderSample
from .config import RecipeConfig


@dataclass(frozen=True)
class SizeTier:
    """The image size and encoder for images up to ``max_side`` pixels on their shorter side."""

    max_side: int
    img_size: int
    model: dict[str, Any]


#: Smallest first. The first tier is recipes/fashion_mnist_fast.yaml's encoder with linear patches
#: (a convolutional stem would show MAE the pixels of the patches it hides).
SIZE_TIERS = (
    SizeTier(40, 32, {"patch_size": 8, "embed_dim": 128, "depth": 4, "num_heads": 4, "locality": True}),
    SizeTier(96, 64, {"patch_size": 8, "embed_dim": 192, "depth": 6, "num_heads": 3, "locality": True}),
    SizeTier(1 << 30, 96, {"patch_size": 12, "embed_dim": 192, "depth": 6, "num_heads": 3, "locality": True}),
)


def tier_for(side: int) -> SizeTier:
    """The first tier of :data:`SIZE_TIERS` whose ``max_side`` holds ``side`` pixels."""
    return next(tier for tier in SIZE_TIERS if side <= tier.max_side)


def fit_to_images(config: RecipeConfig, sample: FolderSample | None) -> tuple[RecipeConfig, str | None]:
    """``config`` with the image size and the encoder keys it leaves unset taken from the tier of
    ``sample``'s images, and the ``note:`` line that says so; unchanged (``None``) unless the recipe
    sets ``model.fit_to_images`` and reads an image folder without starting from weights."""
    if not config.model.fit_to_images or sample is None or config.model.pretrained is not None:
        return config, None
    tier = tier_for(sample.side)
    chosen = {key: value for key, value in tier.model.items() if getattr(config.model, key) is None}
    data = config.data if config.data.img_size is not None else dataclasses.replace(config.data, img_size=tier.img_size)
    config = dataclasses.replace(config, data=data, model=dataclasses.replace(config.model, **chosen))
    size = config.data.resolved_img_size()[0]
    said = ", ".join(f"model.{key}={str(value).lower() if isinstance(value, bool) else value}" for key, value in chosen.items())
    return config, (
        f"note: the images are about {sample.side} px (median shorter side of {sample.count}): resized to {size} px "
        f"for a {config.model.depth or '?'}-block encoder ({said or 'the recipe keys'}); set data.img_size or "
        "those keys to choose (docs/pretrain.md, 'Sized to your images')."
    )
