"""A model without a classifier (timm's DINOv2, num_classes=0): its rollout is the class token's
rollout of timm's own attention weights (computed here by hand), the gradient methods and a
target class are refused in one line, and ``vitkit maps`` draws rollout and heads."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import timm
import torch
import torch.nn.functional as F
from PIL import Image
from safetensors.torch import save_file

import vitkit
from vitkit.cli import attention_maps
from vitkit.explain import HeadlessModelError, capture_attention, explain

NAME = "vit_small_patch14_reg4_dinov2"


@pytest.fixture
def dinov2() -> torch.nn.Module:
    """timm's DINOv2 with 4 registers, headless as timm builds it, 2 blocks, 28 px (a 2x2 grid)."""
    torch.manual_seed(0)
    return timm.create_model(NAME, pretrained=False, depth=2, img_size=28, num_classes=0).eval()


def timm_attention(model: torch.nn.Module, images: torch.Tensor) -> list[torch.Tensor]:
    """Each block's softmax attention ``[B, H, N, N]`` as timm computes it (unfused path)."""
    captured: list[torch.Tensor] = []
    for block in model.blocks:
        block.attn.fused_attn = False
        block.attn.attn_drop.register_forward_hook(lambda _m, inputs, _out: captured.append(inputs[0].detach()))
    with torch.no_grad():
        model(images)
    return captured


def test_rollout_of_a_headless_dinov2_is_the_class_token_rollout_of_timms_attention(dinov2: torch.nn.Module) -> None:
    images = torch.randn(2, 3, 28, 28)
    joint = None
    for attention in timm_attention(dinov2, images):  # Abnar & Zuidema: (mean_h A + I) / 2, rows sum to 1
        mixed = (attention.double().mean(dim=1) + torch.eye(attention.shape[-1], dtype=torch.float64)) / 2
        mixed = mixed / mixed.sum(dim=-1, keepdim=True)
        joint = mixed if joint is None else mixed @ joint
    cls_row = joint[:, 0, 5:]  # class token's row, the 4 patches after the class token and 4 registers
    expected = F.interpolate((cls_row / cls_row.amax(-1, keepdim=True)).reshape(2, 1, 2, 2).float(), size=(28, 28),
                             mode="bilinear", align_corners=False)[:, 0]
    model = vitkit.from_timm(dinov2).eval()
    assert model.config.num_classes == 0
    torch.testing.assert_close(explain(model, images, "rollout"), expected, atol=1e-5, rtol=1e-4)
    assert explain(model, images, "heads", layer=1).shape == (2, 6, 28, 28)


def test_gradient_maps_and_a_target_class_of_a_headless_model_are_refused(dinov2: torch.nn.Module) -> None:
    model = vitkit.from_timm(dinov2).eval()
    images = torch.randn(1, 3, 28, 28)
    capture = capture_attention(model, images)
    assert capture.logits.shape == (1, 0) and capture.targets is None and len(capture.attentions) == 2
    for method in ("grad_rollout", "chefer"):
        with pytest.raises(HeadlessModelError, match="no classifier.*rollout and heads"):
            explain(model, images, method)
    with pytest.raises(HeadlessModelError, match="no classifier"):
        capture_attention(model, images, target=0)
    with pytest.raises(HeadlessModelError, match="no class probability"):
        capture.probabilities  # noqa: B018


@pytest.fixture
def weights_and_image(dinov2: torch.nn.Module, tmp_path: Path) -> tuple[Path, Path]:
    weights = tmp_path / "dinov2.safetensors"
    save_file({key: value.contiguous() for key, value in dinov2.state_dict().items()}, weights)
    image = tmp_path / "cat.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (40, 40, 3), dtype=np.uint8)).save(image)
    return weights, image


def test_maps_of_headless_weights_draw_rollout_and_heads_and_say_why_there_is_no_gradient_map(
    weights_and_image: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    weights, image = weights_and_image
    drawn: list[tuple] = []
    monkeypatch.setattr(attention_maps, "attention_figure", lambda picture, panels, heads, *rest: drawn.append(
        (picture, [title for title, _ in panels], heads, rest[-2])))
    argv = ["--model", NAME, "--timm-weights", str(weights), str(image), "--out", str(tmp_path / "maps")]
    assert attention_maps.main(argv) == 0
    ((_, panels, heads, title),) = drawn
    assert panels == ["attention rollout"] and heads.shape == (6, 28, 28)
    assert title == f"{image}: no classifier, attention read out from the class token"
    assert "note: the model has no classifier (num_classes=0): no grad_rollout, chefer or lrp maps" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("option", "message"),
    [(["--method", "chefer"], "--method chefer explains a class"),
     (["--method", "grad_rollout"], "--method grad_rollout explains a class"),
     (["--method", "lrp"], "--method lrp explains a class"),
     (["--target", "0"], "--target names a class")],
)
def test_maps_of_headless_weights_refuse_a_class_in_one_line(
    weights_and_image: tuple[Path, Path], option: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    weights, image = weights_and_image
    argv = ["--model", NAME, "--timm-weights", str(weights), str(image), "--out", str(tmp_path / "maps"), *option]
    assert attention_maps.main(argv) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"error: {message}") and re.search(r"no classifier \(num_classes=0\)", line)
    assert not (tmp_path / "maps").exists()


def test_faithfulness_of_headless_weights_is_refused_in_one_line(
    weights_and_image: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    from vitkit.cli import faithfulness

    weights, _ = weights_and_image
    argv = ["--model", NAME, "--timm-weights", str(weights), "--data", "name=shapes", "--out", str(tmp_path / "f")]
    assert faithfulness.main(argv) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("error: the model has no classifier (num_classes=0)")
    assert not (tmp_path / "f").exists()


def test_explore_writes_a_page_for_headless_weights(
    weights_and_image: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    from vitkit.cli import explore

    weights, image = weights_and_image
    out = tmp_path / "dinov2.html"
    assert explore.main(["--model", NAME, "--timm-weights", str(weights), str(image), "--out", str(out)]) == 0
    page = out.read_text(encoding="utf-8")
    payload = json.loads(re.search(r'<script type="application/json" id="vitkit-data">(.*?)</script>', page, re.S).group(1))
    assert payload["headless"] and payload["images"][0]["top"] == [] and payload["prefixTokens"] == 5
    assert payload["images"][0]["explanations"]["chefer"] == [] and len(payload["images"][0]["explanations"]["rollout"]) == 4


@pytest.fixture
def encoder_file(tmp_path: Path) -> Path:
    """A headless vitkit encoder, as MAE and DINO pre-training write it: no classes of its own, the
    metadata of the (shapes) data it was trained on."""
    encoder = vitkit.create_model("vit_cifar_tiny", patch_size=8, embed_dim=24, depth=2, num_heads=3, num_classes=0)
    data = {"name": "shapes", "img_size": 32, "num_workers": 0, "shapes_num_samples": 60, "test_fraction": 0.2}
    extra = {**vitkit.data.shapes_info(32).to_extra(), "class_names": [], "data_config": data}
    return vitkit.save_model(encoder.eval(), tmp_path / "encoder.safetensors", extra=extra)


def test_maps_of_a_pretrained_encoder_draw_its_test_images_with_their_true_classes(
    encoder_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--test-images draws the encoder's data's test images, each figure named and titled with the
    image's true class although the model has no classes of its own; the last block's heads are drawn."""
    drawn: list[tuple] = []
    draw = attention_maps.attention_figure

    def recorded(picture, panels, heads, *rest):
        drawn.append((heads, rest[-2]))
        return draw(picture, panels, heads, *rest)

    monkeypatch.setattr(attention_maps, "attention_figure", recorded)
    out = tmp_path / "maps"
    assert attention_maps.main([str(encoder_file), "--test-images", "2", "--out", str(out), "--no-scores"]) == 0
    names = vitkit.data.shapes_info(32).class_names
    files = sorted(file.name for file in out.glob("*.png"))
    assert len(drawn) == 2 and all(heads.shape == (3, 32, 32) for heads, _ in drawn)
    trues = [title.rsplit(", true ", 1)[1] for _, title in drawn]
    assert set(trues) <= set(names)
    assert files == [f"test_{index:03d}_{true.replace(' ', '_')}.png" for index, true in enumerate(trues)]


def test_explore_of_a_pretrained_encoder_names_each_test_images_true_class(encoder_file: Path, tmp_path: Path) -> None:
    from vitkit.cli import explore

    out = tmp_path / "encoder.html"
    assert explore.main([str(encoder_file), "--test-images", "2", "--out", str(out)]) == 0
    page = out.read_text(encoding="utf-8")
    payload = json.loads(re.search(r'<script type="application/json" id="vitkit-data">(.*?)</script>', page, re.S).group(1))
    names = vitkit.data.shapes_info(32).class_names
    assert payload["headless"] and len(payload["images"]) == 2
    for record in payload["images"]:
        assert re.fullmatch(r"test image \d+ \((.+)\)", record["name"]).group(1) in names and record["label"] is None


def test_evaluating_a_pretrained_encoder_is_refused_in_one_line(
    encoder_file: Path, capsys: pytest.CaptureFixture
) -> None:
    from vitkit.cli import evaluate

    assert evaluate.main([str(encoder_file)]) != 0
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: the model has no classifier (num_classes=0)") and "model.pretrained=" in line
