"""An optional dependency that is not installed is one ``error:`` line naming the extra that
installs it (``pip install "vitkit[onnx]"``), exit status 2, never a ``ModuleNotFoundError`` traceback."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import vitkit

#: The onnx extra's packages, each of which the export and serving paths import.
ONNX_EXTRA = ("onnx", "onnxscript", "onnxruntime")
TINY = dict(img_size=16, patch_size=4, embed_dim=32, depth=2, num_heads=4, num_classes=5)


def without(monkeypatch: pytest.MonkeyPatch, package: str) -> None:
    """``import package`` (and its submodules) fails as when it is not installed."""
    for name in [name for name in sys.modules if name == package or name.startswith(f"{package}.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, package, None)


@pytest.mark.parametrize("package", ONNX_EXTRA)
def test_export_and_predict_without_the_onnx_extra_say_how_to_install_it(
    package: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    from PIL import Image

    from vitkit.cli import benchmark, export, predict

    checkpoint = vitkit.save_model(vitkit.VisionTransformer(**TINY), tmp_path / "model.safetensors")
    onnx_file = tmp_path / "model.onnx"
    if package == "onnxruntime":  # serving needs a file written while the extra was there
        assert export.main([str(checkpoint), "--out", str(onnx_file)]) == 0
    image = tmp_path / "a.png"
    Image.new("RGB", (16, 16)).save(image)
    without(monkeypatch, package)
    capsys.readouterr()
    commands = {"onnx": [(export.main, [str(checkpoint), "--out", str(tmp_path / "x.onnx")])],
                "onnxscript": [(export.main, [str(checkpoint), "--out", str(tmp_path / "x.onnx")])],
                "onnxruntime": [(predict.main, [str(onnx_file), str(image)]),
                                (export.main, [str(checkpoint), "--out", str(tmp_path / "q.onnx"), "--quantize", "dynamic"]),
                                (benchmark.main, ["--sections", "onnx"])]}[package]
    for main, argv in commands:
        assert main(argv) == 2, argv
        (line,) = capsys.readouterr().err.splitlines()
        assert line.startswith("error: ") and f"needs {package}" in line and 'pip install "vitkit[onnx]"' in line, line
    assert not (tmp_path / "x.onnx").exists() and not (tmp_path / "q.onnx").exists()
