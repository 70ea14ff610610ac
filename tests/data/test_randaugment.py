"""FixMatch's strong augmentation batched in torch (``vitkit.data.randaugment``): each operation
equals USB's PIL operation (``semilearn/datasets/augmentation/randaugment.py``, written out below)
on the same image and magnitude, for grayscale and RGB images; the random draws cover every
operation and magnitudes across their ranges; Cutout's square has USB's size and fill; the parts
equal PIL's past what RandAugment's ranges reach (equalize's larger images, blends past their ends,
every posterize bit count); no tensor is made off the batch's device."""

from __future__ import annotations

import numpy as np
import PIL.Image
import PIL.ImageEnhance
import PIL.ImageOps
import pytest
import torch

from vitkit.data.randaugment import (
    OPERATION_NAMES,
    OPERATIONS,
    BatchRandAugment,
    autocontrast,
    blend,
    equalize,
    grayscale,
    posterize,
)

# ---- microsoft/Semi-supervised-learning, semilearn/datasets/augmentation/randaugment.py (MIT), as written there


def AutoContrast(img, _):
    return PIL.ImageOps.autocontrast(img)


def Brightness(img, v):
    return PIL.ImageEnhance.Brightness(img).enhance(v)


def Color(img, v):
    return PIL.ImageEnhance.Color(img).enhance(v)


def Contrast(img, v):
    return PIL.ImageEnhance.Contrast(img).enhance(v)


def Equalize(img, _):
    return PIL.ImageOps.equalize(img)


def Identity(img, v):
    return img


def Posterize(img, v):
    v = int(v)
    v = max(1, v)
    return PIL.ImageOps.posterize(img, v)


def Rotate(img, v):
    return img.rotate(v)


def Sharpness(img, v):
    return PIL.ImageEnhance.Sharpness(img).enhance(v)


def ShearX(img, v):
    return img.transform(img.size, PIL.Image.AFFINE, (1, v, 0, 0, 1, 0))


def ShearY(img, v):
    return img.transform(img.size, PIL.Image.AFFINE, (1, 0, 0, v, 1, 0))


def TranslateX(img, v):
    v = v * img.size[0]
    return img.transform(img.size, PIL.Image.AFFINE, (1, 0, v, 0, 1, 0))


def TranslateY(img, v):
    v = v * img.size[1]
    return img.transform(img.size, PIL.Image.AFFINE, (1, 0, 0, 0, 1, v))


def Solarize(img, v):
    return PIL.ImageOps.solarize(img, v)


# ---- end of USB's code


def images(count: int, chans: int, seed: int = 0) -> np.ndarray:
    """``uint8 [N, 20, 24, C]`` test images: a bright object on a dark, noisy ground, of varied contrast."""
    rng = np.random.default_rng(seed)
    ys, xs = np.mgrid[0:20, 0:24]
    out = np.empty((count, 20, 24, chans), dtype=np.uint8)
    for index in range(count):
        blob = ((ys - rng.uniform(5, 15)) ** 2 + (xs - rng.uniform(6, 18)) ** 2 < rng.uniform(10, 40))
        low, high = rng.uniform(10, 60), rng.uniform(120, 250)
        for chan in range(chans):
            base = np.where(blob, high * rng.uniform(0.6, 1.0), low) + rng.normal(0, 12, blob.shape)
            out[index, :, :, chan] = np.clip(base, 0, 255).astype(np.uint8)
    return out


def pil_result(image: np.ndarray, name: str, value: float) -> np.ndarray:
    pil = PIL.Image.fromarray(image[..., 0] if image.shape[-1] == 1 else image)
    result = np.asarray(globals()[name](pil, value))
    return result[..., None] if result.ndim == 2 else result


@pytest.mark.parametrize("chans", [1, 3])
@pytest.mark.parametrize("name", OPERATION_NAMES)
def test_each_operation_equals_usbs_pil_operation(name: str, chans: int) -> None:
    batch_np = images(12, chans, seed=OPERATION_NAMES.index(name))
    index = OPERATION_NAMES.index(name)
    unit = torch.linspace(0.0, 1.0, 12)
    _, low, high = OPERATIONS[index]
    values = (low + (high - low) * unit).tolist()
    batch = torch.from_numpy(batch_np).permute(0, 3, 1, 2).float()
    ours = BatchRandAugment().apply(batch, torch.full((12,), index), unit).permute(0, 2, 3, 1).numpy()
    theirs = np.stack([pil_result(image, name, value) for image, value in zip(batch_np, values)]).astype(np.float32)
    difference = np.abs(ours - theirs)
    # Geometric operations may take a neighbouring pixel where a mapped point lies on a pixel border
    # (PIL computes in fixed point); every other pixel, and every pixel of the colour operations, is equal.
    assert (difference == 0).mean() >= (0.99 if name in ("Rotate", "ShearX", "ShearY") else 0.999), (name, difference.max())
    if name not in ("Identity",):  # the operation does something at these magnitudes (a test that cannot pass by accident)
        assert not np.array_equal(ours, batch_np.astype(np.float32)) or (name == "Color" and chans == 1)


def test_the_defaults_are_usbs_strong_view_three_operations_and_a_cutout_up_to_half_the_width() -> None:
    augment = BatchRandAugment(fill=(10.0,))
    calls = []
    original = augment.apply
    augment.apply = lambda *args: calls.append(1) or original(*args)
    augment(torch.full((2, 1, 16, 16), 200.0))
    assert len(calls) == 3
    # the largest square: side 1.0 * 0.5 * 16 = 8 centred at (8, 8), corner (4, 4): 8 x 8 pixels
    assert int((augment.cut(torch.full((1, 1, 16, 16), 200.0), torch.tensor([[1.0, 0.5, 0.5]])) == 10).sum()) == 64


def test_the_draws_cover_every_operation_and_each_range() -> None:
    augment = BatchRandAugment(num_ops=1, cutout=0.0)
    seen: list[torch.Tensor] = []
    original = augment.apply

    def spy(batch: torch.Tensor, ops: torch.Tensor, unit: torch.Tensor) -> torch.Tensor:
        seen.append(ops * 10 + (unit * 10).floor().clamp(max=9))
        return original(batch, ops, unit)

    augment.apply = spy
    torch.manual_seed(0)
    augment(torch.from_numpy(images(4, 1)).permute(0, 3, 1, 2).float().repeat(1000, 1, 1, 1))
    draws = torch.cat(seen).long()
    counts = torch.bincount(draws // 10, minlength=len(OPERATIONS))
    assert counts.min() >= 200  # 4000 draws of 14 operations: about 286 each
    assert len(torch.unique(draws % 10)) == 10  # magnitudes in every tenth of the range


def test_num_ops_operations_are_applied() -> None:
    torch.manual_seed(0)
    batch = torch.from_numpy(images(64, 1)).permute(0, 3, 1, 2).float()
    calls = []
    augment = BatchRandAugment(num_ops=3, cutout=0.0)
    original = augment.apply
    augment.apply = lambda *args: calls.append(1) or original(*args)
    out = augment(batch)
    assert len(calls) == 3 and out.shape == batch.shape
    assert bool(((out == out.round()) & (out >= 0) & (out <= 255)).all())


def test_cutout_is_usbs_square_filled_with_the_mean_colour() -> None:
    augment = BatchRandAugment(num_ops=0, cutout=0.5, fill=(10.0, 20.0, 30.0))
    batch = torch.full((3, 3, 16, 20), 200.0)
    # side v = 0.8 * 0.5 * 20 = 8; centre (0.5 * 20, 0.25 * 16) = (10, 4): corner (int(10 - 4), int(max(0, 4 - 4))) = (6, 0)
    unit = torch.tensor([[0.8, 0.5, 0.25], [0.0, 0.5, 0.5], [1.0, 0.99, 0.99]])
    out = augment.cut(batch, unit)
    hole = (out[0, 0] == 10).nonzero()
    assert hole[:, 0].tolist() == sorted(list(range(8)) * 8) and sorted(set(hole[:, 1].tolist())) == list(range(6, 14))
    assert out[0, :, 0, 6].tolist() == [10.0, 20.0, 30.0]
    assert bool((out[1] == 200).all())  # a side of 0: nothing cut
    # side 10 centred at (19.8, 15.84): corner (14, 10), clipped at the border: 6 x 6 pixels
    assert int((out[2, 0] == 10).sum()) == 6 * 6


def test_a_cutout_past_the_left_or_top_border_starts_at_the_first_column_or_row() -> None:
    augment = BatchRandAugment(num_ops=0, cutout=0.5, fill=(10.0,))
    # side v = 0.5 * 0.5 * 20 = 5; centre (0.05 * 20, 0.5 * 16) = (1, 8): corner (int(max(0, 1 - 2.5)), int(8 - 2.5)) = (0, 5),
    # so columns 0 to 4 and rows 5 to 9; the centre (10, 0.8) likewise gives columns 7 to 11 and rows 0 to 4
    out = augment.cut(torch.full((2, 1, 16, 20), 200.0), torch.tensor([[0.5, 0.05, 0.5], [0.5, 0.5, 0.05]]))
    expected = torch.full((2, 1, 16, 20), 200.0)
    expected[0, :, 5:10, 0:5] = 10.0
    expected[1, :, 0:5, 7:12] = 10.0
    assert torch.equal(out, expected)


def test_every_strong_view_gets_a_cutout_of_usbs_mean_size() -> None:
    torch.manual_seed(0)
    out = BatchRandAugment(num_ops=0, cutout=0.5, fill=(10.0,))(torch.full((4000, 1, 32, 32), 200.0))
    sides = (out == 10).flatten(1).sum(1).float()
    # a side v uniform in [0, 16) px from a whole corner covers about v + 0.5 columns and rows:
    # E[(v + 0.5)^2] = 93.6 px unclipped; the border clips some
    assert 0.97 < (sides > 0).float().mean() and 75 < sides.mean() < 93.6
    assert bool((BatchRandAugment(num_ops=0, cutout=0.0)(torch.full((8, 1, 32, 32), 200.0)) == 200).all())


def as_batch(array: np.ndarray) -> torch.Tensor:
    """``uint8 [N, H, W, C]`` images as the float ``[N, C, H, W]`` batch the augmentation takes."""
    return torch.from_numpy(array).permute(0, 3, 1, 2).float()


def pil_each(array: np.ndarray, operation: object) -> np.ndarray:
    """``operation`` (a PIL image to a PIL image) on each ``uint8 [N, H, W, C]`` image, as ``[N, C, H, W]``."""
    out = [np.asarray(operation(PIL.Image.fromarray(image[..., 0] if image.shape[-1] == 1 else image))) for image in array]
    return np.stack([image[..., None] if image.ndim == 2 else image for image in out]).transpose(0, 3, 1, 2)


@pytest.mark.parametrize("chans", [1, 3])
def test_equalize_equals_pils_where_its_step_is_above_one_and_where_it_is_zero(chans: int) -> None:
    """The comparison with USB's operations takes 20 x 24 images, whose ``step`` is 1 (``lut`` = the count below):
    64 x 64 images (steps near 16) round by ``step // 2`` and differ channel by channel; 8 x 8 images
    have ``step`` 0, which PIL leaves as they are."""
    large = np.concatenate([images(4, chans, seed=9).repeat(4, axis=1).repeat(3, axis=2)[:, :64, :64],
                            np.random.default_rng(1).integers(0, 256, (2, 64, 64, chans), dtype=np.uint8)])
    small = images(3, chans, seed=10)[:, :8, :8]
    for array in (large, small):
        ours = equalize(as_batch(array))
        assert ours.dtype == torch.float32
        assert np.array_equal(ours.numpy(), pil_each(array, PIL.ImageOps.equalize))
    assert not np.array_equal(pil_each(large, PIL.ImageOps.equalize), large.transpose(0, 3, 1, 2))


def test_autocontrast_stretches_two_neighbouring_values_to_black_and_white_and_keeps_a_flat_channel() -> None:
    """Hand-computed, as PIL's: a channel of values 100 and 101 becomes 0 and 255; a channel of one
    value (77, or 0) stays as it is; a channel of 0 and 255 too."""
    checks = np.indices((3, 3)).sum(axis=0) % 2  # a 3 x 3 checkerboard of 0 and 1
    image = np.stack([100 + checks, np.full((3, 3), 77), 255 * checks], axis=-1)[None].astype(np.uint8)
    ours = autocontrast(as_batch(image))
    assert ours.dtype == torch.float32
    assert ours[0].tolist() == [(255 * checks).tolist(), np.full((3, 3), 77).tolist(), (255 * checks).tolist()]
    assert np.array_equal(ours.numpy(), pil_each(image, PIL.ImageOps.autocontrast))
    assert torch.equal(autocontrast(torch.zeros(1, 1, 2, 2)), torch.zeros(1, 1, 2, 2))
    assert BatchRandAugment().apply(as_batch(image), torch.zeros(1, dtype=torch.long), torch.zeros(1)).dtype == torch.float32


@pytest.mark.parametrize(("enhance", "factor"), [(PIL.ImageEnhance.Brightness, 1.9), (PIL.ImageEnhance.Color, 2.5)])
def test_a_blend_past_its_ends_is_clipped_to_0_and_255_as_pils_enhancers(enhance: type, factor: float) -> None:
    """RandAugment's factors (0.05 to 0.95) stay between the two images; a factor above 1 extrapolates,
    above 255 (brightness) and below 0 (colour, away from the grey), where PIL clips."""
    array = images(4, 3, seed=11)
    batch = as_batch(array)
    degenerate = torch.zeros_like(batch) if enhance is PIL.ImageEnhance.Brightness else grayscale(batch).expand_as(batch)
    ours = blend(degenerate, batch, torch.full((4,), factor))
    theirs = pil_each(array, lambda image: enhance(image).enhance(factor))
    assert (theirs == 255).any() and (theirs == 0).any()
    assert (ours.numpy() == theirs).mean() >= 0.999


def test_posterize_keeps_the_top_bits_for_each_count_from_1_to_8_as_pil() -> None:
    array = images(8, 3, seed=12)
    bits = torch.arange(1, 9)
    theirs = np.stack([pil_each(array[i : i + 1], lambda image, b=int(b): PIL.ImageOps.posterize(image, b))[0]
                       for i, b in enumerate(bits)])
    assert np.array_equal(posterize(as_batch(array), bits).numpy(), theirs)


def test_the_grey_of_a_one_row_rgb_image_is_its_luma() -> None:
    array = images(3, 3, seed=13)[:, :1]  # 1 x 24 pixels
    grey = grayscale(as_batch(array))
    assert grey.shape == (3, 1, 1, 24)
    assert np.abs(grey.numpy() - pil_each(array, lambda image: image.convert("L"))).max() <= 1


@pytest.mark.parametrize("name", OPERATION_NAMES)
@pytest.mark.parametrize(("height", "width"), [(2, 2), (1, 5), (5, 2)])
def test_each_operation_on_an_image_under_3_pixels_in_a_side_equals_pils(name: str, height: int, width: int) -> None:
    # SMOOTH's 3x3 kernel does not fit such an image: PIL leaves it as it is, and the convolution failed
    array = images(4, 1, seed=17)[:, 5:5 + height, 6:6 + width]
    index = OPERATION_NAMES.index(name)
    _, low, high = OPERATIONS[index]
    unit = torch.tensor([0.0, 0.3, 0.7, 1.0])
    ours = BatchRandAugment().apply(as_batch(array), torch.full((4,), index), unit).numpy()
    theirs = np.stack([pil_result(image, name, low + (high - low) * float(u))
                       for image, u in zip(array, unit)]).transpose(0, 3, 1, 2)
    assert np.array_equal(ours, theirs), name  # the geometric ones too: no mapped point lies on a pixel border here
    strong = BatchRandAugment()(as_batch(array))  # 3 operations and a Cutout
    assert strong.shape == (4, 1, height, width)


def test_every_tensor_is_made_on_the_batchs_device() -> None:
    """On the meta device (no data), a tensor made on the host meets the batch's and fails: every
    operation runs on every image (each keeps the one it drew), and Cutout follows."""
    out = BatchRandAugment(num_ops=2, cutout=0.5, fill=(1.0, 2.0, 3.0))(torch.empty(4, 3, 8, 8, device="meta"))
    assert out.device.type == "meta" and out.shape == (4, 3, 8, 8)
