"""MAE's refusals word for word (``vitkit.tasks.mae``): each names its key and the fix, each check
fires exactly at its boundary, and the task's steps weigh a batch by its images."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from vitkit.models import VisionTransformer, ViTConfig
from vitkit.schema import FieldError
from vitkit.tasks.mae import MaeOptions, MaeTask, check_encoder


def config(**changes: object) -> ViTConfig:
    fields = dict(img_size=8, patch_size=2, in_chans=1, num_classes=0, embed_dim=16, depth=1, num_heads=2)
    return ViTConfig(**{**fields, **changes})


def refused(call, *args) -> str:
    with pytest.raises(FieldError) as caught:
        call(*args)
    return str(caught.value)


def recipe(strategy: str = "ddp", impl: str = "vitkit") -> SimpleNamespace:
    return SimpleNamespace(trainer=SimpleNamespace(strategy=strategy), model=SimpleNamespace(impl=impl))


def test_the_recipe_refusals_name_the_key_and_the_fix() -> None:
    assert refused(MaeTask.check_recipe, MaeOptions(), recipe(strategy="fsdp")) == (
        "trainer.strategy is 'fsdp', but MAE encodes through forward_features, and FSDP gathers a sharded model's "
        "weights for its forward only; pre-train with trainer.strategy=ddp.")
    assert refused(MaeTask.check_recipe, MaeOptions(), recipe(impl="timm")) == (
        "model.impl is 'timm', but MAE runs the encoder on the visible patches only, which vitkit's model does "
        "(forward_features(keep=)): set model.impl=vitkit.")
    MaeTask.check_recipe(MaeOptions(), recipe())


def test_the_decoder_width_must_be_divisible_by_4_and_by_its_heads() -> None:
    for dim, heads in ((6, 2), (12, 8)):  # 6 splits into 2 heads but not into 4; 12 into 4 but not 8 heads
        with pytest.raises(FieldError) as caught:
            MaeOptions(decoder_dim=dim, decoder_heads=heads)
        assert str(caught.value) == (f"decoder_dim must be divisible by 4 (its sin-cos position embedding) and by "
                                     f"decoder_heads ({heads}), got {dim}.")
    assert MaeOptions(decoder_dim=24, decoder_heads=6).decoder_dim == 24


def test_norm_pix_loss_needs_two_pixel_values_a_patch_and_is_off_by_default() -> None:
    one_pixel = config(patch_size=1)
    check_encoder(one_pixel)  # no norm_pix_loss: a one-value patch is a fine target
    assert refused(check_encoder, one_pixel, True) == (
        "norm_pix_loss normalises each patch's 1 pixel value by its variance, which one value does not have: use a "
        "patch of 2 or more pixels (patch_size), or norm_pix_loss=false.")
    check_encoder(config(patch_size=(1, 2)), True)  # 2 values: a variance
    check_encoder(config(patch_size=(2, 1)), True)  # counted as 2 x 1, not 1 x 1


def test_the_encoder_refusals_name_the_field_and_the_fix() -> None:
    assert refused(check_encoder, config(merge_tokens=1)).startswith(
        "merge_tokens is 1, but MAE's decoder puts every visible token back in its own place, and merged tokens have "
        "none: pre-train with merge_tokens=0 (merge at inference, in the fine-tuned model).")
    assert refused(check_encoder, config(patch_embed="conv")) == (
        "patch_embed is 'conv', whose 3x3 convolutions and BatchNorm run on the whole image before MAE hides patches, "
        "so the hidden pixels reach the visible tokens: pre-train with patch_embed=linear (one patch per token).")
    assert refused(check_encoder, config(shifted_patches=True)) == (
        "shifted_patches is true, which gives each token half of its neighbouring patches before MAE hides patches, "
        "so the hidden pixels reach the visible tokens: pre-train with shifted_patches=false.")
    tail = (", which puts the final norm after pooling, so MAE's decoder would read unnormalised tokens: pre-train "
            "with the norm on every token (global_pool=token, fc_norm unset), then fine-tune with model.global_pool=avg, "
            "as MAE does.")
    assert refused(check_encoder, config(fc_norm=True)) == "fc_norm is true" + tail
    assert refused(check_encoder, config(global_pool="avg")) == "global_pool is 'avg'" + tail


def test_the_steps_weigh_a_batch_by_its_images_and_train_on_its_images() -> None:
    torch.manual_seed(0)
    model = VisionTransformer(config())
    task = MaeTask(model.config, MaeOptions(decoder_depth=1, decoder_dim=16, decoder_heads=2))
    images = torch.randn(3, 1, 8, 8)
    out = task.training_step(model, (images, torch.zeros(3)))
    assert out.batch_size == 3 and out.loss.ndim == 0 and out.loss.requires_grad
    assert task.evaluation_step(model, (images, torch.zeros(3)), "val").batch_size == 3
    assert MaeTask(model.config).decoder is not None  # MAE's default options
