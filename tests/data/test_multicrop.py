"""DINO's batched multi-crop (``vitkit.data.multicrop``) against torchvision, piece by piece: the
colour jitter and grayscale are torchvision's ``adjust_brightness``, ``adjust_contrast``,
``adjust_saturation``, ``adjust_hue`` and ``rgb_to_grayscale`` at the factors drawn; the blur is torchvision's
``gaussian_blur`` at the sigma drawn; the crop boxes follow ``RandomResizedCrop.get_params``'s
distribution; a whole-image crop is the image, mirrored or resized as torchvision would; each
crop gets DINO's blur and solarisation probabilities; folders and grayscale arrays are cropped too.

The factors are replayed from the same seed in the order the batched code draws them (one draw
per image for each of jitter, brightness, contrast, saturation, hue, grayscale; one sigma per image),
the pixels then computed independently by torchvision."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import torchvision.transforms.functional as TF
from PIL import Image
from torch.utils.data import DataLoader, TensorDataset
from torchvision.transforms import RandomResizedCrop

from vitkit.data import ArrayDataset, multicrop
from vitkit.data.imagefolder import ImageFolderDataset
from vitkit.data.multicrop import MultiCrop, color_jitter, crop_boxes, gaussian_blur, multi_crop_dataset, resized_crops

MEAN, STD = (0.5,), (0.25,)


def images01(*shape: int, seed: int = 1) -> torch.Tensor:
    """Values in [0, 1] from their own generator, so the global RNG stays for the code's draws."""
    return torch.rand(*shape, generator=torch.Generator().manual_seed(seed))


def force(monkeypatch, **values) -> None:
    for name, value in values.items():
        monkeypatch.setattr(multicrop, name, value)


@pytest.mark.parametrize("chans", [3, 1])
def test_color_jitter_is_torchvisions_brightness_contrast_saturation_hue_and_grayscale(chans: int) -> None:
    crops = images01(32, chans, 5, 6)  # enough images that a strong jitter pushes pixels past 0 and 1
    torch.manual_seed(3)
    jittered = color_jitter(crops.clone())
    torch.manual_seed(3)  # the draws again, in the batched code's order
    jitter = torch.rand(32) < 0.8
    brightness, contrast = torch.empty(32).uniform_(0.6, 1.4), torch.empty(32).uniform_(0.6, 1.4)
    saturation = torch.empty(32).uniform_(0.8, 1.2) if chans == 3 else None
    hue = torch.empty(32).uniform_(0.9, 1.1) - 1 if chans == 3 else None
    gray = torch.rand(32) < 0.2 if chans == 3 else torch.zeros(32, dtype=torch.bool)
    assert jitter.any() and not jitter.all() and (gray.any() or chans == 1)
    for i, image in enumerate(crops):
        expected = image
        if jitter[i]:
            expected = TF.adjust_contrast(TF.adjust_brightness(expected, float(brightness[i])), float(contrast[i]))
            if chans == 3:
                expected = TF.adjust_hue(TF.adjust_saturation(expected, float(saturation[i])), float(hue[i]))
        if gray[i]:
            expected = TF.rgb_to_grayscale(expected, num_output_channels=3)
        # torchvision's luma weight for red is 0.2989, vitkit's 0.299: up to 1e-4 a pixel, then blended
        torch.testing.assert_close(jittered[i], expected, rtol=0, atol=5e-4)


def test_hue_is_torchvisions_adjust_hue_at_each_images_forced_shift() -> None:
    """Shifts up to half the colour wheel either way, on random colours, gray pixels (no hue) and
    pixels whose largest channel is tied (red and blue, green and blue)."""
    crops = images01(12, 3, 5, 6)
    crops[0] = 0.5
    crops[1, :, :2] = crops[1, :1, :2]
    crops[2] = torch.tensor([1.0, 0.2, 1.0]).view(3, 1, 1)
    crops[3] = torch.tensor([0.1, 0.7, 0.7]).view(3, 1, 1)
    shifts = torch.tensor([0.3, -0.2, 0.25, 0.1, 0.5, -0.5, 0.0, 0.05, -0.05, 0.45, -0.35, 0.1])
    turned = multicrop.adjust_hue(crops, shifts.view(-1, 1, 1, 1))
    for image, shift, ours in zip(crops, shifts, turned):
        torch.testing.assert_close(ours, TF.adjust_hue(image, float(shift)), rtol=0, atol=1e-5)
    assert (turned[4:] - crops[4:]).abs().amax(dim=(1, 2, 3))[[0, 1, 3]].min() > 0.05  # the colours did turn


def test_a_forced_hue_strength_turns_colour_crops_and_leaves_gray_ones(monkeypatch) -> None:
    force(monkeypatch, JITTER_PROBABILITY=1.0, BRIGHTNESS=0.0, CONTRAST=0.0, SATURATION=0.0, HUE=0.5,
          GRAYSCALE_PROBABILITY=0.0)
    crops = images01(8, 3, 4, 4)
    torch.manual_seed(5)
    jittered = color_jitter(crops.clone())
    torch.manual_seed(5)  # jitter, brightness, contrast, saturation, then the hue's draws
    torch.rand(8), torch.empty(8).uniform_(1, 1), torch.empty(8).uniform_(1, 1), torch.empty(8).uniform_(1, 1)
    hue = torch.empty(8).uniform_(0.5, 1.5) - 1
    for image, shift, ours in zip(crops, hue, jittered):
        torch.testing.assert_close(ours, TF.adjust_hue(image, float(shift)), rtol=0, atol=1e-5)
    gray = images01(8, 1, 4, 4)
    torch.testing.assert_close(color_jitter(gray.clone()), gray)


def test_gaussian_blur_is_torchvisions_at_each_images_sigma_and_leaves_the_others() -> None:
    for size in (8, 3):  # 3 pixels: the radius shrinks to 2 so the reflection fits
        crops = images01(6, 3, size, size)
        chosen = torch.tensor([True, False, True, True, False, True])
        torch.manual_seed(4)
        blurred = gaussian_blur(crops.clone(), chosen)
        torch.manual_seed(4)
        sigma = torch.empty(6).uniform_(0.1, 1.0)
        kernel = 7 if size == 8 else 5  # radius ceil(3 * 1.0) = 3, at most size - 1
        for i in range(6):
            expected = TF.gaussian_blur(crops[i], [kernel, kernel], [float(sigma[i])] * 2) if chosen[i] else crops[i]
            torch.testing.assert_close(blurred[i], expected, rtol=0, atol=1e-6)
    crops = images01(2, 1, 4, 4)
    torch.testing.assert_close(gaussian_blur(crops, torch.zeros(2, dtype=torch.bool)), crops)


def reference_boxes(count: int, height: int, width: int) -> torch.Tensor:
    """``[count, 4]`` (left, top, width, height) boxes of torchvision's ``RandomResizedCrop``."""
    image = torch.zeros(1, height, width)
    boxes = [RandomResizedCrop.get_params(image, [0.08, 1.0], [3 / 4, 4 / 3]) for _ in range(count)]
    return torch.tensor(boxes, dtype=torch.float32)[:, [1, 0, 3, 2]]  # from (top, left, h, w)


def test_the_blur_reaches_three_sigmas_of_the_largest_sigma(monkeypatch) -> None:
    """A sigma of 2 pixels: torchvision's kernel of 13 taps (3 sigmas each side), no fewer, no more."""
    force(monkeypatch, BLUR_SIGMA=(2.0, 2.0))
    crops = images01(2, 1, 16, 16)
    expected = TF.gaussian_blur(crops, [13, 13], [2.0, 2.0])
    torch.testing.assert_close(gaussian_blur(crops, torch.ones(2, dtype=torch.bool)), expected, rtol=0, atol=1e-6)


def test_crop_boxes_follow_torchvisions_random_resized_crop_distribution() -> None:
    """4,000 boxes of one batch against 4,000 of ``RandomResizedCrop.get_params`` (scale 0.08-1,
    ratio 3/4-4/3) on a 24 x 32 image: the same means and spreads of width, height and position
    (4 standard errors), positions spread alike over their room, the same share of full-height crops
    (and of full-width ones on a 32 x 16 image); every box inside the image, each image its own box."""
    height, width, count = 24, 32, 4000
    ours, theirs = crop_boxes(count, height, width, (0.08, 1.0)), reference_boxes(count, height, width)
    left, top, w, h = ours.unbind(1)
    assert (left >= 0).all() and (top >= 0).all() and (left + w <= width).all() and (top + h <= height).all()
    assert (w >= 1).all() and (h >= 1).all() and (ours == ours.round()).all()
    for column in range(4):
        assert abs(ours[:, column].mean() - theirs[:, column].mean()) < 0.55, column
        assert abs(ours[:, column].std() - theirs[:, column].std()) < 0.55, column
    for boxes, column, side in (((ours, theirs), 3, height), ((crop_boxes(2000, 32, 16, (0.08, 1.0)),
                                                               reference_boxes(2000, 32, 16)), 2, 16)):
        share, reference = ((found[:, column] == side).float().mean() for found in boxes)
        assert reference > 0.05 and abs(share - reference) < 0.04, column
    for column, side in ((0, width), (1, height)):  # a position uniform over 0 .. side - size, both ends reached
        room = [side - boxes[:, column + 2] for boxes in (ours, theirs)]
        spread = [boxes[:, column][r > 0] / r[r > 0] for boxes, r in zip((ours, theirs), room)]
        assert spread[0].min() == 0 and spread[0].max() == 1 and abs(spread[0].mean() - spread[1].mean()) < 0.03


def test_a_crop_too_large_for_every_attempt_falls_back_to_the_whole_image() -> None:
    boxes = crop_boxes(50, 4, 40, (0.9, 1.0))  # 144-160 px at ratio <= 4/3 never fits 4 rows
    assert boxes.tolist() == [[0.0, 0.0, 40.0, 4.0]] * 50


def test_a_whole_image_crop_is_the_image_mirrored_at_the_rate_asked_and_resized_as_torchvision() -> None:
    pixels = images01(5, 3, 8, 8)
    torch.testing.assert_close(resized_crops(pixels, 8, (1.0, 1.0), 0.0), pixels, rtol=0, atol=1e-6)
    torch.testing.assert_close(resized_crops(pixels, 8, (1.0, 1.0), 1.0), pixels.flip(-1), rtol=0, atol=1e-6)
    small = F.interpolate(pixels, size=(4, 4), mode="bilinear", align_corners=False, antialias=False)
    torch.testing.assert_close(resized_crops(pixels, 4, (1.0, 1.0), 0.0), small, rtol=0, atol=1e-6)
    ones = torch.ones(5, 1, 8, 8)  # an enlarged crop reads the border past its last pixel centres, not zeros
    torch.testing.assert_close(resized_crops(ones, 16, (1.0, 1.0), 0.5), torch.ones(5, 1, 16, 16))
    many = images01(400, 1, 8, 8)
    mirrored = (resized_crops(many, 8, (1.0, 1.0), 0.25) - many.flip(-1)).abs().amax(dim=(1, 2, 3)) < 1e-6
    assert 70 <= int(mirrored.sum()) <= 130  # 100 expected of 400 (sd 8.7)


def bilinear(image: torch.Tensor, xs: torch.Tensor, ys: torch.Tensor) -> torch.Tensor:
    """``image [C, H, W]`` read at pixel coordinates ``ys [h] x xs [w]`` (pixel centres at integers),
    bilinearly, coordinates past the outer centres clamped to them (a border that repeats)."""
    height, width = image.shape[1:]
    xs, ys = xs.clamp(0, width - 1), ys.clamp(0, height - 1)
    x0, y0 = xs.floor().long().clamp(max=width - 2), ys.floor().long().clamp(max=height - 2)
    fx, fy = xs - x0, ys - y0
    top = image[:, y0][:, :, x0] * (1 - fx) + image[:, y0][:, :, x0 + 1] * fx
    bottom = image[:, y0 + 1][:, :, x0] * (1 - fx) + image[:, y0 + 1][:, :, x0 + 1] * fx
    return top * (1 - fy)[:, None] + bottom * fy[:, None]


@pytest.mark.parametrize("hflip", [0.0, 1.0])
def test_each_crop_is_its_box_read_bilinearly_at_the_output_pixel_centres(hflip: float) -> None:
    """The crop of box (left, top, w, h) at ``size``: output pixel j's centre is at
    ``left + (j + 0.5) * w / size - 0.5`` in the input's pixels (counted from the right of the box
    when mirrored), and likewise down; the boxes are replayed from the same seed."""
    pixels, size = images01(6, 2, 12, 16), 5
    torch.manual_seed(5)
    crops = resized_crops(pixels, size, (0.1, 0.6), hflip)
    torch.manual_seed(5)
    boxes = crop_boxes(6, 12, 16, (0.1, 0.6))
    assert (boxes[:, :2] > 0).any(dim=0).all()  # boxes off the top-left corner, both ways
    steps = (torch.arange(size) + 0.5) / size
    for crop, image, (left, top, w, h) in zip(crops, pixels, boxes):
        xs = left + (1 - steps if hflip else steps) * w - 0.5
        torch.testing.assert_close(crop, bilinear(image, xs, top + steps * h - 0.5), rtol=0, atol=1e-5)


def plain_crops(monkeypatch, **values) -> MultiCrop:
    """Every random effect off but those in ``values``; whole-image crops of the image's size, unmirrored."""
    force(monkeypatch, JITTER_PROBABILITY=0.0, GRAYSCALE_PROBABILITY=0.0, BLUR_PROBABILITY=(0.0, 0.0, 0.0),
          SOLARIZE_PROBABILITY=0.0)
    force(monkeypatch, **values)
    return MultiCrop((0.0,), (1.0,), global_size=8, local_size=8, local_crops=2, global_scale=(1.0, 1.0),
                     local_scale=(1.0, 1.0), hflip=0.0)


def test_each_crop_is_blurred_with_dinos_probability_for_it(monkeypatch) -> None:
    """Of 400 images the first global crop is always blurred, the second about 10 %, the local ones 50 %
    (a sigma of 1 pixel, so that every blur shows)."""
    crops = plain_crops(monkeypatch, BLUR_PROBABILITY=(1.0, 0.1, 0.5), BLUR_SIGMA=(1.0, 1.0))  # DINO's rates
    images = (images01(400, 8, 8, 1) * 255).to(torch.uint8)
    plain = images.permute(0, 3, 1, 2).float() / 255
    blurred = [int(((view - plain).abs().amax(dim=(1, 2, 3)) > 1e-5).sum()) for view in crops(images)]
    assert blurred[0] == 400 and 20 <= blurred[1] <= 60 and all(160 <= n <= 240 for n in blurred[2:])


def test_only_the_second_global_crop_is_solarised_and_mirroring_defaults_to_half(monkeypatch) -> None:
    crops = plain_crops(monkeypatch, SOLARIZE_PROBABILITY=1.0)
    images = (images01(4, 8, 8, 1) * 255).to(torch.uint8)
    plain = images.permute(0, 3, 1, 2).float() / 255
    first, second, *local = crops(images)
    torch.testing.assert_close(first, plain)
    torch.testing.assert_close(second, torch.where(plain >= 0.5, 1 - plain, plain))
    for view in local:
        torch.testing.assert_close(view, plain)
    assert MultiCrop(MEAN, STD, global_size=8, local_size=4, local_crops=0).hflip == 0.5  # DINO's RandomHorizontalFlip


def test_a_grayscale_array_is_cropped_as_its_one_channel_image(monkeypatch) -> None:
    crops = plain_crops(monkeypatch)
    image = (images01(8, 8) * 255).numpy().astype(np.uint8)
    for view in crops.one(image):
        assert view.shape == (1, 8, 8)
        torch.testing.assert_close(view[0], torch.from_numpy(image).float() / 255)


def test_an_image_folder_gives_each_file_its_crops_and_other_datasets_are_refused(tmp_path, monkeypatch) -> None:
    crops = plain_crops(monkeypatch)
    files = []
    for index in range(3):  # colour files read as grayscale, as the folder's in_chans says
        Image.fromarray((images01(8, 8, 3, seed=index) * 255).numpy().astype(np.uint8)).save(tmp_path / f"{index}.png")
        files.append(tmp_path / f"{index}.png")
    folder = ImageFolderDataset(files, [2, 0, 1], transform=lambda image: torch.zeros(1), in_chans=1)
    dataset = multi_crop_dataset(folder, MultiCrop((0.0,), (1.0,), global_size=8, local_size=4, local_crops=1,
                                                   global_scale=(1.0, 1.0), hflip=0.0))
    assert [dataset[i][1] for i in range(3)] == [2, 0, 1]
    views, _ = dataset[1]
    assert [tuple(v.shape) for v in views] == [(1, 8, 8)] * 2 + [(1, 4, 4)]
    gray = np.asarray(Image.open(files[1]).convert("L"))
    torch.testing.assert_close(views[0][0], torch.from_numpy(gray.copy()).float() / 255)
    batch, labels = next(iter(DataLoader(dataset, batch_size=3)))
    assert labels.tolist() == [2, 0, 1] and tuple(batch[0].shape) == (3, 1, 8, 8)
    with pytest.raises(TypeError, match="multi-crop needs images in memory or in a folder, not a TensorDataset"):
        multi_crop_dataset(TensorDataset(torch.zeros(2, 3)), crops)


def test_an_in_memory_dataset_crops_each_loader_batch_in_one_call() -> None:
    """The module's promise: a batch of images is cut and resized at once, not image by image."""
    sizes: list[int] = []

    class Counted(MultiCrop):
        def __call__(self, images: torch.Tensor) -> list[torch.Tensor]:
            sizes.append(len(images))
            return super().__call__(images)

    images = (images01(6, 8, 8, 1) * 255).to(torch.uint8).numpy()
    dataset = multi_crop_dataset(ArrayDataset(images, np.arange(6), transform=lambda image: torch.zeros(1)),
                                 Counted(MEAN, STD, global_size=8, local_size=4, local_crops=1))
    views, labels = next(iter(DataLoader(dataset, batch_size=4)))
    assert sizes == [4] and labels.tolist() == [0, 1, 2, 3] and tuple(views[2].shape) == (4, 1, 4, 4)
