"""``vitkit benchmark --sections data``'s folder-loader comparison, at tiny sizes (what it measures is
not timed here): the three loaders read the same JPEG folder and give the same batches' shapes,
vitkit's is the training loader of an ``imagefolder`` recipe, and the table names the workers each
needs to feed a GPU."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from PIL import Image

from vitkit.bench.data import GPU_FEED, bench_folder_loaders, folder_loaders, write_jpeg_folder
from vitkit.data import DataConfig, build_datasets


def test_the_folder_holds_photo_sized_jpegs_in_train_and_val(tmp_path: Path) -> None:
    root = write_jpeg_folder(tmp_path, 6, classes=3)
    files = sorted((root / "train").rglob("*.jpg"))
    assert len(files) == 6 and len(list((root / "val").rglob("*.jpg"))) == 3
    with Image.open(files[0]) as image:
        assert (image.format, image.size) == ("JPEG", (500, 375))


def test_the_three_loaders_give_normalised_batches_of_the_same_shape(tmp_path: Path) -> None:
    root = write_jpeg_folder(tmp_path, 8)
    loaders = folder_loaders(root, 32, 4, 0)
    assert len(loaders) == 3
    for name, loader in loaders.items():
        images, labels = next(iter(loader))
        assert images.shape == (4, 3, 32, 32) and images.dtype == torch.float32, name
        assert images.min() < 0 < images.max() and set(labels.tolist()) <= {0, 1}, name  # normalised, two classes
    vitkit_set = loaders["vitkit (imagefolder recipe)"].dataset
    recipe_set = build_datasets(DataConfig(name="imagefolder", root=str(root), img_size=32)).train
    assert type(vitkit_set) is type(recipe_set) and len(vitkit_set) == len(recipe_set) == 8


def test_the_table_has_a_row_per_loader_and_worker_count_and_the_workers_to_feed_a_gpu() -> None:
    rows = bench_folder_loaders(1, count=8, img_size=32, workers=(0,), batch_size=2)
    body = [row for row in rows if row.startswith("| ") and "workers" not in row]
    assert len(body) == 3 and all(float(row.split("|")[3].replace(",", "")) > 0 for row in body)
    timm_row = next(row for row in body if "timm" in row)
    assert timm_row.rstrip(" |").endswith("1.00")
    needed = re.findall(r"(\w[\w ()+]*?) (\d+)(?:,|$)", rows[-1].split(": ", 1)[1])
    assert len(needed) == 3 and str(GPU_FEED) in rows[-1].replace(",", "")


def test_an_onnx_model_without_the_onnx_section_is_refused_in_one_line(capsys: pytest.CaptureFixture) -> None:
    from vitkit.cli.benchmark import main

    assert main(["--sections", "kernels", "--onnx-model", "m.safetensors"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line == "error: --onnx-model is measured by the onnx section: add --sections onnx (asked for: kernels)."
