"""``vitkit.read_pretrained`` / ``vitkit.load_pretrained``: pretrained weights into any vitkit model,
as timm's ``load_pretrained`` (read, filter, adapt, load), checked against timm's own resampling and
channel adaptation and against timm's model holding the same weights."""

from __future__ import annotations

from pathlib import Path

import pytest
import timm
import torch
from einops import rearrange
from safetensors.torch import save_file
from timm.layers import resample_abs_pos_embed

import vitkit
from vitkit import VisionTransformer, ViTConfig
from vitkit.models.timm_interop import PATCH_WEIGHT
from vitkit.pretrained import PretrainedError, fit_config

SOURCE = dict(img_size=16, patch_size=4, in_chans=3, num_classes=5, embed_dim=32, depth=2, num_heads=4, mlp_ratio=2.0)


@pytest.fixture
def model_file(tmp_path: Path) -> Path:
    torch.manual_seed(0)
    source = VisionTransformer(ViTConfig(**SOURCE))
    with torch.no_grad():
        source.pos_embed.normal_()
    return vitkit.save_model(source, tmp_path / "source.safetensors", extra={"class_names": list("abcde")})


def test_a_model_at_another_size_channels_and_classes_gets_the_weights_fitted_to_it(model_file: Path) -> None:
    weights = vitkit.read_pretrained(model_file)
    model = VisionTransformer(fit_config(weights, img_size=(24, 24), in_chans=1, num_classes=7))
    fresh_head = model.head.weight.detach().clone()
    assert vitkit.load_pretrained(model, weights) is True  # 7 classes, not 5: a new classifier
    state = weights.state
    expected_pos = resample_abs_pos_embed(state["pos_embed"], [6, 6], [4, 4], num_prefix_tokens=1)
    torch.testing.assert_close(model.pos_embed.detach(), expected_pos)
    rgb = rearrange(state[PATCH_WEIGHT], "d (p1 p2 c) -> d p1 p2 c", p1=4, p2=4, c=3)
    torch.testing.assert_close(model.patch_embed.proj.weight.detach(), rearrange(rgb.sum(-1), "d p1 p2 -> d (p1 p2)"))
    assert torch.equal(model.head.weight.detach(), fresh_head)
    torch.testing.assert_close(model.blocks[1].mlp.fc2.weight.detach(), state["blocks.1.mlp.fc2.weight"])


def test_the_classifier_is_kept_for_the_same_classes_and_refused_to_keep_for_others(model_file: Path) -> None:
    weights = vitkit.read_pretrained(model_file)
    same = VisionTransformer(fit_config(weights))
    assert vitkit.load_pretrained(same, model_file, class_names=list("abcde")) is False
    torch.testing.assert_close(same.head.weight.detach(), weights.state["head.weight"])
    renamed = VisionTransformer(fit_config(weights))
    assert vitkit.load_pretrained(renamed, weights, class_names=list("vwxyz")) is True  # same count, other classes
    with pytest.raises(PretrainedError, match="which has 5 classes, in a model of 3"):
        vitkit.load_pretrained(VisionTransformer(fit_config(weights, num_classes=3)), weights, reset_head=False)


def test_a_model_of_another_architecture_is_refused_in_one_line(model_file: Path) -> None:
    with pytest.raises(PretrainedError, match=r"do not fit this model: .*size mismatch") as error:
        vitkit.load_pretrained(VisionTransformer(ViTConfig(**{**SOURCE, "embed_dim": 48})), model_file)
    assert "\n" not in str(error.value)


def test_timm_weights_are_read_through_a_meta_model_and_give_timms_logits(tmp_path: Path, monkeypatch) -> None:
    torch.manual_seed(0)
    reference = timm.create_model("vit_tiny_patch16_224", img_size=32, depth=2, num_classes=4).eval()
    file = tmp_path / "tiny.safetensors"
    save_file(reference.state_dict(), str(file))
    devices, real_create = [], timm.create_model

    def recording_create(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        built = real_create(*args, **kwargs)
        devices.append(next(built.parameters()).device.type)
        return built

    monkeypatch.setattr(timm, "create_model", recording_create)
    weights = vitkit.read_pretrained("timm:vit_tiny_patch16_224", file=file, timm_kwargs={"img_size": 32, "depth": 2})
    assert devices == ["meta"]  # timm's model is only read: no memory, no init
    model = VisionTransformer(fit_config(weights)).eval()
    vitkit.load_pretrained(model, weights)
    images = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(model(images), reference(images), atol=1e-4, rtol=1e-4)
    assert weights.preprocessing["mean"] == pytest.approx((0.5, 0.5, 0.5))


def test_a_timm_model_over_the_size_limit_is_refused_before_anything_is_allocated(tmp_path: Path) -> None:
    file = tmp_path / "tiny.safetensors"
    save_file(timm.create_model("vit_tiny_patch16_224", img_size=32, depth=1).state_dict(), str(file))
    with pytest.raises(PretrainedError, match=r"timm_kwargs: .*would hold [\d.]+e\+11 weights, more than the limit"):
        vitkit.read_pretrained("timm:vit_tiny_patch16_224", file=file, timm_kwargs={"depth": 100, "embed_dim": 12288})


def test_the_recipe_path_builds_one_vitkit_model(model_file: Path, tmp_path: Path, monkeypatch) -> None:
    from tiny_runs import tiny_recipe

    from vitkit.data import DataInfo
    from vitkit.train import load_recipe
    from vitkit.train.model_builder import build_model, load_starting_weights

    built, real_init = [], VisionTransformer.__init__

    def counting_init(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        built.append(1)
        real_init(self, *args, **kwargs)

    recipe = tiny_recipe(tmp_path)
    recipe["model"] = {"pretrained": str(model_file)}
    config = load_recipe(recipe)
    info = DataInfo(name="digits", num_classes=10, img_size=(8, 8), in_chans=1, mean=(0.5,), std=(0.5,),
                    class_names=tuple(str(i) for i in range(10)))
    weights = load_starting_weights(config.model)
    monkeypatch.setattr(VisionTransformer, "__init__", counting_init)
    model, _ = build_model(config, info, weights)
    assert len(built) == 1 and model.config.num_classes == 10 and model.config.in_chans == 1
