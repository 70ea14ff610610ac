"""MNIST-format data: the IDX reader on fabricated files, the dataset layouts, the missing-data
message, and the batched augmentation that serves in-memory arrays."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest
import torch
from mnist_files import fabricate_mnist, write_idx
from torch.utils.data import DataLoader

from vitkit.data import DataConfig, build_datasets
from vitkit.data.batch_transforms import BatchTransform, random_crop
from vitkit.data.info import DataInfo
from vitkit.data.mnist import IMAGES_MAGIC, LABELS_MAGIC, IdxFileError, read_idx


def test_read_idx_returns_the_declared_shape_and_bytes(tmp_path: Path) -> None:
    images = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    assert np.array_equal(read_idx(write_idx(tmp_path / "x.gz", images), IMAGES_MAGIC), images)
    labels = np.array([3, 1, 4], dtype=np.uint8)
    assert np.array_equal(read_idx(write_idx(tmp_path / "y", labels, compress=False), LABELS_MAGIC), labels)


def test_read_idx_refuses_wrong_magic_truncation_and_non_gzip(tmp_path: Path) -> None:
    labels = write_idx(tmp_path / "labels.gz", np.zeros(5, dtype=np.uint8))
    with pytest.raises(IdxFileError, match="magic number 0x00000801, expected 0x00000803"):
        read_idx(labels, IMAGES_MAGIC)
    full = gzip.decompress(write_idx(tmp_path / "img.gz", np.zeros((4, 2, 2), dtype=np.uint8)).read_bytes())
    (tmp_path / "short.gz").write_bytes(gzip.compress(full[:-3]))
    with pytest.raises(IdxFileError, match=r"declares shape \[4, 2, 2\] \(16 bytes of data\) but holds 13"):
        read_idx(tmp_path / "short.gz", IMAGES_MAGIC)
    (tmp_path / "plain.gz").write_bytes(full)
    with pytest.raises(IdxFileError, match="not a readable gzip file"):
        read_idx(tmp_path / "plain.gz", IMAGES_MAGIC)
    (tmp_path / "tiny").write_bytes(b"\x00\x00")
    with pytest.raises(IdxFileError, match="shorter than an IDX header"):
        read_idx(tmp_path / "tiny", LABELS_MAGIC)


@pytest.mark.parametrize("layout", ["flat_gz", "torchvision_raw", "flat_uncompressed"])
def test_fashion_mnist_builds_from_each_layout_with_official_test_set(tmp_path: Path, layout: str) -> None:
    folder = tmp_path / "FashionMNIST" / "raw" if layout == "torchvision_raw" else tmp_path
    arrays = fabricate_mnist(folder, compress=layout != "flat_uncompressed")
    bundle = build_datasets(DataConfig(name="fashion_mnist", root=str(tmp_path), val_fraction=1 / 6, num_workers=0))
    assert (len(bundle.train), len(bundle.val), len(bundle.test)) == (50, 10, 20)
    assert bundle.info.class_names[0] == "T-shirt/top" and bundle.info.img_size == (28, 28)
    assert sorted(bundle.val.labels.tolist()) == list(range(10))  # stratified: one per class
    test_images, test_labels = arrays["test"]
    assert np.array_equal(bundle.test.images[..., 0], test_images)
    assert np.array_equal(bundle.test.labels, test_labels)
    # Every image still carries its own label's pixel value: images and labels stay paired.
    for split in (bundle.train, bundle.val):
        assert np.array_equal(split.images[:, 0, 0, 0], 20 * split.labels + 1)


def test_fashion_mnist_split_is_fixed_by_seed(tmp_path: Path) -> None:
    fabricate_mnist(tmp_path)

    def val_indices(seed: int) -> list[int]:
        bundle = build_datasets(DataConfig(name="fashion_mnist", root=str(tmp_path), val_fraction=1 / 3, seed=seed))
        return bundle.val.images[:, 27, 27, 0].tolist()

    assert val_indices(0) == val_indices(0)
    assert val_indices(0) != val_indices(1)


def test_mnist_shares_the_reader_and_has_digit_classes(tmp_path: Path) -> None:
    fabricate_mnist(tmp_path / "MNIST" / "raw")
    bundle = build_datasets(DataConfig(name="mnist", root=str(tmp_path)))
    assert bundle.info.class_names == tuple(str(d) for d in range(10))
    assert bundle.info.mean == (0.1307,)


def test_missing_fashion_mnist_names_both_ways_to_get_it(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError) as error:
        build_datasets(DataConfig(name="fashion_mnist", root=str(tmp_path)))
    message = str(error.value)
    assert "train-images-idx3-ubyte.gz" in message and "data.download=true" in message
    assert "apt-get install dataset-fashion-mnist" in message and "data.root" in message


def test_failed_download_explains_the_offline_way(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from vitkit.data import mnist

    def offline(*args: object, **kwargs: object) -> None:
        raise OSError("no network")

    source = mnist.MNIST_SOURCES["fashion_mnist"]
    monkeypatch.setitem(mnist.MNIST_SOURCES, "fashion_mnist", mnist.MnistSource(
        offline, source.classes, source.mean, source.std, source.package_hint))
    with pytest.raises(FileNotFoundError, match="no network.*data.download=false"):
        build_datasets(DataConfig(name="fashion_mnist", root=str(tmp_path), download=True))


def test_labels_outside_the_classes_are_refused(tmp_path: Path) -> None:
    fabricate_mnist(tmp_path)
    write_idx(tmp_path / "t10k-labels-idx1-ubyte.gz", np.full(20, 12, dtype=np.uint8))
    with pytest.raises(IdxFileError, match="label 12, outside 0..9"):
        build_datasets(DataConfig(name="fashion_mnist", root=str(tmp_path)))


def _info(channels: int = 1) -> DataInfo:
    return DataInfo(10, tuple("abcdefghij"), (8, 8), channels, (0.5,) * channels, (0.25,) * channels, "test")


def shifted(image: np.ndarray, dy: int, dx: int) -> np.ndarray:
    """``image`` [H, W] moved by (dy, dx) pixels, zero-filled: the crop at offset (p - dy, p - dx)."""
    out = np.zeros_like(image)
    height, width = image.shape
    out[max(dy, 0) : height + min(dy, 0), max(dx, 0) : width + min(dx, 0)] = image[
        max(-dy, 0) : height - max(dy, 0), max(-dx, 0) : width - max(dx, 0)
    ]
    return out


def test_random_crop_is_a_zero_filled_shift_with_uniform_offsets() -> None:
    image = np.arange(1, 65, dtype=np.uint8).reshape(8, 8)
    batch = torch.from_numpy(np.repeat(image[None, None], 2500, axis=0))
    crops = random_crop(batch, padding=2)[:, 0].numpy()
    shifts = {(dy, dx): shifted(image, dy, dx) for dy in range(-2, 3) for dx in range(-2, 3)}
    counts = dict.fromkeys(shifts, 0)
    for crop in crops:
        match = [key for key, reference in shifts.items() if np.array_equal(crop, reference)]
        assert len(match) == 1
        counts[match[0]] += 1
    # 25 offsets, 100 expected each (binomial std ~9.8): every one within 4 std.
    assert all(60 <= count <= 140 for count in counts.values()), counts


@pytest.mark.parametrize("rate", [0.0, 0.3, 1.0])
def test_batch_flip_rate_and_normalisation(rate: float) -> None:
    image = np.arange(64, dtype=np.uint8).reshape(8, 8, 1)
    batch = torch.from_numpy(np.repeat(image[None], 4000, axis=0))
    out = BatchTransform(_info(), hflip=rate)(batch)
    expected = (image[..., 0] / 255.0 - 0.5) / 0.25
    straight = torch.isclose(out[:, 0], torch.tensor(expected, dtype=torch.float32), atol=1e-5).flatten(1).all(1)
    mirrored = torch.isclose(out[:, 0], torch.tensor(expected[:, ::-1].copy(), dtype=torch.float32), atol=1e-5)
    mirrored = mirrored.flatten(1).all(1)
    assert bool((straight ^ mirrored).all())
    assert abs(mirrored.float().mean().item() - rate) < 0.025  # std of the rate at n=4000 is <= 0.008


def test_batched_eval_path_equals_the_per_image_pipeline(tmp_path: Path) -> None:
    fabricate_mnist(tmp_path)
    bundle = build_datasets(DataConfig(name="fashion_mnist", root=str(tmp_path), in_chans=3))
    assert bundle.test.batch_transform is not None
    batched = torch.stack([image for image, _ in bundle.test.__getitems__(list(range(20)))])
    per_image = torch.stack([bundle.test.transform(bundle.test.images[i]) for i in range(20)])
    assert batched.shape == (20, 3, 28, 28)
    torch.testing.assert_close(batched, per_image, atol=1e-5, rtol=0)


def test_options_the_batch_path_lacks_fall_back_to_per_image(tmp_path: Path) -> None:
    fabricate_mnist(tmp_path)
    jitter = build_datasets(DataConfig(name="fashion_mnist", root=str(tmp_path), augment={"color_jitter": 0.4}))
    resized = build_datasets(DataConfig(name="fashion_mnist", root=str(tmp_path), img_size=32))
    fast = build_datasets(DataConfig(name="fashion_mnist", root=str(tmp_path), augment={"padding": 3, "hflip": 0.2}))
    assert jitter.train.batch_transform is None and jitter.val.batch_transform is not None
    assert resized.train.images.shape[1:] == (32, 32, 1) and resized.train.batch_transform is not None
    assert (fast.train.batch_transform.padding, fast.train.batch_transform.hflip) == (3, 0.2)


def test_dataloader_serves_batched_samples_with_their_labels(tmp_path: Path) -> None:
    fabricate_mnist(tmp_path)
    bundle = build_datasets(DataConfig(name="fashion_mnist", root=str(tmp_path), augment={"enabled": False}))
    images, labels = next(iter(DataLoader(bundle.train, batch_size=16, shuffle=True)))
    fill = (images[:, 0, 0, 0] * 0.353 + 0.286) * 255  # undo Normalize on the constant corner pixel
    torch.testing.assert_close(fill, (20 * labels + 1).float(), atol=0.05, rtol=0)


def test_train_tool_reports_a_corrupt_idx_file_in_one_line(tmp_path: Path, load_tool, capsys) -> None:
    fabricate_mnist(tmp_path)
    (tmp_path / "train-labels-idx1-ubyte.gz").write_bytes(gzip.compress(b"\x00\x00\x08\x01\x00\x00\x00\x09abc"))
    code = load_tool("train").main(["recipes/fashion_mnist.yaml", f"data.root={tmp_path}", f"output.dir={tmp_path}"])
    error = capsys.readouterr().err
    assert code == 2 and error.startswith("error: ") and "declares shape [9]" in error
    assert "Traceback" not in error
