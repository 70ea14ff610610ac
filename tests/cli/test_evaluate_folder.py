"""``vitkit evaluate MODEL FOLDER``: every image of a class-folder tree scored with the model's own
preprocessing, labelled by the model's class order; top-1, top-5, per class and the confusion
matrix counted here by hand from the model's logits on images normalised with numpy; a folder
the model has no class for is refused in one line; an .onnx file scores as its model file."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from tiny_models import tiny_shapes_model

import vitkit
from vitkit.cli.evaluate import main as evaluate_main

#: The model's classes, in its own order (the folders sort otherwise: the labels must follow the model).
CLASSES = ("circle", "square", "triangle", "cross", "star", "ring")
MEAN, STD = (0.2, 0.5, 0.7), (0.3, 0.2, 0.4)


def block_pixels(seed: int) -> np.ndarray:
    """A 64x64 RGB image of 2x2 blocks: resized to 32x32 it is exactly the 32x32 block values."""
    return np.random.default_rng(seed).integers(0, 256, (32, 32, 3), dtype=np.uint8).repeat(2, 0).repeat(2, 1)


def by_hand(pixels: np.ndarray) -> torch.Tensor:
    """The model input [1, 3, 32, 32]: halved (the blocks), (x / 255 - mean) / std."""
    half = pixels[::2, ::2].astype(np.float32) / 255.0
    return torch.from_numpy(((half - np.float32(MEAN)) / np.float32(STD)).transpose(2, 0, 1).copy())[None]


@pytest.fixture
def model_file(tmp_path: Path) -> Path:
    torch.manual_seed(0)
    model = tiny_shapes_model()
    with torch.no_grad():  # a zero-initialised head would give every image the same class
        model.head.weight.normal_(0, 1.0)
    extra = {"class_names": list(CLASSES), "mean": list(MEAN), "std": list(STD), "img_size": [32, 32], "in_chans": 3,
             "crop_pct": 1.0, "dataset": "shapes"}
    return vitkit.save_model(model, tmp_path / "model.safetensors", extra=extra)


def write_folder(root: Path, model_file: Path, count: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """``count`` images in class folders of four of the six classes: every other image in the folder
    of the class the model predicts (when one of the four), the others in the four in turn. Returns the logits [N, 6] (by hand)
    and the labels [N] (indices of CLASSES)."""
    model = vitkit.load_model(model_file).eval()
    logits, labels = [], []
    for index in range(count):
        pixels = block_pixels(index)
        with torch.no_grad():
            row = model(by_hand(pixels))[0]
        guess = int(row.argmax())
        # only circle, square, triangle and cross: star and ring have no folder
        label = guess if index % 2 == 0 and guess < 4 else (index // 2) % 4
        folder = root / CLASSES[label]
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(pixels).save(folder / f"{index:02d}.png")
        logits.append(row)
        labels.append(label)
    return torch.stack(logits), torch.tensor(labels)


def test_a_class_folder_is_scored_whole_by_the_models_classes_and_preprocessing(
    model_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    logits, labels = write_folder(tmp_path / "test", model_file)
    out = tmp_path / "eval"
    assert evaluate_main([str(model_file), str(tmp_path / "test"), "--out", str(out)]) == 0
    report = json.loads((out / "eval.json").read_text())
    predicted = logits.argmax(-1)
    matrix = [[0] * 6 for _ in range(6)]
    for true, guess in zip(labels.tolist(), predicted.tolist()):
        matrix[true][guess] += 1
    assert 0 < (predicted == labels).sum() < len(labels)  # some right, some wrong: the counts can tell
    assert report["num_images"] == len(labels) and report["split"] == "all"
    assert report["top1"] == pytest.approx(100.0 * float((predicted == labels).float().mean()), abs=5e-4)
    top5 = logits.topk(5, dim=-1).indices
    assert report["top5"] == pytest.approx(100.0 * float((top5 == labels[:, None]).any(-1).float().mean()), abs=5e-4)
    assert report["confusion_matrix"] == matrix
    counts = {CLASSES[c]: [matrix[c][c], sum(matrix[c])] for c in range(6) if sum(matrix[c])}
    assert report["per_class_counts"] == counts and report["missing_classes"] == ["star", "ring"]
    assert report["per_class"] == {name: pytest.approx(100.0 * right / total, abs=5e-4) for name, (right, total) in counts.items()}
    with open(out / "confusion_matrix.csv", newline="") as handle:
        rows = list(csv.reader(handle))
    assert rows[0][1:] == list(CLASSES) and [list(map(int, row[1:])) for row in rows[1:]] == matrix
    assert (out / "confusion_matrix.png").read_bytes()[:4] == b"\x89PNG"
    printed = capsys.readouterr().out
    assert "4 of the model's 6 classes" in printed and "images/s" in printed
    assert " ".join(map(str, matrix[0])) in " ".join(printed.split())  # the matrix's first row, printed
    assert printed.splitlines()[-1].startswith(f"next: each image's classes: vitkit predict {model_file}")


def test_a_folder_the_model_has_no_class_for_is_refused_in_one_line(
    model_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    write_folder(tmp_path / "test", model_file, count=4)
    (tmp_path / "test" / "hexagon").mkdir()
    Image.fromarray(block_pixels(0)).save(tmp_path / "test" / "hexagon" / "a.png")
    assert evaluate_main([str(model_file), str(tmp_path / "test"), "--out", str(tmp_path / "eval")]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"error: {tmp_path / 'test'} has class folder(s) 'hexagon' that the model does not predict")
    assert not (tmp_path / "eval").exists()


def test_a_folder_and_data_overrides_together_are_refused(model_file: Path, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture) -> None:
    write_folder(tmp_path / "test", model_file, count=2)
    assert evaluate_main([str(model_file), str(tmp_path / "test"), "--data", "name=digits"]) == 2
    assert capsys.readouterr().err.startswith("error: give a test FOLDER or --data, not both")


def test_an_onnx_file_scores_the_folder_as_its_model_file(model_file: Path, tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime", reason="needs onnxruntime (pip install -e '.[dev]')")
    from vitkit.export import export_onnx
    from vitkit.io import load_model_and_extra
    from vitkit.train import evaluate

    write_folder(tmp_path / "test", model_file, count=8)
    model, extra = load_model_and_extra(model_file)
    graph = export_onnx(model.eval(), tmp_path / "model.onnx", extra=extra)
    from_file, from_graph = evaluate(model_file, folder=tmp_path / "test"), evaluate(graph, folder=tmp_path / "test")
    assert from_graph["confusion_matrix"] == from_file["confusion_matrix"] and from_graph["top1"] == from_file["top1"]


def test_with_fewer_than_five_classes_there_is_no_top5(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from tiny_models import tiny_model

    extra = {"class_names": ["a", "b", "c"], "mean": [0.5] * 3, "std": [0.5] * 3, "img_size": [8, 8], "in_chans": 3}
    model_file = vitkit.save_model(tiny_model(), tmp_path / "model.safetensors", extra=extra)
    for name in "ab":
        (tmp_path / "test" / name).mkdir(parents=True)
        Image.fromarray(block_pixels(0)[:16, :16]).save(tmp_path / "test" / name / "x.png")
    assert evaluate_main([str(model_file), str(tmp_path / "test"), "--out", str(tmp_path / "eval")]) == 0
    assert json.loads((tmp_path / "eval" / "eval.json").read_text())["top5"] is None  # top-3 of 3 is always 100%
    assert "top-5" not in capsys.readouterr().out


def test_predict_on_a_class_folder_prints_the_accuracy_and_each_classs_counts(
    model_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    from vitkit.cli.predict import main as predict_main

    logits, labels = write_folder(tmp_path / "test", model_file, count=12)
    predicted = logits.argmax(-1)
    assert predict_main([str(model_file), str(tmp_path / "test"), "--top-k", "1"]) == 0
    printed = capsys.readouterr().out
    right = int((predicted == labels).sum())
    assert f"top-1 {100.0 * right / len(labels):.2f}% of {len(labels)} images" in printed
    counts = [f"{CLASSES[c]}: {int((predicted[labels == c] == c).sum())}/{int((labels == c).sum())}" for c in range(4)]
    assert "per class: " + "  ".join(counts) in printed
    assert f"{len(labels)} image(s) in " in printed and "images/s" in printed
    flat = tmp_path / "flat"  # the same images without class folders: nothing to score them by
    flat.mkdir()
    for index, path in enumerate(sorted((tmp_path / "test").rglob("*.png"))):
        (flat / f"{index}.png").write_bytes(path.read_bytes())
    assert predict_main([str(model_file), str(flat)]) == 0
    assert "top-1" not in capsys.readouterr().out


def test_predict_times_the_model_and_not_the_reading(model_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    import vitkit.cli.predict as predict_cli

    write_folder(tmp_path / "test", model_file, count=4)
    real = predict_cli.predict

    def slow(*args: object, **kwargs: object) -> object:  # a model that takes 0.3 s a batch
        time.sleep(0.3)
        return real(*args, **kwargs)

    monkeypatch.setattr(predict_cli, "predict", slow)
    assert predict_cli.main([str(model_file), str(tmp_path / "test"), "--batch-size", "2"]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if "images/s" in line)
    seconds = float(line.split(" in ")[1].split(" s:")[0])
    assert 0.6 <= seconds < 2.0 and line.startswith("4 image(s) in ")
