"""Random erasing (Zhong et al. 2017, arXiv 1708.04896): the batched version against timm's
``RandomErasing`` (the reference) on the rectangle's area and aspect distribution, and the recipe
keys reaching both the batched and the per-image transforms."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from timm.data.random_erasing import RandomErasing

from vitkit.data import AugmentConfig
from vitkit.data.batch_transforms import BatchRandomErasing, build_batch_transform
from vitkit.data.info import DataInfo
from vitkit.data.transforms import build_train_transform
from vitkit.schema import ConfigError, build

INFO = DataInfo(10, tuple("abcdefghij"), (28, 28), 1, (0.5,), (0.25,), "test")


def augment_config(values: dict) -> AugmentConfig:
    return build(AugmentConfig, values, source="the test")


def rectangles(erased: torch.Tensor) -> torch.Tensor:
    """``[B, H, W]`` boolean masks to ``[B, 2]`` (h, w) of their bounding boxes, after checking each
    non-empty mask is exactly its bounding box (one solid rectangle)."""
    rows, cols = erased.any(dim=2), erased.any(dim=1)
    sizes = torch.stack([rows.sum(1), cols.sum(1)], dim=1)
    assert torch.equal(erased.sum((1, 2)), sizes[:, 0] * sizes[:, 1])  # solid: area = h * w
    return sizes


def erase_sizes(erase, count: int, seed: int) -> torch.Tensor:
    """(h, w) of the rectangles ``erase`` cut from ``count`` all-ones 28x28 images (0 where none)."""
    torch.manual_seed(seed)
    random.seed(seed)
    out = erase(torch.ones(count, 1, 28, 28))
    return rectangles(out[:, 0] == 0)


def test_batched_erasing_has_timms_area_and_aspect_distribution() -> None:
    count = 4000
    ours = erase_sizes(BatchRandomErasing(1.0), count, 0).double()
    theirs = erase_sizes(RandomErasing(1.0, device="cpu"), count, 1).double()
    assert (ours.prod(1) > 0).all() and (theirs.prod(1) > 0).all()  # probability 1: every image erased
    area_ours, area_theirs = ours.prod(1) / 784, theirs.prod(1) / 784
    # timm's stated range (0.02 to 1/3 of the image), up to the rounding of h and w
    assert area_ours.min() >= 0.01 and area_ours.max() <= 0.40
    assert (ours < 28).all()  # a rectangle never spans the whole image, as timm requires
    for q in (0.1, 0.25, 0.5, 0.75, 0.9):
        assert abs(area_ours.quantile(q) - area_theirs.quantile(q)) < 0.02, q
    aspect_ours, aspect_theirs = (ours[:, 0] / ours[:, 1]).log(), (theirs[:, 0] / theirs[:, 1]).log()
    assert abs(aspect_ours.mean() - aspect_theirs.mean()) < 0.06
    assert abs(aspect_ours.std() - aspect_theirs.std()) < 0.06
    # positions: uniform, so the rectangles' centres average to the image centre
    torch.manual_seed(2)
    erased = BatchRandomErasing(1.0)(torch.ones(count, 1, 28, 28))[:, 0] == 0
    rows = torch.arange(28.0).view(1, -1, 1)
    centre = (erased * rows).sum((1, 2)) / erased.sum((1, 2))
    assert abs(centre.mean() - 13.5) < 0.3


def test_erasing_probability_is_the_share_of_erased_images_and_zero_is_the_identity() -> None:
    sizes = erase_sizes(BatchRandomErasing(0.3), 4000, 3)
    assert abs((sizes.prod(1) > 0).double().mean() - 0.3) < 0.03
    batch = torch.randn(64, 3, 16, 16)
    assert torch.equal(BatchRandomErasing(0.0)(batch), batch)
    off = augment_config({"crop": "pad", "padding": 1, "hflip": 0.5, "random_erasing": 0.0})
    assert build_batch_transform(off, INFO, (28, 28)).erase is None


@pytest.mark.parametrize("mode", ["const", "rand", "pixel"])
def test_erasing_modes_fill_as_timm_does(mode: str) -> None:
    torch.manual_seed(0)
    batch = torch.full((200, 3, 28, 28), 5.0)  # a value none of the fills takes
    out = BatchRandomErasing(1.0, mode=mode)(batch)
    erased = out != 5.0
    assert torch.equal(erased[:, 0], erased[:, 1])  # every channel of the rectangle is erased
    values = out[erased].view(-1)
    if mode == "const":
        assert (values == 0).all()
    else:
        assert abs(values.mean()) < 0.1 and abs(values.std() - 1) < 0.1  # standard normal
        one = out[0][:, erased[0, 0]]  # [C, pixels] of the first image's rectangle
        constant_per_channel = bool((one == one[:, :1]).all())
        assert constant_per_channel == (mode == "rand")


def test_recipe_keys_reach_the_batched_and_the_per_image_transforms() -> None:
    augment = augment_config({"crop": "pad", "padding": 1, "hflip": 0.5, "random_erasing": 1.0,
                                    "erasing_area": [0.1, 0.2], "erasing_aspect": [1.0, 1.0]})
    batched = build_batch_transform(augment, INFO, (28, 28))
    assert isinstance(batched.erase, BatchRandomErasing)
    torch.manual_seed(0)
    out = batched(torch.full((500, 28, 28, 1), 255, dtype=torch.uint8))
    sizes = rectangles(out[:, 0] == 0)
    area = sizes.prod(1).double() / 784
    assert (sizes[:, 0] == sizes[:, 1]).all()  # aspect fixed at 1: squares
    assert area.min() >= 0.08 and area.max() <= 0.23  # 0.1 to 0.2, up to rounding
    per_image = build_train_transform(augment, INFO)
    assert isinstance(per_image.erase, RandomErasing) and per_image.erase.min_area == 0.1
    random.seed(0)
    image = per_image(np.full((28, 28, 1), 255, dtype=np.uint8))
    erased = image[0] == 0
    assert erased.any() and rectangles(erased[None])[0, 0] == rectangles(erased[None])[0, 1]


def test_misordered_erasing_ranges_are_refused_by_name() -> None:
    with pytest.raises(ConfigError, match="erasing_area"):
        augment_config({"erasing_area": [0.3, 0.1]})
    with pytest.raises(ConfigError, match="random_erasing"):
        augment_config({"random_erasing": 1.5})
