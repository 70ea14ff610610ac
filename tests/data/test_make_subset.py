"""tools/make_subset.py and vitkit.data.make_subset: deterministic N-class x M-image subsets."""

from __future__ import annotations

from pathlib import Path

import pytest

from vitkit.data import make_subset


@pytest.fixture
def source(tmp_path: Path) -> Path:
    """src/train/c0..c5 with 6 images each (c5 has 2), src/val/c0..c5 with 3 each."""
    root = tmp_path / "src"
    for c in range(6):
        for split, count in (("train", 2 if c == 5 else 6), ("val", 3)):
            folder = root / split / f"c{c}"
            folder.mkdir(parents=True)
            for i in range(count):
                (folder / f"img{i}.JPEG").write_bytes(f"{split}/{c}/{i}".encode())
        (root / "train" / f"c{c}" / "labels.txt").write_text("not an image")
    return root


def _listing(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def test_same_seed_gives_the_same_subset(source: Path, tmp_path: Path) -> None:
    first = make_subset(source, tmp_path / "a", num_classes=3, images_per_class=2, seed=7)
    again = make_subset(source, tmp_path / "b", num_classes=3, images_per_class=2, seed=7)
    assert first == again and _listing(tmp_path / "a") == _listing(tmp_path / "b")
    others = {make_subset(source, tmp_path / f"s{seed}", 3, 2, seed=seed).classes for seed in range(4)}
    assert len(others) > 1


def test_subset_symlinks_train_and_keeps_all_val_images(source: Path, tmp_path: Path) -> None:
    summary = make_subset(source, tmp_path / "dst", num_classes=2, images_per_class=4, seed=0)
    assert summary.counts == {"train": 8, "val": 6}
    files = list((tmp_path / "dst").rglob("*.JPEG"))
    assert len(files) == 14 and all(f.is_symlink() for f in files)
    assert all(f.resolve().is_relative_to(source.resolve()) for f in files)
    assert {p.name for p in (tmp_path / "dst" / "train").iterdir()} == set(summary.classes)


def test_copy_mode_writes_real_files_and_caps_val(source: Path, tmp_path: Path) -> None:
    make_subset(source, tmp_path / "dst", 2, 1, seed=1, copy=True, eval_images_per_class=1)
    files = list((tmp_path / "dst").rglob("*.JPEG"))
    assert len(files) == 4 and not any(f.is_symlink() for f in files)
    for file in files:
        assert file.read_bytes() == (source / file.relative_to(tmp_path / "dst")).read_bytes()


@pytest.mark.parametrize(
    ("classes", "images", "message"),
    [(7, 1, "asked for 7 classes but .* has only 6"), (6, 3, "c5 has only 2 images, fewer than the 3")],
)
def test_too_few_classes_or_images_is_explained(
    source: Path, tmp_path: Path, classes: int, images: int, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        make_subset(source, tmp_path / "dst", classes, images)


def test_cli_reports_missing_source_and_non_empty_destination(
    source: Path, tmp_path: Path, capsys: pytest.CaptureFixture, load_tool
) -> None:
    tool = load_tool("make_subset")
    assert tool.main([str(tmp_path / "nope"), str(tmp_path / "dst"), "--classes", "1", "--images", "1"]) == 2
    assert "source folder" in capsys.readouterr().err
    assert tool.main([str(source), str(tmp_path / "dst"), "--classes", "2", "--images", "3", "--copy"]) == 0
    assert "2 classes" in capsys.readouterr().out
    assert tool.main([str(source), str(tmp_path / "dst"), "--classes", "2", "--images", "3"]) == 2
    assert "not empty" in capsys.readouterr().err
