"""ONNX export: onnxruntime's logits equal vitkit's float32 logits within 1e-4 for every
architecture option and for timm families converted to vitkit, the preprocessing travels in the
file's metadata, the batch size is symbolic with --dynamic-batch, and bad input is one line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import timm
import torch
from timm_families import FAMILIES, ROPE_FAMILIES

import vitkit
from vitkit.data import DataConfig, build_datasets
from vitkit.export import ExportError, export_onnx, read_preprocessing
from vitkit.output_dirs import OutputDirError
from vitkit.prune import prune_heads

ort = pytest.importorskip("onnxruntime", reason="needs onnxruntime (pip install -e '.[dev]')")
pytestmark = pytest.mark.slow
TINY = dict(img_size=16, patch_size=4, embed_dim=32, depth=2, num_heads=4, num_classes=5)


def run_onnx(path: Path, images: torch.Tensor) -> np.ndarray:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {"images": images.numpy()})[0]


def assert_parity(model: torch.nn.Module, path: Path, batch: int = 3, **export: Any) -> None:
    model.eval()
    export_onnx(model, path, **export)
    images = torch.randn(batch if export.get("dynamic_batch", True) else 1, model.config.in_chans,
                         *export.get("img_size", model.config.img_size))
    with torch.no_grad():
        expected = model(images).numpy()
    np.testing.assert_allclose(run_onnx(path, images), expected, atol=1e-4, rtol=1e-4)


def noisy(model: vitkit.VisionTransformer) -> vitkit.VisionTransformer:
    with torch.no_grad():  # zero-initialised heads and biases would hide mistakes
        for param in model.parameters():
            param.add_(0.02 * torch.randn_like(param))
    return model.eval()


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"distilled": True},
        {"global_pool": "map", "class_token": False},
        {"reg_tokens": 2},
        {"rope": "axial"},
        {"rope": "mixed", "reg_tokens": 1},
        {"patch_embed": "conv"},
        {"shifted_patches": True, "locality": True},
        {"qk_norm": True, "init_values": 0.1, "act_layer": "quick_gelu", "pre_norm": True},
    ],
    ids=lambda options: ",".join(f"{k}={v}" for k, v in options.items()) or "plain",
)
def test_onnxruntime_logits_equal_vitkit_s_for_each_architecture_option(options: dict, tmp_path: Path) -> None:
    torch.manual_seed(0)
    assert_parity(noisy(vitkit.VisionTransformer(**{**TINY, **options})), tmp_path / "m.onnx")


def test_a_pruned_model_with_different_head_counts_per_layer_exports(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = prune_heads(noisy(vitkit.VisionTransformer(**TINY)), {0: [1, 3], 1: [0, 1, 2, 3]})
    assert model.heads_per_layer() == [2, 0]
    assert_parity(model, tmp_path / "pruned.onnx")


@pytest.mark.parametrize("name", [*FAMILIES, *ROPE_FAMILIES])
def test_timm_families_converted_to_vitkit_export_with_equal_logits(name: str, tmp_path: Path) -> None:
    torch.manual_seed(0)
    with torch.device("meta"):
        patch = timm.create_model(name, pretrained=False, depth=1).patch_embed.patch_size[0]
    source = timm.create_model(name, pretrained=False, depth=2, img_size=2 * patch, num_classes=10)
    assert_parity(noisy(vitkit.from_timm(source)), tmp_path / "family.onnx", batch=2)


def test_the_batch_is_symbolic_only_with_dynamic_batch_and_the_preprocessing_is_in_the_metadata(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = noisy(vitkit.VisionTransformer(**TINY))
    extra = {"mean": [0.5, 0.5, 0.5], "std": [0.25, 0.25, 0.25], "class_names": list("abcde")}
    fixed = export_onnx(model, tmp_path / "fixed.onnx", dynamic_batch=False, extra=extra)
    assert read_preprocessing(fixed) == extra
    with pytest.raises(Exception, match="(?i)dimension|shape|got"):
        run_onnx(fixed, torch.randn(3, 3, 16, 16))
    assert_parity(model, tmp_path / "dynamic.onnx", batch=5, dynamic_batch=True)


def test_the_model_is_left_as_it_was_in_training_mode_with_its_kernels(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = noisy(vitkit.VisionTransformer(**TINY, attn_impl="explicit", drop_rate=0.5)).train()
    path = export_onnx(model, tmp_path / "m.onnx")
    assert all(module.training for module in model.modules())  # as it was: in training mode
    assert {module.attn_impl for module in model.modules() if hasattr(module, "attn_impl")} == {"explicit"}
    images = torch.randn(2, 3, 16, 16)
    with torch.no_grad():  # the graph is the eval forward: no dropout
        expected = model.eval()(images).numpy()
    np.testing.assert_allclose(run_onnx(path, images), expected, atol=1e-4, rtol=1e-4)


def test_another_input_size_needs_dynamic_img_size_and_whole_patches(tmp_path: Path) -> None:
    torch.manual_seed(0)
    with pytest.raises(ExportError, match="no dynamic_img_size"):
        export_onnx(vitkit.VisionTransformer(**TINY), tmp_path / "a.onnx", img_size=(24, 24))
    flexible = noisy(vitkit.VisionTransformer(**TINY, dynamic_img_size=True))
    with pytest.raises(ExportError, match="whole number of"):
        export_onnx(flexible, tmp_path / "b.onnx", img_size=(18, 24))
    assert_parity(flexible, tmp_path / "c.onnx", img_size=(24, 32))
    assert not (tmp_path / "a.onnx").exists() and not (tmp_path / "b.onnx").exists()


def test_the_export_command_writes_the_file_and_refuses_an_existing_one_without_force(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    from vitkit.cli import export

    torch.manual_seed(0)
    model = noisy(vitkit.VisionTransformer(**TINY))
    checkpoint = vitkit.save_model(model, tmp_path / "model.safetensors", extra={"class_names": list("abcde")})
    out = tmp_path / "model.onnx"
    assert export.main([str(checkpoint), "--out", str(out)]) == 0  # the model positional, the batch dynamic
    assert capsys.readouterr().out.splitlines()[-1].startswith(f"next: vitkit predict {out} IMAGE_OR_FOLDER")
    assert read_preprocessing(out)["class_names"] == list("abcde")
    images = torch.randn(4, 3, 16, 16)  # a served batch of 4
    np.testing.assert_allclose(run_onnx(out, images), model(images).detach().numpy(), atol=1e-4, rtol=1e-4)
    capsys.readouterr()
    assert export.main(["--checkpoint", str(checkpoint), "--out", str(out)]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"error: --out {out} already exists; add --force")
    with pytest.raises(OutputDirError):
        export_onnx(model, out)


def test_predict_on_the_onnx_file_gives_the_model_file_s_output(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from PIL import Image

    from vitkit.cli import export, predict

    torch.manual_seed(0)
    model = noisy(vitkit.VisionTransformer(**TINY))
    extra = {"class_names": list("abcde"), "mean": [0.5, 0.4, 0.3], "std": [0.2, 0.25, 0.3], "img_size": [16, 16],
             "in_chans": 3, "crop_pct": 1.0}
    checkpoint = vitkit.save_model(model, tmp_path / "model.safetensors", extra=extra)
    images = []
    for index in range(3):
        path = tmp_path / f"img{index}.png"
        Image.fromarray(np.random.default_rng(index).integers(0, 256, (20, 24, 3), dtype=np.uint8)).save(path)
        images.append(path)
    for fixed in (False, True):  # a graph of batch 1 runs image by image
        out = tmp_path / f"model{int(fixed)}.onnx"
        assert export.main(["--checkpoint", str(checkpoint), "--out", str(out), *(["--no-dynamic-batch"] if fixed else [])]) == 0
        from_onnx, from_file = vitkit.predict(out, images, top_k=3), vitkit.predict(checkpoint, images, top_k=3)
        for a, b in zip(from_onnx, from_file):
            assert a.indices == b.indices and a.classes == b.classes
            np.testing.assert_allclose(a.probabilities, b.probabilities, atol=1e-4)
    capsys.readouterr()
    assert predict.main([str(tmp_path / "model0.onnx"), *map(str, images), "--top-k", "2"]) == 0
    onnx_lines = capsys.readouterr().out.splitlines()[:3]
    assert predict.main([str(checkpoint), *map(str, images), "--top-k", "2"]) == 0
    file_lines = capsys.readouterr().out.splitlines()[:3]
    strip = [line.split(": ", 1)[1] for line in onnx_lines]
    assert strip == [line.split(": ", 1)[1] for line in file_lines]  # same classes and rounded probabilities


def test_export_quantize_dynamic_writes_int8_linear_layers_close_to_float32(tmp_path: Path) -> None:
    import onnx

    from vitkit.cli import export

    torch.manual_seed(0)
    model = noisy(vitkit.VisionTransformer(**{**TINY, "embed_dim": 64}))
    checkpoint = vitkit.save_model(model, tmp_path / "model.safetensors", extra={"class_names": list("abcde")})
    float32, int8 = tmp_path / "f.onnx", tmp_path / "q.onnx"
    assert export.main(["--checkpoint", str(checkpoint), "--out", str(float32), "--dynamic-batch"]) == 0
    assert export.main(["--checkpoint", str(checkpoint), "--out", str(int8), "--dynamic-batch", "--quantize", "dynamic"]) == 0
    ops = {node.op_type for node in onnx.load(str(int8)).graph.node}
    assert "DynamicQuantizeLinear" in ops and "MatMulInteger" in ops  # the linear layers run in int8
    assert int8.stat().st_size < 0.6 * float32.stat().st_size and read_preprocessing(int8) == read_preprocessing(float32)
    images = torch.randn(16, 3, 16, 16)
    reference = model(images).detach().numpy()
    quantised = run_onnx(int8, images)
    # close, not equal: int8 weights and activations (onnxruntime's int8 kernels round differently per CPU kind)
    error = np.abs(quantised - reference)
    assert error.max() < 0.25 * np.abs(reference).max() and error.mean() < 0.25 * np.abs(reference).mean(), error.max()
    assert np.abs(run_onnx(float32, images) - reference).max() < 1e-4


def test_the_onnx_benchmark_section_times_four_runtimes_and_scores_a_model_file(tmp_path: Path) -> None:
    from vitkit.bench.onnx_runtime import bench_onnx

    tiny = {"tiny": dict(name="vit_cifar_tiny", **TINY)}
    rows = bench_onnx(1, batches=(1, 2), models=tiny)
    body = [row for row in rows if row.startswith("| tiny |")]
    assert len(body) == 2 and all(float(cell.replace(",", "")) > 0 for row in body for cell in row.split("|")[3:7])
    assert not any("test accuracy" in row for row in rows)  # speed only without a model file


def test_the_onnx_benchmark_times_the_model_file_alone_by_its_name_and_scores_it_as_evaluate_does(
    tmp_path: Path,
) -> None:
    """Given a model file, the section times that model alone, named by its file and shape, and its
    top-1 is vitkit evaluate's: the same test images, the same recorded test-time views (hflip)."""
    from vitkit.bench.onnx_runtime import bench_onnx
    from vitkit.train import evaluate

    torch.manual_seed(0)
    digits = {"name": "digits", "img_size": 8, "num_workers": 0, "val_fraction": 0.1, "test_fraction": 0.1}
    model = noisy(vitkit.create_model("vit_cifar_tiny", img_size=8, in_chans=1, patch_size=4, embed_dim=16, depth=2,
                                      num_heads=2, num_classes=10))
    path = vitkit.save_model(model, tmp_path / "digits.safetensors",
                             extra={"dataset": "digits", "data_config": digits, "tta": "hflip"})
    rows = bench_onnx(1, str(path), batches=(1,))
    timed = [row for row in rows if row.startswith("| ") and row.split("|")[2].strip() == "1"]
    assert timed == [row for row in timed if row.startswith("| digits.safetensors (2 blocks, 16 wide, 8x8 px, 10 classes) |")]
    assert len(timed) == 1  # the model asked for, and no other
    header, _, top1 = rows[-3:]
    test_split = len(build_datasets(DataConfig.from_dict(digits)).test)
    assert header.startswith(f"| test accuracy ({test_split} images, hflip views averaged as vitkit evaluate does) | "
                             "vitkit fp32 | onnxruntime fp32 | onnxruntime int8 |")
    fp32, ort_fp32, _ = (float(cell.strip(" %")) for cell in top1.split("|")[2:5])
    assert fp32 == ort_fp32  # the float32 graph classifies exactly as the model
    assert f"{evaluate(path)['top1']:.2f}" == f"{fp32:.2f}"


def test_an_onnx_classifier_runs_on_the_threads_it_is_given(tmp_path: Path) -> None:
    from vitkit.export import OnnxClassifier

    torch.manual_seed(0)
    model = vitkit.VisionTransformer(**TINY).eval()
    graph = export_onnx(model, tmp_path / "model.onnx")
    images = torch.randn(2, 3, 16, 16)
    default, single = OnnxClassifier(graph), OnnxClassifier(graph, num_threads=1)
    assert single.session.get_session_options().intra_op_num_threads == 1
    assert default.session.get_session_options().intra_op_num_threads == 0  # onnxruntime's own choice
    torch.testing.assert_close(single(images), default(images))
