"""vitkit.data: loaders, splits, transforms and config validation, on tiny local data."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from urllib.error import URLError

import numpy as np
import pytest
import torch
from cifar_files import PER_BATCH, dump, fabricate_cifar10
from PIL import Image

from vitkit.data import (
    AugmentConfig,
    CifarFileError,
    DataConfig,
    DataInfo,
    ImageReadError,
    ShapesDataset,
    build_datasets,
    build_eval_transform,
    build_train_transform,
    denormalize,
    generate_shapes,
    load_image,
    shapes_info,
    stratified_split,
)
from vitkit.data import cifar as cifar_module


@pytest.fixture
def cifar10_root(tmp_path: Path) -> Path:
    return fabricate_cifar10(tmp_path)


def _save_image(path: Path, size: tuple[int, int] = (12, 10), mode: str = "RGB", value: int = 128) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new(mode, size, value if mode == "L" else (value,) * len(mode)).save(path)
    return path


@pytest.fixture
def folder_root(tmp_path: Path) -> Path:
    """root/{train,val}/{cat,dog}/ with 3 train and 2 val PNGs per class, one corrupt train file."""
    for split, count in (("train", 3), ("val", 2)):
        for name in ("cat", "dog"):
            for i in range(count):
                _save_image(tmp_path / split / name / f"{i}.png", value=40 * i)
    (tmp_path / "train" / "dog" / "broken.png").write_bytes(b"\x89PNG not really an image")
    (tmp_path / "train" / "dog" / "notes.txt").write_text("not an image extension: ignored")
    return tmp_path


# --- CIFAR -----------------------------------------------------------------------------------


def test_cifar10_reads_official_pickle_layout_as_hwc_rgb(cifar10_root: Path) -> None:
    images, labels, test_images, test_labels, names = cifar_module.load_cifar("cifar10", cifar10_root, False)
    assert images.shape == (5 * PER_BATCH, 32, 32, 3) and images.dtype == np.uint8
    assert images[0, 0, 0].tolist() == [10, 20, 30]  # plane order R, G, B
    assert test_images[0, 5, 7].tolist() == [10, 20, 35]  # test_batch is file index 5
    assert labels.tolist()[:3] == [0, 1, 2] and len(test_labels) == PER_BATCH
    assert names == [f"class{i}" for i in range(10)]


def test_cifar10_bundle_holds_out_stratified_val_and_uses_test_batch(cifar10_root: Path) -> None:
    bundle = build_datasets(DataConfig(name="cifar10", root=str(cifar10_root), val_fraction=0.1))
    assert (len(bundle.train), len(bundle.val), len(bundle.test)) == (90, 10, 20)
    assert sorted(bundle.val.labels.tolist()) == list(range(10))
    image, label = bundle.train[0]
    assert image.shape == (3, 32, 32) and image.dtype == torch.float32 and isinstance(label, int)
    assert bundle.info.mean == (0.4914, 0.4822, 0.4465) and bundle.info.num_classes == 10


def test_cifar100_reads_fine_labels(tmp_path: Path) -> None:
    folder = tmp_path / "cifar-100-python"
    folder.mkdir()
    for name in ("train", "test"):
        data = np.full((200, 3072), 7, dtype=np.uint8)
        dump(folder / name, {"data": data, "fine_labels": [i % 100 for i in range(200)], "coarse_labels": [0] * 200})
    dump(folder / "meta", {"fine_label_names": [f"f{i}" for i in range(100)], "coarse_label_names": ["c"]})
    bundle = build_datasets(DataConfig(name="cifar100", root=str(tmp_path), val_fraction=0.5))
    assert (len(bundle.train), len(bundle.val), len(bundle.test)) == (100, 100, 200)
    assert bundle.info.class_names[99] == "f99"


def test_missing_cifar_says_where_to_put_the_folder(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="cifar-10-batches-py") as info:
        build_datasets(DataConfig(name="cifar10", root=str(tmp_path)))
    assert str(tmp_path) in str(info.value) and "download" in str(info.value)


def test_failed_download_explains_offline_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def offline(*args: object, **kwargs: object) -> None:
        raise URLError("no network")

    monkeypatch.setattr(cifar_module, "download_and_extract_archive", offline)
    with pytest.raises(FileNotFoundError, match="cifar-100-python.*download=false"):
        build_datasets(DataConfig(name="cifar100", root=str(tmp_path), download=True))


class _Exploit:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (os.system, (f"touch {self.marker}",))


def test_tampered_cifar_pickle_is_refused_without_running_code(cifar10_root: Path) -> None:
    marker = cifar10_root / "pwned"
    dump(cifar10_root / "cifar-10-batches-py" / "data_batch_3", {"data": _Exploit(marker), "labels": []})
    with pytest.raises(CifarFileError, match="data_batch_3.*refusing to load global"):
        build_datasets(DataConfig(name="cifar10", root=str(cifar10_root)))
    assert not marker.exists()


# --- image folders ---------------------------------------------------------------------------


def test_corrupt_image_raises_naming_the_file_by_default(folder_root: Path) -> None:
    with pytest.raises(ImageReadError, match="broken.png.*skip_corrupt") as info:
        build_datasets(DataConfig(name="imagefolder", root=str(folder_root), img_size=16))
    assert info.value.path.name == "broken.png"


def test_skip_corrupt_drops_counts_and_logs_the_file(folder_root: Path, caplog: pytest.LogCaptureFixture) -> None:
    cfg = DataConfig(name="imagefolder", root=str(folder_root), img_size=16, skip_corrupt=True)
    with caplog.at_level(logging.WARNING):
        bundle = build_datasets(cfg)
    assert len(bundle.train) == 6 and bundle.train.num_skipped == 1 and bundle.val.num_skipped == 0
    assert "skipped 1 unreadable" in caplog.text and "broken.png" in caplog.text
    image, label = bundle.train[5]
    assert image.shape == (3, 16, 16) and label == 1
    assert bundle.test is bundle.val and bundle.info.class_names == ("cat", "dog")


def test_unverified_corrupt_image_fails_at_load_naming_the_file(folder_root: Path) -> None:
    bundle = build_datasets(DataConfig(name="imagefolder", root=str(folder_root), img_size=16, verify_images=False))
    broken = [i for i, path in enumerate(bundle.train.files) if path.name == "broken.png"]
    with pytest.raises(ImageReadError, match="broken.png"):
        bundle.train[broken[0]]


def test_truncated_jpeg_is_caught_by_the_verification_pass(folder_root: Path) -> None:
    path = folder_root / "val" / "cat" / "cut.jpg"
    noise = np.random.default_rng(0).integers(0, 255, (64, 64, 3), dtype=np.uint8)
    Image.fromarray(noise).save(path, quality=90)
    path.write_bytes(path.read_bytes()[:600])
    cfg = DataConfig(name="imagefolder", root=str(folder_root), img_size=16, skip_corrupt=True)
    assert build_datasets(cfg).val.skipped == [path]


def test_imagefolder_test_split_and_grayscale_option(folder_root: Path) -> None:
    _save_image(folder_root / "test" / "dog" / "0.png", mode="RGBA")
    cfg = DataConfig(name="imagefolder", root=str(folder_root), img_size=16, in_chans=1, skip_corrupt=True)
    bundle = build_datasets(cfg)
    assert len(bundle.test) == 1 and bundle.test[0][0].shape == (1, 16, 16)
    assert bundle.info.in_chans == 1 and len(bundle.info.mean) == 1


def test_missing_image_folder_describes_the_layout(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"train/<class>/<image>, root/val/<class>"):
        build_datasets(DataConfig(name="imagefolder", root=str(tmp_path / "nowhere")))


def test_load_image_converts_channels_and_names_bad_files(tmp_path: Path) -> None:
    rgba = Image.new("RGBA", (4, 4), (0, 0, 0, 0))
    rgba.save(tmp_path / "clear.png")
    assert np.asarray(load_image(tmp_path / "clear.png", 3)).tolist()[0][0] == [255, 255, 255]
    assert load_image(_save_image(tmp_path / "gray.png", mode="L"), 3).mode == "RGB"
    assert load_image(_save_image(tmp_path / "rgb.png"), 1).mode == "L"
    (tmp_path / "junk.jpg").write_bytes(b"junk")
    for bad in ("junk.jpg", "missing.png"):
        with pytest.raises(ImageReadError, match=bad):
            load_image(tmp_path / bad)


# --- digits ----------------------------------------------------------------------------------


def test_digits_split_is_70_10_20_stratified_and_disjoint() -> None:
    labels = np.arange(1797) % 10
    train, val, test = stratified_split(labels, (0.1, 0.2), seed=0)
    assert len(train) + len(val) + len(test) == 1797
    assert np.unique(np.concatenate([train, val, test])).size == 1797
    assert abs(len(val) - 180) <= 5 and abs(len(test) - 359) <= 5
    assert np.bincount(labels[val]).min() == 18


def test_digits_are_deterministic_by_seed() -> None:
    first, again = (build_datasets(DataConfig(name="digits", seed=3)) for _ in range(2))
    other = build_datasets(DataConfig(name="digits", seed=4))
    assert len(first.train) + len(first.val) + len(first.test) == 1797
    assert np.array_equal(first.val.images, again.val.images)
    assert not np.array_equal(first.val.images, other.val.images)


def test_digits_eval_images_are_normalised_and_single_channel() -> None:
    bundle = build_datasets(DataConfig(name="digits", img_size=24))
    batch = torch.stack([bundle.test[i][0] for i in range(len(bundle.test))])
    assert batch.shape == (len(bundle.test), 1, 24, 24)
    assert abs(batch.mean().item()) < 0.1 and abs(batch.std().item() - 1.0) < 0.15
    assert DataConfig(name="digits").resolved().augment.hflip == 0.0


def test_digits_replicated_to_three_channels() -> None:
    bundle = build_datasets(DataConfig(name="digits", in_chans=3))
    image = bundle.val[0][0]
    assert image.shape == (3, 32, 32) and torch.equal(image[0], image[2])
    assert bundle.info.mean == (0.305,) * 3


# --- shapes ----------------------------------------------------------------------------------


def test_shapes_are_deterministic_and_balanced() -> None:
    images, labels, boxes = generate_shapes(60, 32, seed=5)
    again = generate_shapes(60, 32, seed=5)
    assert np.array_equal(images, again[0]) and np.array_equal(boxes, again[2])
    assert not np.array_equal(images, generate_shapes(60, 32, seed=6)[0])
    assert np.bincount(labels).tolist() == [10] * 6


def test_shape_boxes_are_tight_around_the_object_pixels() -> None:
    images, _, boxes = generate_shapes(120, (32, 40), seed=1, noise_std=0.0)
    for image, (x0, y0, x1, y1) in zip(images, boxes):
        assert 0 <= x0 < x1 <= 40 and 0 <= y0 < y1 <= 32
        # Without noise every pixel not of the background colour (that of the corner, which
        # no shape reaches) belongs to the object.
        ys, xs = np.nonzero((image != image[0, 0]).any(axis=-1))
        assert (xs.min(), ys.min(), xs.max() + 1, ys.max() + 1) == (x0, y0, x1, y1)


def test_shapes_dataset_boxes_index_the_returned_image() -> None:
    dataset = ShapesDataset(num_samples=12, img_size=32, seed=2)
    image, label = dataset[3]
    restored = denormalize(image, shapes_info(32)).permute(1, 2, 0).numpy()
    assert image.shape == (3, 32, 32) and label == int(dataset.labels[3])
    assert np.abs(restored * 255 - dataset.images[3]).max() < 1.0
    assert dataset.boxes.shape == (12, 4)


def test_textured_shapes_are_deterministic_with_the_flat_geometry() -> None:
    images, labels, boxes = generate_shapes(60, 32, seed=5, style="textured")
    again = generate_shapes(60, 32, seed=5, style="textured")
    assert np.array_equal(images, again[0]) and np.array_equal(boxes, again[2])
    flat_images, flat_labels, flat_boxes = generate_shapes(60, 32, seed=5)
    # Same seed, same objects and boxes; only the rendering differs.
    assert np.array_equal(labels, flat_labels) and np.array_equal(boxes, flat_boxes)
    assert not np.array_equal(images, flat_images)
    with pytest.raises(ValueError, match="style"):
        generate_shapes(6, 32, style="wavy")  # type: ignore[arg-type]


def test_textured_shapes_keep_exact_boxes_and_texture_objects_and_background() -> None:
    size, scale = (32, 40), (0.25, 0.55)
    flat, _, boxes = generate_shapes(120, size, seed=1, noise_std=0.0, scale=scale)
    textured, _, textured_boxes = generate_shapes(120, size, seed=1, noise_std=0.0, scale=scale, style="textured")
    assert np.array_equal(boxes, textured_boxes)
    for plain, image, (x0, y0, x1, y1) in zip(flat, textured, boxes):
        # The noiseless flat rendering marks the object pixels, and they fill the box tightly.
        mask = (plain != plain[0, 0]).any(axis=-1)
        ys, xs = np.nonzero(mask)
        assert (xs.min(), ys.min(), xs.max() + 1, ys.max() + 1) == (x0, y0, x1, y1)
        # Textured: the object is no flat colour (stripes, checkers or speckles, even without noise),
        # and the background is not uniform either (blobs and strokes).
        assert image[mask].astype(np.float32).std(axis=0).max() > 8.0
        assert image[~mask].astype(np.float32).std(axis=0).max() > 8.0
    masks = [(plain != plain[0, 0]).any(axis=-1) for plain in flat]
    object_std = np.mean([image[mask].astype(np.float32).std(axis=0).mean() for mask, image in zip(masks, textured)])
    assert object_std > 15.0


def test_shapes_scale_and_style_reach_the_datasets_through_the_config() -> None:
    cfg = DataConfig(name="shapes", shapes_num_samples=60, shapes_style="textured", shapes_scale=[0.25, 0.5])
    assert cfg.shapes_scale == (0.25, 0.5) and DataConfig.from_dict(cfg.to_dict()) == cfg
    test = build_datasets(cfg).test
    images, _, boxes = generate_shapes(len(test), 32, seed=(0, 2), scale=(0.25, 0.5), style="textured")
    assert np.array_equal(test.images, images) and np.array_equal(test.boxes, boxes)
    assert ((boxes[:, 2:] - boxes[:, :2]).max(axis=1) <= 0.5 * 32 + 1).all()


@pytest.mark.parametrize(
    ("options", "message"),
    [({"shapes_style": "wavy"}, "shapes_style"), ({"shapes_scale": (0.6, 0.3)}, "shapes_scale"),
     ({"shapes_scale": (0.0, 0.5)}, "shapes_scale")],
)
def test_shapes_options_are_validated(options: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        DataConfig(name="shapes", **options)


def test_shapes_bundle_split_sizes_follow_fractions() -> None:
    bundle = build_datasets(DataConfig(name="shapes", shapes_num_samples=300))
    assert (len(bundle.train), len(bundle.val), len(bundle.test)) == (210, 30, 60)
    assert not np.array_equal(bundle.val.images[:30], bundle.test.images[:30])


# --- transforms ------------------------------------------------------------------------------

RGB_INFO = DataInfo(10, tuple("abcdefghij"), (32, 32), 3, (0.5,) * 3, (0.25,) * 3, "test")
GRAY_INFO = DataInfo(10, tuple("abcdefghij"), (32, 32), 1, (0.5,), (0.25,), "test")


@pytest.mark.parametrize("crop", ["random_resized", "pad", "resize"])
@pytest.mark.parametrize("policy", [None, "rand-m9-mstd0.5", "augmix-m3-w2", "original"])
def test_train_transform_gives_float_chw_for_every_option(crop: str, policy: str | None) -> None:
    augment = AugmentConfig(crop=crop, hflip=0.5, color_jitter=0.4, rand_augment=policy)
    image = np.random.default_rng(0).integers(0, 255, (40, 36, 3), dtype=np.uint8)
    for info, source in ((RGB_INFO, image), (GRAY_INFO, image[..., :1]), (RGB_INFO, Image.fromarray(image))):
        out = build_train_transform(augment, info)(source)
        assert out.shape == (info.in_chans, 32, 32) and out.dtype == torch.float32


def test_eval_transform_crops_centre_and_denormalize_inverts_it() -> None:
    info = DataInfo(2, ("a", "b"), (16, 16), 3, (0.4, 0.5, 0.6), (0.2, 0.3, 0.4), "test", crop_pct=0.5)
    image = np.zeros((32, 48, 3), dtype=np.uint8)
    image[8:24, 16:32] = 200  # the centre half of a 32-pixel-high image
    out = build_eval_transform(info)(image)
    assert out.shape == (3, 16, 16)
    assert torch.allclose(denormalize(out.unsqueeze(0), info), torch.full((1, 3, 16, 16), 200 / 255), atol=1e-3)


def test_train_transform_needs_resolved_augment() -> None:
    with pytest.raises(ValueError, match="resolved"):
        build_train_transform(AugmentConfig(), RGB_INFO)


# --- config ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"name": "cifar1"}, "name must be one of 'cifar10', 'cifar100', 'imagefolder', 'fashion_mnist', 'mnist', 'digits', 'shapes', got 'cifar1'"),
        ({"val_fraction": 1.5}, "val_fraction is out of range: got 1.5, must be > 0 and < 1"),
        ({"val_fraction": 0.5, "test_fraction": 0.5}, "leaves no training data"),
        ({"in_chans": 2}, "in_chans must be 1"),
        ({"name": "shapes", "mean": (0.1, 0.2)}, "mean has 2 values but images have 3"),
        ({"crop_pct": 0}, "crop_pct"),
        ({"augment": {"rand_augment": "randaug9"}}, "is no timm policy"),
        ({"augment": {"scale": (0.5, 0.2)}}, "augment.scale"),
        ({"augment": {"hflp": 0.5}}, "unknown key 'augment.hflp' in the arguments. Did you mean 'augment.hflip'"),
    ],
)
def test_bad_config_values_are_explained(options: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(".", r"\.")):
        DataConfig(**options)


def test_config_dict_round_trip_and_unknown_keys() -> None:
    cfg = DataConfig(name="shapes", img_size=(24, 32), augment=AugmentConfig(color_jitter=0.2))
    assert DataConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match="Did you mean 'val_fraction'"):
        DataConfig.from_dict({"val_fractoin": 0.1})


def test_data_info_extra_round_trip() -> None:
    info = build_datasets(DataConfig(name="digits")).info
    assert DataInfo.from_extra(info.to_extra()) == info
