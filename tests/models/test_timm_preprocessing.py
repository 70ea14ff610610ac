"""Timm weights are preprocessed as timm trained them: from_timm records the timm model's
pretrained_cfg, --timm-weights reads timm.get_pretrained_cfg(name), --mean/--std/--crop-pct
override, and the eval transform follows crop_mode and interpolation. Expected values are timm's
published configs (augreg ViTs: mean = std = 0.5, crop 0.9, bicubic; DeiT and DINO: ImageNet
statistics), written out here."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import timm
import torch
from PIL import Image

import vitkit
from vitkit.cli.explain_io import load_explained_model
from vitkit.data import DataInfo, build_eval_transform

IMAGENET = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
HALF = ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))


@pytest.mark.parametrize(
    ("name", "stats"), [("vit_tiny_patch16_224", HALF), ("deit_tiny_patch16_224", IMAGENET)]
)
def test_from_timm_records_each_familys_own_preprocessing(name: str, stats: tuple) -> None:
    model = vitkit.from_timm(timm.create_model(name, pretrained=False, depth=1))
    cfg = model.pretrained_cfg
    assert (tuple(cfg["mean"]), tuple(cfg["std"])) == stats
    assert (cfg["crop_pct"], cfg["crop_mode"], cfg["interpolation"]) == (0.9, "center", "bicubic")
    assert tuple(cfg["input_size"]) == (3, 224, 224)
    info = DataInfo.from_pretrained_cfg(cfg, model.config.num_classes)
    assert (info.mean, info.std, info.crop_pct, info.interpolation) == (*stats, 0.9, "bicubic")


def test_from_timm_input_size_follows_a_resized_model() -> None:
    model = vitkit.from_timm(timm.create_model("vit_tiny_patch16_224", pretrained=False, depth=1), img_size=64)
    assert tuple(model.pretrained_cfg["input_size"]) == (3, 64, 64)


def test_predict_normalises_a_timm_model_with_its_own_mean_and_std() -> None:
    model = vitkit.from_timm(timm.create_model("vit_tiny_patch16_224", pretrained=False, depth=1, num_classes=5))
    pixels = np.random.default_rng(0).integers(0, 256, (248, 248, 3), dtype=np.uint8)
    # crop_pct 0.9: the shorter side is resized to floor(224 / 0.9) = 248 (already so), centre crop 224
    crop = pixels[12:236, 12:236].astype(np.float32) / 255
    expected = model((torch.from_numpy((crop - 0.5) / 0.5).permute(2, 0, 1))[None]).softmax(-1)[0]
    (prediction,) = vitkit.predict(model, Image.fromarray(pixels), top_k=5)
    assert np.allclose(prediction.probabilities, expected[list(prediction.indices)].detach().numpy(), atol=1e-5)


@pytest.fixture
def small_weights(tmp_path: Path) -> Path:
    """A timm state dict of a 1-block, 48-wide vit_small_patch16_224 (6 heads, as the name says)."""
    path = tmp_path / "vit_s.pth"
    torch.save(vitkit.to_timm_state_dict(vitkit.create_model("vit_small_patch16_224", depth=1, embed_dim=48)), path)
    return path


@pytest.mark.parametrize(
    ("name", "stats", "source"),
    [
        ("vit_small_patch16_224", HALF, "pretrained_cfg of vit_small_patch16_224.augreg_in21k_ft_in1k"),
        ("vit_small_patch16_224.dino", IMAGENET, "pretrained_cfg of vit_small_patch16_224.dino"),
    ],
)
def test_timm_weights_take_the_pretrained_cfg_of_their_name(
    small_weights: Path, name: str, stats: tuple, source: str
) -> None:
    _, extra = load_explained_model(None, name, small_weights)
    assert (tuple(extra["mean"]), tuple(extra["std"])) == stats
    assert (extra["crop_pct"], extra["interpolation"]) == (0.9, "bicubic")
    assert source in extra["preprocessing"]


def test_mean_std_and_crop_flags_override_and_the_note_says_so(
    small_weights: Path, tmp_path: Path, capsys: pytest.CaptureFixture, load_tool
) -> None:
    image = tmp_path / "cat.png"
    Image.fromarray(np.zeros((50, 60, 3), dtype=np.uint8)).save(image)
    args = ["--model", "vit_small_patch16_224", "--timm-weights", str(small_weights), str(image), "--method", "rollout"]
    main = load_tool("attention_maps").main
    assert main([*args, "--out", str(tmp_path / "a")]) == 0
    assert "normalised with mean (0.5, 0.5, 0.5) and std (0.5, 0.5, 0.5)" in capsys.readouterr().out
    flags = ["--mean", "0.1", "0.2", "0.3", "--std", "0.4", "0.5", "0.6", "--crop-pct", "1.0"]
    assert main([*args, *flags, "--out", str(tmp_path / "b")]) == 0
    note = capsys.readouterr().out
    assert "mean (0.1, 0.2, 0.3) and std (0.4, 0.5, 0.6)" in note and "crop_pct 1.0" in note
    assert "--mean, --std, --crop-pct given" in note
    assert main([*args, "--mean", "0.1", "--out", str(tmp_path / "c")]) == 2  # one value for 3 channels
    assert "error: --mean/--std/--crop-pct" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("override", "words"),
    [
        ({"std": (0.0, 0.5, 0.5)}, "std must be positive finite"),
        ({"std": (-0.5, -0.5, -0.5)}, "std must be positive finite"),
        ({"std": (float("nan"),) * 3}, "std must be positive finite"),
        ({"mean": (float("inf"), 0.5, 0.5)}, "mean must be finite"),
        ({"crop_pct": 0.0}, r"crop_pct must lie in \(0, 1\], got 0.0"),  # not replaced by timm's default
    ],
)
def test_preprocessing_values_that_would_give_nan_images_are_refused(
    small_weights: Path, override: dict, words: str
) -> None:
    with pytest.raises(vitkit.VitkitError, match=f"--mean/--std/--crop-pct: {words}"):
        load_explained_model(model_name="vit_small_patch16_224", timm_weights=small_weights, **override)


@pytest.mark.parametrize(
    ("name", "words"),
    [
        ("vit_small_patch16_224.nosuchtag", "timm has no tag 'nosuchtag' for vit_small_patch16_224; its tags are augreg"),
        ("vit_small_patch16_224.", "timm has no tag '' for vit_small_patch16_224"),
        ("beit_base_patch16_224", "relative position bias"),
    ],
)
def test_a_timm_name_with_an_unknown_tag_or_an_unsupported_family_is_one_error(
    small_weights: Path, name: str, words: str
) -> None:
    with pytest.raises(vitkit.VitkitError, match=words):
        load_explained_model(model_name=name, timm_weights=small_weights)


def test_eval_transform_follows_crop_mode_and_interpolation() -> None:
    base = DataInfo(1, ("a",), (4, 4), 1, (0.0,), (1.0,), "test")  # Normalize is x / 255
    stripes = np.zeros((4, 8, 1), dtype=np.uint8)
    stripes[:, :2] = 255  # the left quarter white
    center = build_eval_transform(base)(stripes)[0]
    assert torch.equal(center, torch.zeros(4, 4))  # the centre 4 of 8 columns are black
    squash = build_eval_transform(DataInfo(**{**base.__dict__, "crop_mode": "squash"}))(stripes)[0]
    assert torch.allclose(squash[:, 0], torch.ones(4)) and torch.equal(squash[:, 2:], torch.zeros(4, 2))
    border = build_eval_transform(DataInfo(**{**base.__dict__, "crop_mode": "border", "mean": (0.2,)}))(stripes)[0]
    # 4x8 -> 2x4, padded with the mean colour 51 (0 once normalised) to 4x4
    assert torch.allclose(border[[0, 3]], torch.zeros(2, 4), atol=1e-6)
    assert torch.allclose(border[1], torch.tensor([0.8, -0.2, -0.2, -0.2]), atol=1e-6)
    checker = (np.indices((2, 2)).sum(axis=0) % 2 * 255).astype(np.uint8)[..., None]
    nearest = build_eval_transform(DataInfo(**{**base.__dict__, "interpolation": "nearest"}))(checker)[0]
    assert torch.equal(nearest, torch.from_numpy(checker[..., 0].repeat(2, 0).repeat(2, 1) / 255).float())
    assert not torch.equal(build_eval_transform(base)(checker)[0], nearest)  # bilinear blends
