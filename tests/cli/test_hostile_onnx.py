"""Hostile or damaged input to ``vitkit export`` and to ``predict`` on an ``.onnx`` file (issue 51):
each case is one ``error:`` line (exit 2) before anything is written, or works as documented; no
input is replaced, and nothing is allocated before the size that sizes it is checked."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from tiny_models import save_tiny, tiny_shapes_model

import vitkit
from vitkit.cli import export, predict
from vitkit.data import shapes_info
from vitkit.export import PREPROCESSING_KEY

onnx = pytest.importorskip("onnx", reason="needs onnx (pip install -e '.[dev]')")
pytest.importorskip("onnxruntime", reason="needs onnxruntime (pip install -e '.[dev]')")


def _one_error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1 and "Traceback" not in err, err[-2000:]
    return lines[0]


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """A tiny shapes model file, its ONNX export (batch 1) and an image."""
    folder = tmp_path_factory.mktemp("onnx")
    checkpoint = save_tiny(tiny_shapes_model(), folder / "model.safetensors")
    graph = folder / "model.onnx"
    assert export.main(["--checkpoint", str(checkpoint), "--out", str(graph)]) == 0
    image = folder / "image.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(image)
    return checkpoint, graph, image


def _predict_error(graph: Path, image: Path, capsys: pytest.CaptureFixture) -> str:
    capsys.readouterr()
    assert predict.main([str(graph), str(image)]) == 2
    return _one_error_line(capsys.readouterr().err)


# --- export never replaces its inputs, and checks what it is asked before the work ----------------


@pytest.mark.parametrize("quantize", [[], ["--quantize", "dynamic"]], ids=["float32", "int8"])
def test_export_onto_its_own_model_file_is_refused_even_with_force(
    exported: tuple[Path, Path, Path], tmp_path: Path, quantize: list[str], capsys: pytest.CaptureFixture
) -> None:
    model = tmp_path / "m.safetensors"
    shutil.copy(exported[0], model)
    before = model.read_bytes()
    for given in (model, tmp_path / "m"):  # the name save_model and load_model complete with .safetensors
        capsys.readouterr()
        assert export.main(["--checkpoint", str(given), "--out", str(model), "--force", *quantize]) == 2
        assert "is one of this command's inputs" in _one_error_line(capsys.readouterr().err)
        assert model.read_bytes() == before


@pytest.mark.parametrize("opset", ["7", "17", "999"])
def test_an_opset_the_exporter_does_not_write_is_refused_before_the_export(
    exported: tuple[Path, Path, Path], tmp_path: Path, opset: str, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "m.onnx"
    assert export.main(["--checkpoint", str(exported[0]), "--out", str(out), "--opset", opset]) == 2
    assert f"--opset {opset}: torch's exporter writes opsets 18 to" in _one_error_line(capsys.readouterr().err)
    assert not out.exists()


def test_an_export_size_over_the_model_s_token_limit_is_refused_before_tracing(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    model = vitkit.create_model("vit_cifar_tiny", patch_size=4, embed_dim=16, depth=1, num_heads=2, num_classes=6,
                                dynamic_img_size=True)
    checkpoint = vitkit.save_model(model, tmp_path / "m.safetensors", extra=shapes_info(32).to_extra())
    out = tmp_path / "m.onnx"
    assert export.main(["--checkpoint", str(checkpoint), "--out", str(out), "--img-size", "4096", "4096"]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert "--img-size 4096 4096 does not fit the model" in line and "65,536" in line
    assert not out.exists()


def test_an_export_into_a_folder_where_nothing_can_be_written_is_refused_before_the_work(
    exported: tuple[Path, Path, Path], capsys: pytest.CaptureFixture
) -> None:
    assert export.main(["--checkpoint", str(exported[0]), "--out", "/proc/x.onnx"]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert line.startswith("error: --out /proc/x.onnx: no file can be written in /proc") and ".tmp" not in line


def test_a_model_without_a_classifier_exports_features_and_predict_refuses_it(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    model = vitkit.create_model("vit_cifar_tiny", patch_size=8, embed_dim=16, depth=1, num_heads=2, num_classes=0)
    extra = {key: value for key, value in shapes_info(32).to_extra().items() if key != "class_names"}
    checkpoint = vitkit.save_model(model, tmp_path / "headless.safetensors", extra=extra)
    graph = tmp_path / "headless.onnx"
    assert export.main(["--checkpoint", str(checkpoint), "--out", str(graph)]) == 0
    assert capsys.readouterr().out.splitlines()[0].endswith("-> features)")
    assert [output.name for output in onnx.load(str(graph)).graph.output] == ["features"]
    image = tmp_path / "i.png"
    Image.new("RGB", (32, 32)).save(image)
    assert "has no classifier" in _predict_error(graph, image, capsys)


# --- damaged or hostile metadata ------------------------------------------------------------------


def _with_metadata(graph: Path, text: str, out: Path) -> Path:
    proto = onnx.load(str(graph))
    (entry,) = [entry for entry in proto.metadata_props if entry.key == PREPROCESSING_KEY]
    entry.value = text
    onnx.save(proto, str(out))
    return out


def _metadata(graph: Path) -> dict:
    proto = onnx.load(str(graph))
    return json.loads(next(entry.value for entry in proto.metadata_props if entry.key == PREPROCESSING_KEY))


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ("{not json", "is not valid JSON"),
        ("[1, 2]", "must be a JSON object, got list"),
        ("[" * 100_000 + "]" * 100_000, "is not valid JSON"),
        ({"mean": ["a", "b", "c"]}, "mean in the metadata of"),
        ({"class_names": ["a"] * 5}, "has 5 names for the model's 6 classes"),
        ({"class_names": [f"c{i}" for i in range(50)]}, "has 50 names for the model's 6 classes"),
        ({"std": [0, 0, 0]}, "std in the metadata of"),
        ({"crop_pct": 0}, "crop_pct in the metadata of"),
        ({"crop_pct": 1e-6}, "crop_pct in the metadata of"),
        ({"in_chans": 5}, "in_chans in the metadata of"),
        ({"interpolation": "sinc"}, "interpolation in the metadata of"),
        ({"crop_mode": "zoom"}, "crop_mode in the metadata of"),
        ({"img_size": "ab"}, "img_size in the metadata of"),
        ({"img_size": [60000, 60000]}, "img_size in the metadata of"),
        ({"img_size": [64, 64]}, "the model takes [32, 32] images only"),
        ("{\"img_size\": [" + "9" * 500 + ", 32]}", "img_size in the metadata of"),
    ],
    ids=["invalid-json", "list", "deep-nesting", "string-mean", "too-few-classes", "fifty-classes", "std-0",
         "crop-0", "crop-tiny", "in-chans-5", "interpolation", "crop-mode", "img-size-ab", "img-size-60000",
         "img-size-other", "500-digits"],
)
def test_damaged_onnx_metadata_is_one_line_before_any_image_is_resized(
    exported: tuple[Path, Path, Path], tmp_path: Path, change: str | dict, expected: str, capsys: pytest.CaptureFixture
) -> None:
    _, graph, image = exported
    text = change if isinstance(change, str) else json.dumps({**_metadata(graph), **change})
    damaged = _with_metadata(graph, text, tmp_path / "damaged.onnx")
    line = _predict_error(damaged, image, capsys)
    assert expected in line and str(damaged) in line, line


@pytest.mark.parametrize("option", [["--merge-tokens", "2"], ["--mean", "0.5"], ["--std", "2"], ["--crop-pct", "0.5"],
                                    ["--precision", "bf16"]], ids=lambda option: option[0])
def test_an_option_an_onnx_model_cannot_take_is_refused_not_ignored(
    exported: tuple[Path, Path, Path], option: list[str], capsys: pytest.CaptureFixture
) -> None:
    _, graph, image = exported
    capsys.readouterr()
    assert predict.main([str(graph), str(image), *option]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert line.startswith(f"error: {' '.join(option) if option[0] == '--precision' else option[0]}: {graph} is an .onnx file")


# --- files that are no ONNX graph vitkit runs -----------------------------------------------------


def _graph(tmp_path: Path, nodes: list, inputs: list, output: tuple, initializers: list = ()) -> Path:
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info(name, TensorProto.FLOAT, shape) for name, shape in inputs],
        [helper.make_tensor_value_info(output[0], TensorProto.FLOAT, output[1])], initializer=list(initializers),
    )
    path = tmp_path / "hand.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9), str(path))
    return path


@pytest.mark.parametrize("kind", ["truncated", "empty", "random", "missing", "folder", "two-inputs", "fails-at-run-time"])
def test_an_onnx_file_vitkit_cannot_run_is_one_line(
    exported: tuple[Path, Path, Path], tmp_path: Path, kind: str, capsys: pytest.CaptureFixture
) -> None:
    from onnx import TensorProto, helper

    _, graph, image = exported
    path = tmp_path / "x.onnx"
    if kind == "truncated":
        path.write_bytes(graph.read_bytes()[: graph.stat().st_size // 2])
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "random":
        path.write_bytes(np.random.default_rng(0).bytes(4096))
    elif kind == "folder":
        path.mkdir()
    elif kind == "two-inputs":
        axes = helper.make_tensor("axes", TensorProto.INT64, [2], [2, 3])
        path = _graph(tmp_path, [helper.make_node("Add", ["images", "other"], ["sum"]),
                                 helper.make_node("ReduceMean", ["sum", "axes"], ["logits"], keepdims=0)],
                      [("images", [1, 3, 32, 32]), ("other", [1, 3, 32, 32])], ("logits", [1, 3]), [axes])
    elif kind == "fails-at-run-time":  # an index out of range is found only when the graph runs
        indices = helper.make_tensor("indices", TensorProto.INT64, [6], [10_000, 1, 2, 3, 4, 5])
        path = _graph(tmp_path, [helper.make_node("Flatten", ["images"], ["flat"]),
                                 helper.make_node("Gather", ["flat", "indices"], ["logits"], axis=1)],
                      [("images", [1, 3, 32, 32])], ("logits", [1, 6]), [indices])
        proto = onnx.load(str(path))
        entry = proto.metadata_props.add()
        entry.key, entry.value = PREPROCESSING_KEY, json.dumps(_metadata(graph))
        onnx.save(proto, str(path))
    line = _predict_error(path, image, capsys)
    assert str(path) in line, line
    expected = {"two-inputs": "has 2 input(s) and 1 output(s)", "fails-at-run-time": "failed when run by onnxruntime",
                "missing": "does not exist", "folder": "is a folder"}.get(kind, "is not a readable ONNX model")
    assert expected in line, line
