"""vitkit.predict and ``vitkit predict`` on a model trained by vitkit.train and on timm weights
(checked against timm's own model), against preprocessing written out here with PIL and numpy."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import timm
import torch
from PIL import Image
from safetensors import safe_open
from safetensors.torch import save_file
from tiny_runs import SHORT, tiny_recipe

import vitkit
from vitkit.cli.predict import main as predict_main
from vitkit.data import DataInfo, ImageReadError
from vitkit.inference import PredictionError


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The model file of a few-step training run on 8x8 digits (grayscale, crop_pct 1)."""
    from vitkit.train import train

    return train(tiny_recipe(tmp_path_factory.mktemp("run"), **SHORT)).run_dir / "model.safetensors"


def block_image(seed: int) -> Image.Image:
    """A 16x24 RGB image of 2x2 pixel blocks: halving it gives the block values under any
    resampling filter (so the test does not depend on OpenCV's or PIL's kernels)."""
    blocks = np.random.default_rng(seed).integers(0, 256, (8, 12, 3), dtype=np.uint8)
    return Image.fromarray(blocks.repeat(2, axis=0).repeat(2, axis=1))


def by_hand(image: Image.Image, model_file: Path) -> torch.Tensor:
    """The model input [1, 1, 8, 8] as the training metadata says: grayscale (ITU-R 601 luma),
    shorter side resized to 8, centre crop 8x8, (x / 255 - mean) / std."""
    with safe_open(str(model_file), framework="pt") as handle:
        extra = json.loads(handle.metadata()["vitkit_extra"])
    assert extra["img_size"] == [8, 8] and extra["in_chans"] == 1 and extra["crop_pct"] == 1.0
    gray = image.convert("L").resize((12, 8), Image.BOX)  # 24x16 -> 12x8
    cropped = gray.crop((2, 0, 10, 8))  # the centre 8 of 12 columns
    pixels = np.asarray(cropped, dtype=np.float32) / 255.0
    normalised = (pixels - extra["mean"][0]) / extra["std"][0]
    return torch.from_numpy(normalised)[None, None]


def test_predict_applies_the_model_files_preprocessing(trained: Path) -> None:
    image = block_image(0)
    model = vitkit.load_model(trained).eval()
    with torch.no_grad():
        expected = model(by_hand(image, trained)).softmax(dim=-1)[0]
    (prediction,) = vitkit.predict(trained, image, top_k=10)
    order = expected.argsort(descending=True)
    assert prediction.indices == tuple(order.tolist())
    assert prediction.classes == tuple(str(i) for i in order.tolist())  # digits are named "0".."9"
    assert np.allclose(prediction.probabilities, expected[order].numpy(), atol=1e-5)
    assert sum(prediction.probabilities) == pytest.approx(1.0, abs=1e-5)


def test_predict_uses_eval_mode_and_leaves_a_training_model_as_it_was(trained: Path) -> None:
    model, extra = vitkit.load_model_and_extra(trained)
    info = DataInfo(num_classes=10, class_names=tuple(map(str, range(10))), img_size=(8, 8), in_chans=1,
                    mean=tuple(extra["mean"]), std=tuple(extra["std"]), name="digits")
    model.head_drop = torch.nn.Dropout(0.9)  # dropout that would show in training mode
    expected = vitkit.predict(model.eval(), block_image(0), top_k=3, info=info)
    torch.manual_seed(0)
    assert vitkit.predict(model.train(), block_image(0), top_k=3, info=info) == expected  # no dropout
    assert all(module.training for module in model.modules())


def test_predict_averages_mirrored_views_as_the_model_file_says(trained: Path, tmp_path: Path) -> None:
    image = block_image(0)
    model, extra = vitkit.load_model_and_extra(trained)
    model.eval()
    pixels = by_hand(image, trained)
    with torch.no_grad():
        both = (model(pixels).softmax(-1) + model(pixels.flip(-1)).softmax(-1))[0] / 2
    mirrored = tmp_path / "mirrored.safetensors"
    vitkit.save_model(model, mirrored, extra={**extra, "tta": "hflip"})  # as a trainer.tta=hflip run saves it
    info = DataInfo.from_extra(extra)
    by_model = vitkit.predict(model, image, top_k=10, info=info, tta="hflip")[0]
    for prediction in (vitkit.predict(mirrored, image, top_k=10)[0], by_model):
        assert np.allclose(prediction.probabilities, both[list(prediction.indices)].numpy(), atol=1e-5)
    (one_view,) = vitkit.predict(mirrored, image, top_k=10, tta="none")
    assert not np.allclose(one_view.probabilities, both[list(one_view.indices)].numpy(), atol=1e-5)


def test_an_unknown_recorded_tta_is_one_error_line_unless_one_is_chosen(
    trained: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    model, extra = vitkit.load_model_and_extra(trained)
    odd = tmp_path / "odd.safetensors"
    vitkit.save_model(model, odd, extra={**extra, "tta": "rot90"})  # a hand-edited file
    image = tmp_path / "x.png"
    block_image(1).save(image)
    assert predict_main([str(odd), str(image)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "'rot90'" in err[0] and "--tta" in err[0]
    assert predict_main([str(odd), str(image), "--tta", "none"]) == 0  # an explicit choice needs no record


def test_predict_takes_paths_images_and_pixel_tensors_alike(trained: Path, tmp_path: Path) -> None:
    images = [block_image(1), block_image(2)]
    path = tmp_path / "one.png"
    images[0].save(path)
    uint8 = torch.from_numpy(np.array(images[1])).permute(2, 0, 1)
    batch = torch.stack([torch.from_numpy(np.array(image)).permute(2, 0, 1) for image in images]).float() / 255
    from_pil = vitkit.predict(trained, images, top_k=3)
    assert [len(p.indices) for p in from_pil] == [3, 3]
    assert vitkit.predict(trained, [path, uint8], top_k=3) == from_pil
    from_floats = vitkit.predict(trained, batch, top_k=3)
    assert [p.indices for p in from_floats] == [p.indices for p in from_pil]
    assert np.allclose([p.probabilities for p in from_floats], [p.probabilities for p in from_pil], atol=1e-6)


def test_predict_refuses_normalised_tensors_and_models_without_metadata(trained: Path) -> None:
    with pytest.raises(vitkit.VitkitError, match=r"pixels in \[0, 1\]"):
        vitkit.predict(trained, torch.randn(3, 8, 8))
    with pytest.raises(vitkit.VitkitError, match="no preprocessing metadata"):
        vitkit.predict(vitkit.load_model(trained), block_image(0))


def test_predict_command_writes_csv_and_names_the_unreadable_file(
    trained: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    folder = tmp_path / "images"
    (folder / "sub").mkdir(parents=True)
    block_image(3).save(folder / "a.png")
    block_image(4).save(folder / "sub" / "b.png")
    (folder / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n not a png")
    (tmp_path / "elsewhere").mkdir()
    block_image(5).save(tmp_path / "elsewhere" / "c.png")
    (folder / "linked").symlink_to(tmp_path / "elsewhere", target_is_directory=True)  # followed, as train does
    (folder / "loop").symlink_to(folder, target_is_directory=True)  # a link to a parent ends, not loops
    out = tmp_path / "predictions.csv"
    code = predict_main([str(trained), str(folder), "--top-k", "2", "--csv", str(out), "--batch-size", "1"])
    captured = capsys.readouterr()
    assert code == 3  # a file was skipped
    assert [line for line in captured.err.splitlines() if line.startswith("error:")] == [
        line for line in captured.err.splitlines() if "broken.png" in line and line.startswith("error:")
    ] != []
    with open(out, newline="") as handle:
        rows = list(csv.reader(handle))
    assert rows[0] == ["path", "class_1", "probability_1", "class_2", "probability_2"]
    expected = vitkit.predict(trained, [folder / "a.png", folder / "linked" / "c.png", folder / "sub" / "b.png"], top_k=2)
    assert [Path(row[0]).name for row in rows[1:]] == ["a.png", "c.png", "b.png"]
    for row, prediction in zip(rows[1:], expected):
        assert (row[1], row[3]) == prediction.classes
        assert np.allclose([float(row[2]), float(row[4])], prediction.probabilities, atol=1e-6)
    assert "a.png: " not in captured.out and "note: images converted" in captured.out  # the CSV has the rows
    assert f"wrote 3 prediction(s) to {out}" in captured.out


def test_predict_command_exit_statuses(trained: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    block_image(5).save(tmp_path / "ok.png")
    assert predict_main([str(trained), str(tmp_path / "ok.png")]) == 0
    assert predict_main([str(tmp_path / "missing.safetensors"), str(tmp_path / "ok.png")]) == 2
    assert "error: " in capsys.readouterr().err
    with pytest.raises(ImageReadError, match="missing.png"):
        vitkit.predict(trained, tmp_path / "missing.png")


def test_predict_csv_never_replaces_another_file_a_symlinks_target_or_its_inputs(
    trained: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    image = tmp_path / "ok.png"
    block_image(6).save(image)
    image_bytes, model_bytes = image.read_bytes(), trained.read_bytes()
    other = tmp_path / "notes.txt"
    other.write_text("keep me")
    link = tmp_path / "link.csv"
    link.symlink_to(other)
    for out in (other, link, trained, image):
        assert predict_main([str(trained), str(image), "--csv", str(out)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"error: --csv {out} ")
    for out in (trained, image):  # inputs, even with --force
        assert predict_main([str(trained), str(image), "--csv", str(out), "--force"]) == 2
    assert (other.read_text(), image.read_bytes(), trained.read_bytes()) == ("keep me", image_bytes, model_bytes)
    assert predict_main([str(trained), str(image), "--csv", str(link), "--force"]) == 0
    assert not link.is_symlink() and link.read_text().startswith("path,") and other.read_text() == "keep me"


def test_predict_csv_into_a_missing_folder_creates_it_and_under_a_file_is_refused(
    trained: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    image = tmp_path / "ok.png"
    block_image(6).save(image)
    assert predict_main([str(trained), str(image), "--csv", str(tmp_path / "new" / "deeper" / "p.csv")]) == 0
    assert (tmp_path / "new" / "deeper" / "p.csv").read_text().startswith("path,")
    (tmp_path / "plain").write_text("a file")
    assert predict_main([str(trained), str(image), "--csv", str(tmp_path / "plain" / "p.csv")]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("error: --csv") and "is a file, not a folder" in line


def test_predict_csv_cells_cannot_be_spreadsheet_formulas(
    trained: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    block_image(7).save("=HYPERLINK(1).png")
    assert predict_main([str(trained), "=HYPERLINK(1).png", "--csv", "predictions.csv"]) == 0
    with open("predictions.csv", newline="") as handle:
        assert list(csv.reader(handle))[1][0] == "'=HYPERLINK(1).png"


def test_predict_exits_2_when_no_image_could_be_read(trained: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert predict_main([str(trained), str(tmp_path / "missing.png")]) == 2
    assert "missing.png" in capsys.readouterr().err


def test_vitkit_lists_only_its_public_names() -> None:
    assert dir(vitkit) == sorted([*vitkit.__all__, "__version__"])
    assert all(getattr(vitkit, name) is not None for name in vitkit.__all__)


def timm_classifier(tmp_path: Path) -> tuple[torch.nn.Module, Path]:
    """A 1-block timm ViT-S/16 at 32 px with 3 classes (augreg preprocessing: mean = std = 0.5,
    crop 0.9, bicubic) and its state dict saved as safetensors."""
    torch.manual_seed(0)
    source = timm.create_model("vit_small_patch16_224", pretrained=False, depth=1, img_size=32, num_classes=3).eval()
    weights = tmp_path / "vit_s.safetensors"
    save_file({key: value.contiguous() for key, value in source.state_dict().items()}, weights)
    return source, weights


def test_predict_command_takes_timm_weights_with_timms_preprocessing(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    source, weights = timm_classifier(tmp_path)
    pixels = np.random.default_rng(1).integers(0, 256, (32, 32, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(tmp_path / "cat.png")
    with torch.no_grad():  # crop 1 at the model's size: no resampling, only (x / 255 - 0.5) / 0.5
        expected = source(torch.from_numpy((pixels / 255.0 - 0.5) / 0.5).float().permute(2, 0, 1)[None]).softmax(-1)[0]
    out = tmp_path / "p.csv"
    argv = ["--model", "vit_small_patch16_224.augreg_in21k_ft_in1k", "--timm-weights", str(weights),
            str(tmp_path / "cat.png"), "--crop-pct", "1", "--top-k", "3", "--csv", str(out)]
    assert predict_main(argv) == 0
    assert "mean (0.5, 0.5, 0.5)" in capsys.readouterr().out
    with open(out, newline="") as handle:
        (row,) = list(csv.reader(handle))[1:]
    order = expected.argsort(descending=True).tolist()
    assert row[1::2] == [f"class {i}" for i in order]
    assert np.allclose([float(p) for p in row[2::2]], expected[order].numpy(), atol=1e-5)


def test_save_model_of_a_timm_model_keeps_its_preprocessing_for_predict(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    source, _ = timm_classifier(tmp_path)
    model = vitkit.from_timm(source)
    path = vitkit.save_model(model, tmp_path / "vit_s_model.safetensors")
    extra = vitkit.load_model_and_extra(path)[1]
    assert (extra["mean"], extra["std"], extra["img_size"], extra["in_chans"]) == ([0.5] * 3, [0.5] * 3, [32, 32], 3)
    assert (extra["crop_pct"], extra["crop_mode"], extra["interpolation"]) == (0.9, "center", "bicubic")
    assert extra["class_names"] == ["class 0", "class 1", "class 2"]
    image = Image.fromarray(np.random.default_rng(2).integers(0, 256, (40, 48, 3), dtype=np.uint8))
    image.save(tmp_path / "cat.png")
    assert vitkit.predict(path, image, top_k=3) == vitkit.predict(model, image, top_k=3)
    assert predict_main([str(path), str(tmp_path / "cat.png")]) == 0 and "cat.png: class" in capsys.readouterr().out
    mine = vitkit.save_model(model, tmp_path / "mine.safetensors", extra={"mean": [0.1, 0.2, 0.3], "class_names": list("abc")})
    extra = vitkit.load_model_and_extra(mine)[1]
    assert (extra["mean"], extra["class_names"], extra["std"]) == ([0.1, 0.2, 0.3], ["a", "b", "c"], [0.5] * 3)


def test_predict_refuses_a_model_without_a_classifier_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    dinov2 = timm.create_model("vit_small_patch14_reg4_dinov2", pretrained=False, depth=1, img_size=28, num_classes=0)
    weights = tmp_path / "dinov2.safetensors"
    save_file({key: value.contiguous() for key, value in dinov2.state_dict().items()}, weights)
    block_image(6).save(tmp_path / "cat.png")
    with pytest.raises(PredictionError, match=r"no classifier \(num_classes=0\)"):
        vitkit.predict(vitkit.from_timm(dinov2), tmp_path / "cat.png")
    argv = ["--model", "vit_small_patch14_reg4_dinov2", "--timm-weights", str(weights), str(tmp_path / "cat.png")]
    assert predict_main(argv) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("error: vit_small_patch14_reg4_dinov2 has no classifier (num_classes=0)")


def test_predict_command_needs_images_after_the_model_file(trained: Path, capsys: pytest.CaptureFixture) -> None:
    assert predict_main([str(trained)]) == 2
    assert capsys.readouterr().err == f"error: no images given after the model file {trained}: " \
        "vitkit predict MODEL_FILE IMAGE_OR_FOLDER...\n"


def test_predict_in_bf16_runs_the_forward_in_bfloat16_and_keeps_the_ranking(trained: Path) -> None:
    """``precision="bf16"`` reaches the forward (the head's output is bfloat16) and changes the
    probabilities only by bfloat16 rounding; float32 stays float32."""
    model = vitkit.load_model(trained)
    seen: list[torch.dtype] = []
    model.head.register_forward_hook(lambda module, args, out: seen.append(out.dtype))
    images = [block_image(seed) for seed in range(4)]
    full = vitkit.predict(trained, images, top_k=10)
    _, extra = vitkit.load_model_and_extra(trained)
    settings = DataInfo.from_extra(extra)
    float32 = vitkit.predict(model, images, top_k=10, info=settings)
    half = vitkit.predict(model, images, top_k=10, info=settings, precision="bf16")
    assert seen == [torch.float32, torch.bfloat16]
    assert float32 == full
    for exact, rounded in zip(float32, half):
        assert rounded.indices[0] == exact.indices[0]
        assert np.allclose(rounded.probabilities, exact.probabilities, atol=0.02)
        assert rounded.probabilities != exact.probabilities
