"""Data that would silently mislead is refused or named, and tools do not overwrite their inputs
(issue 11 parts 6 and 7): 16-bit images, class folders, CIFAR labels, oversized images, FIFOs,
make_subset's nested folders, attention-figure names, titles, colour bar and conversion note."""

from __future__ import annotations

import logging
import os
import signal
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import torch
from cifar_files import dump, fabricate_cifar10
from matplotlib import colormaps
from PIL import Image
from tiny_models import save_tiny, tiny_shapes_model

import vitkit
from vitkit.cli.explain_io import FigureNameError, figure_names
from vitkit.data import (
    CifarFileError,
    DataConfig,
    DataInfo,
    ImageFolderError,
    ImageReadError,
    SubsetError,
    build_datasets,
    load_image,
    make_subset,
)
from vitkit.data.arrays import spread_over_classes
from vitkit.data.images import check_image
from vitkit.data.transforms import build_eval_transform
from vitkit.io import load_model_and_extra
from vitkit.output_dirs import MARKER


def _save(path: Path, mode: str = "RGB", size: tuple[int, int] = (12, 10), value: int = 128) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new(mode, size, value if len(mode) == 1 else (value,) * len(mode)).save(path)
    return path


def _folder(root: Path, train: dict[str, int], val: dict[str, int]) -> Path:
    """``root/{train,val}/<class>/<i>.png`` with the given image counts per class (0: empty folder)."""
    for split, counts in (("train", train), ("val", val)):
        for name, count in counts.items():
            (root / split / name).mkdir(parents=True, exist_ok=True)
            for i in range(count):
                _save(root / split / name / f"{i}.png", value=30 * i)
    return root


@contextmanager
def _deadline(seconds: int) -> Iterator[None]:
    """Fail (instead of hanging the suite) if the block is still running after ``seconds``."""

    def expire(signum: int, frame: object) -> None:
        raise TimeoutError(f"still blocked after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


# --- 16-bit images ---------------------------------------------------------------------------


def test_16bit_png_is_scaled_to_the_unit_range_not_clipped(tmp_path: Path) -> None:
    path = tmp_path / "depth.png"
    levels = np.array([0, 257, 32768, 65535])
    Image.fromarray(np.repeat(levels, 8)[None].repeat(32, axis=0).astype(np.uint16)).save(path)  # 4 bands of 8 columns
    expected = np.repeat(levels / 65535, 8)  # the file's own scale: 65535 is white
    info = DataInfo(1, ("a",), (32, 32), 1, (0.0,), (1.0,), "test")  # no resize, and Normalize is the identity
    transform = build_eval_transform(info)
    for image in (load_image(path, 1), load_image(path)):  # converted, or kept 16-bit until the transform
        values = transform(image)[0].numpy()
        np.testing.assert_allclose(values, np.broadcast_to(expected, (32, 32)), atol=0.5 / 255)
    rgb = np.asarray(load_image(path, 3), dtype=np.float64)[0] / 255
    np.testing.assert_allclose(rgb, np.repeat(expected[:, None], 3, axis=1), atol=0.5 / 255)


def test_32bit_image_beyond_16_bits_is_refused_not_clipped(tmp_path: Path) -> None:
    path = tmp_path / "wide.tif"
    Image.fromarray(np.array([[0, 70000]], dtype=np.int32), "I").save(path)
    with pytest.raises(ImageReadError, match=r"wide.tif.*0\.\.70000.*beyond 16 bits"):
        load_image(path, 1)


# --- class folders ---------------------------------------------------------------------------


def test_empty_training_class_folder_is_refused_by_name(tmp_path: Path) -> None:
    root = _folder(tmp_path, train={"cat": 2, "dog": 2, "owl": 0}, val={"cat": 1, "dog": 1})
    with pytest.raises(ImageFolderError, match=r"train: class folder\(s\) 'owl' hold no readable images"):
        build_datasets(DataConfig(name="imagefolder", root=str(root), img_size=8))


def test_class_emptied_by_skipping_corrupt_files_is_refused(tmp_path: Path) -> None:
    root = _folder(tmp_path, train={"cat": 2, "dog": 0}, val={"cat": 1, "dog": 1})
    (root / "train" / "dog" / "broken.png").write_bytes(b"\x89PNG not an image")
    with pytest.raises(ImageFolderError, match="'dog' hold no readable images"):
        build_datasets(DataConfig(name="imagefolder", root=str(root), img_size=8, skip_corrupt=True))


def test_single_class_is_refused(tmp_path: Path) -> None:
    root = _folder(tmp_path, train={"cat": 3}, val={"cat": 1})
    with pytest.raises(ImageFolderError, match="single class folder, 'cat'; a classifier needs at least two"):
        build_datasets(DataConfig(name="imagefolder", root=str(root), img_size=8))


def test_validation_class_unknown_to_training_is_refused(tmp_path: Path) -> None:
    root = _folder(tmp_path, train={"cat": 2, "dog": 2}, val={"cat": 1, "bird": 1})
    with pytest.raises(ImageFolderError, match=r"val has class folder\(s\) 'bird' that .*train lacks"):
        build_datasets(DataConfig(name="imagefolder", root=str(root), img_size=8))


def test_validation_missing_a_training_class_is_warned_by_name(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = _folder(tmp_path, train={"cat": 2, "dog": 2, "owl": 2}, val={"cat": 1, "dog": 0})
    with caplog.at_level(logging.WARNING, logger="vitkit.data.imagefolder"):
        bundle = build_datasets(DataConfig(name="imagefolder", root=str(root), img_size=8))
    assert len(bundle.val) == 1
    assert "no images of 2 of the 3 training classes ('dog', 'owl')" in caplog.text


# --- CIFAR labels ----------------------------------------------------------------------------


@pytest.mark.parametrize("bad_label", [10, -1])
def test_cifar_label_outside_the_class_range_is_refused_before_training(tmp_path: Path, bad_label: int) -> None:
    root = fabricate_cifar10(tmp_path)
    labels = [i % 10 for i in range(20)]
    labels[7] = bad_label
    dump(root / "cifar-10-batches-py" / "data_batch_2", {"data": np.zeros((20, 3072), np.uint8), "labels": labels})
    message = rf"data_batch_2: 1 label\(s\) lie outside 0\.\.9.*\(e\.g\. {bad_label} at index 7\)"
    with pytest.raises(CifarFileError, match=message):
        build_datasets(DataConfig(name="cifar10", root=str(root)))


# --- oversized images and special files ------------------------------------------------------


def test_image_in_pils_warning_zone_is_refused_before_decoding(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)
    at_limit, warning_zone, beyond = (_save(tmp_path / f"{n}.png", size=(n, n)) for n in (10, 12, 15))
    assert load_image(at_limit, 3).size == (10, 10)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no DecompressionBombWarning either: a clear error instead
        limit = r"12\.png: 12x12 = 144 pixels exceed PIL.Image.MAX_IMAGE_PIXELS \(100\)"
        with pytest.raises(ImageReadError, match=limit):
            load_image(warning_zone, 3)
        with pytest.raises(ImageReadError, match=r"15\.png.*raise PIL.Image.MAX_IMAGE_PIXELS"):
            load_image(beyond, 3)
        assert "exceed PIL.Image.MAX_IMAGE_PIXELS" in check_image(warning_zone)


def test_oversized_image_in_a_folder_is_named_before_training(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = _folder(tmp_path, train={"cat": 2, "dog": 2}, val={"cat": 1, "dog": 1})
    _save(root / "train" / "dog" / "huge.png", size=(40, 30))
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)
    with pytest.raises(ImageReadError, match="huge.png: 40x30 = 1,200 pixels exceed"):
        build_datasets(DataConfig(name="imagefolder", root=str(root), img_size=8))


def test_fifo_given_as_an_image_is_refused_without_waiting(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.png"
    os.mkfifo(fifo)
    with _deadline(20):
        with pytest.raises(ImageReadError, match=r"pipe.png: it is a named pipe \(FIFO\), not a regular file"):
            load_image(fifo, 3)
        assert "named pipe" in check_image(fifo)
    with pytest.raises(ImageReadError, match="is a directory, not a regular file"):
        load_image(tmp_path)


# --- make_subset -----------------------------------------------------------------------------


def _listing(root: Path) -> list[str]:
    """The files and folders under ``root``, without vitkit's output-folder marker."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.name != MARKER)


@pytest.fixture
def subset_source(tmp_path: Path) -> Path:
    return _folder(tmp_path / "src", train={"cat": 3, "dog": 3}, val={"cat": 2, "dog": 2})


def test_make_subset_refuses_a_destination_inside_its_source(subset_source: Path, tmp_path: Path) -> None:
    before = _listing(subset_source)
    inside = subset_source / "train" / "zz"
    with pytest.raises(SubsetError, match="lies inside the source"):
        make_subset(subset_source, inside, num_classes=2, images_per_class=1)
    link = tmp_path / "link"
    link.symlink_to(subset_source / "val", target_is_directory=True)  # inside through a symlink
    with pytest.raises(SubsetError, match="lies inside the source"):
        make_subset(subset_source, link / "zz", num_classes=2, images_per_class=1)
    with pytest.raises(SubsetError, match="lies inside the source"):
        make_subset(subset_source, subset_source, num_classes=2, images_per_class=1)
    assert _listing(subset_source) == before


def test_make_subset_refuses_a_source_inside_its_destination(
    subset_source: Path, tmp_path: Path, load_tool: Callable[[str], ModuleType], capsys: pytest.CaptureFixture
) -> None:
    before = _listing(tmp_path)
    with pytest.raises(SubsetError, match="source .* lies inside the destination"):
        make_subset(subset_source, tmp_path, num_classes=2, images_per_class=1)
    argv = [str(subset_source), str(subset_source / "train" / "zz"), "--classes", "2", "--images", "1"]
    assert load_tool("make_subset").main(argv) == 2
    assert "lies inside the source" in capsys.readouterr().err
    assert _listing(tmp_path) == before


# --- attention figures -----------------------------------------------------------------------


def test_figure_names_keep_folders_and_never_collide() -> None:
    files = [Path("x/a/img.png"), Path("x/b/img.png"), Path("x/a/img.jpg"), Path("x/a/img.jpg.png"), Path("x/c.bmp")]
    names = figure_names(files, reserved={Path("c.png")})
    # by hand: a/img.png and a/img.jpg share a/img.png, so both keep their suffix; a/img.jpg.png then
    # meets a/img.jpg's figure and keeps its suffix too; c.png is reserved (a --test-images figure)
    assert names == [
        Path("a/img.png.png"), Path("b/img.png"), Path("a/img.jpg.png"), Path("a/img.jpg.png.png"), Path("c.bmp.png")
    ]
    assert figure_names([Path("/data/cat.jpg")]) == [Path("cat.png")]
    with pytest.raises(FigureNameError, match="test_000_a would be named test_000_a.png, like another figure"):
        figure_names([Path("test_000_a")], reserved={Path("test_000_a.png")})  # no suffix to tell it apart


@pytest.fixture
def tool(load_tool: Callable[[str], ModuleType]) -> ModuleType:
    return load_tool("attention_maps")


@pytest.fixture
def shapes_checkpoint(seed: int, tmp_path: Path) -> Path:
    return save_tiny(tiny_shapes_model(), tmp_path / "model.safetensors")


def _noise(path: Path, shape: tuple[int, ...], mode: str, seed: int = 0) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.random.default_rng(seed).integers(0, 255, shape, dtype=np.uint8), mode).save(path)
    return path


def test_same_named_images_in_two_folders_get_two_figures(
    tool: ModuleType, shapes_checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    images = tmp_path / "images"
    for index, name in enumerate(("a/img.png", "b/img.png", "a/img.jpg")):
        _noise(images / name, (32, 32, 3), "RGB", seed=index)
    out = tmp_path / "maps"
    assert tool.main(["--checkpoint", str(shapes_checkpoint), str(images), "--out", str(out)]) == 0
    assert _listing(out) == ["a", "a/img.jpg.png", "a/img.png.png", "b", "b/img.png"]
    assert "wrote 3 figure(s)" in capsys.readouterr().out
    with Image.open(out / "b" / "img.png") as figure:
        assert figure.text["Title"].startswith(f"{images / 'b' / 'img.png'}: predicted ")


def test_output_folder_inside_the_input_or_onto_an_input_is_refused(
    tool: ModuleType, shapes_checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    image = _noise(tmp_path / "images" / "cat.png", (32, 32, 3), "RGB")
    before = _listing(tmp_path / "images")
    inside = ["--checkpoint", str(shapes_checkpoint), str(tmp_path / "images"), "--out", str(tmp_path / "images/m")]
    assert tool.main(inside) == 2
    assert "lies inside the input folder" in capsys.readouterr().err
    onto = ["--checkpoint", str(shapes_checkpoint), str(image), "--out", str(tmp_path / "images")]
    assert tool.main(onto) == 2
    assert f"the figure {image} would overwrite that input image" in capsys.readouterr().err
    assert _listing(tmp_path / "images") == before


def _has_color_bar(figure: np.ndarray, min_width: int = 64) -> bool:
    """Whether a row of ``figure`` ([H, W, 3] uint8) holds matplotlib's jet map from 0 to 1."""
    jet = colormaps["jet"]
    low, high = (np.asarray(jet(v)[:3]) * 255 for v in (0.0, 1.0))
    for row in figure.astype(np.float64):
        starts = np.flatnonzero(np.abs(row - low).max(axis=1) <= 1)
        ends = np.flatnonzero(np.abs(row - high).max(axis=1) <= 1)
        for start in starts:
            for end in ends[ends >= start + min_width]:
                expected = jet(np.linspace(0.0, 1.0, end - start + 1))[:, :3] * 255
                if np.abs(row[start : end + 1] - expected).max() <= 1:
                    return True
    return False


def test_figure_title_names_prediction_and_true_class_with_layer_note_and_color_bar(
    tool: ModuleType, shapes_checkpoint: Path, tmp_path: Path
) -> None:
    image = _noise(tmp_path / "cat.png", (32, 32, 3), "RGB")
    out = tmp_path / "maps"
    argv = ["--checkpoint", str(shapes_checkpoint), str(image), "--test-images", "1", "--out", str(out), "--layer", "0"]
    assert tool.main(argv) == 0
    model, extra = load_model_and_extra(shapes_checkpoint)
    model.eval()
    info = DataInfo.from_extra(extra)
    with torch.no_grad():
        probabilities = model(build_eval_transform(info)(load_image(image, 3))[None]).softmax(-1)[0]
    predicted = int(probabilities.argmax())
    with Image.open(out / "cat.png") as figure:
        title = f"{image}: predicted {info.class_names[predicted]} ({probabilities[predicted]:.1%})"
        assert figure.text["Title"] == title
        description = figure.text["Description"]
        assert _has_color_bar(np.asarray(figure.convert("RGB")))
    assert "head 0 | head 1 | head 2" in description
    assert "attention of each head in layer 0 (counted from 0: layers 0-1, heads 0-2)" in description
    test_set = build_datasets(DataConfig(**extra["data_config"])).test
    _, label = test_set[int(spread_over_classes(test_set.labels, 1, seed=0)[0])]  # the test image drawn
    true_class = info.class_names[label]
    with Image.open(out / f"test_000_{true_class}.png") as figure:
        assert figure.text["Title"].endswith(f", true {true_class}") and "predicted" in figure.text["Title"]


def test_images_converted_for_a_grayscale_model_are_named_once(
    tool: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    model = vitkit.create_model(
        "vit_cifar_tiny", in_chans=1, patch_size=8, embed_dim=24, depth=1, num_heads=2, num_classes=3
    ).eval()
    info = DataInfo(3, ("a", "b", "c"), (32, 32), 1, (0.5,), (0.5,), "gray")
    checkpoint = vitkit.save_model(model, tmp_path / "gray.safetensors", extra=info.to_extra())
    images = tmp_path / "images"
    for index in range(2):
        _noise(images / f"scene{index}.png", (36, 40, 4), "RGBA", seed=index)
    _noise(images / "digit.png", (32, 32), "L")
    assert tool.main(["--checkpoint", str(checkpoint), str(images), "--out", str(tmp_path / "maps")]) == 0
    printed = capsys.readouterr().out
    assert printed.count("note:") == 1
    note = next(line for line in printed.splitlines() if line.startswith("note:"))
    assert "(grayscale, 32x32)" in note
    assert "2 image(s) RGBA -> grayscale: transparent pixels composited onto white, colour to luma" in note
    assert f"2 image(s) of another size (e.g. {images / 'scene0.png'}, 40x36) resized" in note
    assert "digit.png" not in note  # already the model's size and mode


def test_a_photo_s_exif_orientation_is_applied_as_viewers_show_it(tmp_path: Path) -> None:
    from PIL import Image

    from vitkit.data.images import load_image

    pixels = np.zeros((20, 40, 3), dtype=np.uint8)  # 40 wide, 20 high as stored
    pixels[:, :10] = 255  # the stored left edge is white
    exif = Image.Exif()
    exif[0x0112] = 6  # Orientation 6: the camera was turned; viewers rotate 90 degrees clockwise
    Image.fromarray(pixels).save(tmp_path / "photo.jpg", exif=exif.tobytes(), quality=95)
    upright = np.asarray(load_image(tmp_path / "photo.jpg", 3))
    assert upright.shape == (40, 20, 3)  # 20 wide, 40 high once upright
    assert upright[:10].mean() > 200 and upright[-10:].mean() < 50  # the stored left edge is now the top
    Image.fromarray(pixels).save(tmp_path / "plain.jpg", quality=95)
    assert np.asarray(load_image(tmp_path / "plain.jpg", 3)).shape == (20, 40, 3)  # no tag: as stored
