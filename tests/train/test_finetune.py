"""Fine-tuning: a recipe starts from pretrained weights (a vitkit model file, a pruned model, a
training checkpoint, or a timm model's state dict), fitted to the data: classifier kept or reset,
position embedding resampled, channels adapted, normalisation taken from the weights; every
contradiction refused in one line before anything is written."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pytest
import timm
import torch
from safetensors.torch import save_file
from timm.layers import resample_abs_pos_embed
from tiny_runs import SHORT, tiny_recipe

from vitkit import load_model, save_model
from vitkit.data import build_datasets
from vitkit.io import read_model
from vitkit.models import VisionTransformer, ViTConfig, from_timm
from vitkit.prune import prune_heads
from vitkit.train import RecipeError, load_recipe, train
from vitkit.train.model_builder import load_starting_weights, pretrained_data
from vitkit.train.run import build_module

#: The tiny recipe's architecture (2 blocks, 32 wide, 2 heads, 2x2 patches on 8x8 digits).
TINY = dict(patch_size=2, embed_dim=32, depth=2, num_heads=2, mlp_ratio=2.0)


def tiny_weights(tmp_path: Path, name: str = "pre.safetensors", **overrides: object) -> Path:
    """A randomly initialised tiny model saved as a vitkit model file (10 classes, 8x8, 1 channel)."""
    config = ViTConfig(**{**TINY, "img_size": 8, "in_chans": 1, "num_classes": 10, **overrides})
    model = VisionTransformer(config)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.05 * torch.randn_like(param))  # no zero head or bias: every weight counts
    extra = {"mean": [0.25] * config.in_chans, "std": [0.5] * config.in_chans}
    return save_model(model, tmp_path / name, extra=extra)


def finetune_recipe(tmp_path: Path, pretrained: str, **model: object) -> dict:
    recipe = tiny_recipe(tmp_path / "runs", **SHORT)
    recipe["model"] = {"pretrained": pretrained, **model}
    return recipe


def built(recipe: dict):
    """The module a run would train, built as ``train`` builds it (weights, data, model)."""
    config = load_recipe(recipe)
    weights = load_starting_weights(config.model)
    if weights is not None:
        data, _ = pretrained_data(config.data, weights)
        config = config.__class__(**{**config.__dict__, "data": data})
    return build_module(config, build_datasets(config.data).info, weights)


def test_a_vitkit_model_file_with_the_same_classes_starts_with_all_its_weights(tmp_path: Path) -> None:
    path = tiny_weights(tmp_path)
    module = built(finetune_recipe(tmp_path, str(path)))
    source = load_model(path).state_dict()
    state = module.model.state_dict()
    assert set(state) == set(source)
    for key, value in source.items():
        assert torch.equal(state[key], value), key


def test_a_recipe_naming_its_variant_starts_from_a_model_file_with_the_datas_geometry(tmp_path: Path) -> None:
    # A run's config.yaml names its variant; vit_cifar_tiny's own img_size (32) and classes (10) must
    # not collide with the data's (8x8 digits) when the weights are fitted.
    path = tiny_weights(tmp_path)
    module = built(finetune_recipe(tmp_path, str(path), name="vit_cifar_tiny", **TINY))
    assert module.model.config.img_size == (8, 8) and module.model.config.in_chans == 1
    for key, value in load_model(path).state_dict().items():
        assert torch.equal(module.model.state_dict()[key], value), key


def test_a_new_class_count_resets_the_classifier_and_keeps_the_backbone(tmp_path: Path) -> None:
    path = tiny_weights(tmp_path, num_classes=3)
    module = built(finetune_recipe(tmp_path, str(path)))  # digits: 10 classes
    source = load_model(path).state_dict()
    state = module.model.state_dict()
    assert state["head.weight"].shape == (10, 32)
    for key, value in source.items():
        if not key.startswith("head."):
            assert torch.equal(state[key], value), key


def test_reset_head_true_reinitialises_a_matching_classifier_and_false_refuses_a_new_class_count(tmp_path: Path) -> None:
    path = tiny_weights(tmp_path)
    module = built(finetune_recipe(tmp_path, str(path), reset_head=True))
    assert not torch.equal(module.model.head.weight, load_model(path).head.weight)
    other = tiny_weights(tmp_path, "three.safetensors", num_classes=3)
    with pytest.raises(RecipeError, match=r"reset_head=false .* 3 classes, but the data have 10"):
        built(finetune_recipe(tmp_path, str(other), reset_head=False))


def test_the_position_embedding_is_resampled_to_the_recipes_image_size(tmp_path: Path) -> None:
    path = tiny_weights(tmp_path)
    recipe = finetune_recipe(tmp_path, str(path))
    recipe["data"]["img_size"] = 16  # a 4x4 grid of patches becomes 8x8
    module = built(recipe)
    table = load_model(path).pos_embed.detach()
    expected = resample_abs_pos_embed(table, [8, 8], old_size=[4, 4], num_prefix_tokens=1)  # timm's own resampling
    torch.testing.assert_close(module.model.pos_embed.detach(), expected)


def test_rgb_weights_on_grayscale_data_see_a_gray_image_as_its_rgb_copy(tmp_path: Path) -> None:
    path = tiny_weights(tmp_path, in_chans=3)
    module = built(finetune_recipe(tmp_path, str(path)))  # digits: 1 channel
    source = load_model(path).eval()
    model = module.model.eval()
    gray = torch.randn(4, 1, 8, 8)
    # the filters summed over the channels: the same response as the image repeated in R, G and B
    torch.testing.assert_close(model(gray), source(gray.repeat(1, 3, 1, 1)), atol=1e-5, rtol=1e-5)


def test_a_pruned_model_fine_tunes_with_its_head_counts_kept(tmp_path: Path) -> None:
    path = tiny_weights(tmp_path, num_heads=4)
    pruned = prune_heads(load_model(path), {0: [1, 3], 1: [0]})
    pruned_path = save_model(pruned, tmp_path / "pruned.safetensors", extra={"mean": [0.25], "std": [0.5]})
    recipe = finetune_recipe(tmp_path, str(pruned_path), num_heads=4, embed_dim=32)  # the recipe it was trained with
    result = train(recipe)
    model = load_model(result.run_dir / "model.safetensors")
    assert model.heads_per_layer() == [2, 3]
    assert read_model(result.run_dir / "model.safetensors")[2]["pretrained"]["pretrained"] == str(pruned_path)


def test_the_weights_normalisation_is_used_unless_the_recipe_sets_one(tmp_path: Path) -> None:
    path = tiny_weights(tmp_path)
    config = load_recipe(finetune_recipe(tmp_path, str(path)))
    data, note = pretrained_data(config.data, load_starting_weights(config.model))
    assert (data.mean, data.std) == ((0.25,), (0.5,)) and "mean [0.25]" in note
    recipe = finetune_recipe(tmp_path, str(path))
    recipe["data"]["mean"] = [0.1]
    config = load_recipe(recipe)
    data, note = pretrained_data(config.data, load_starting_weights(config.model))
    assert data.mean == (0.1,) and data.std == (0.5,)
    recipe["data"].update(mean=[0.1], std=[0.3])
    data, note = pretrained_data(load_recipe(recipe).data, load_starting_weights(config.model))
    assert "not " in note and "the same as" not in note
    recipe["data"].update(mean=[0.25], std=[0.5])  # the weights' own values, given again
    data, note = pretrained_data(load_recipe(recipe).data, load_starting_weights(config.model))
    assert "the same as" in note and "not " not in note


def test_grayscale_data_from_rgb_weights_are_normalised_with_the_average_of_their_statistics(tmp_path: Path) -> None:
    model = VisionTransformer(ViTConfig(**{**TINY, "img_size": 8, "in_chans": 3, "num_classes": 10}))
    path = save_model(model, tmp_path / "rgb.safetensors", extra={"mean": [0.2, 0.4, 0.6], "std": [0.1, 0.2, 0.6]})
    recipe = finetune_recipe(tmp_path, str(path))  # digits: 1 channel
    data, note = pretrained_data(load_recipe(recipe).data, load_starting_weights(load_recipe(recipe).model))
    assert data.mean == pytest.approx((0.4,)) and data.std == pytest.approx((0.3,)) and "mean [0.4]" in note
    recipe["data"].update(mean=[0.4], std=[0.3])  # the average given by hand is the weights' own
    data, note = pretrained_data(load_recipe(recipe).data, load_starting_weights(load_recipe(recipe).model))
    assert "the same as" in note and "not " not in note
    recipe["data"].update(mean=[0.2], std=[0.1])  # the first channel's is not
    _, note = pretrained_data(load_recipe(recipe).data, load_starting_weights(load_recipe(recipe).model))
    assert "not " in note


def test_freezing_without_pretrained_weights_is_refused_in_one_line(tmp_path: Path) -> None:
    recipe = tiny_recipe(tmp_path)
    recipe["model"]["freeze"] = "blocks:1"
    with pytest.raises(RecipeError, match=r"model.freeze .*only applies to pretrained weights") as error:
        load_recipe(recipe)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"embed_dim": 64}, r"model.embed_dim=64 \(the weights have 32\)"),
        ({"name": "vit_small_patch16_224"}, r"model.depth=12 \(the weights have 2\)"),
        ({"act_layer": "quick_gelu"}, r"model.act_layer=quick_gelu"),
    ],
)
def test_a_recipe_field_that_contradicts_the_weights_is_refused(tmp_path: Path, override: dict, message: str) -> None:
    path = tiny_weights(tmp_path)
    with pytest.raises(RecipeError, match=message):
        train(finetune_recipe(tmp_path, str(path), **override))
    assert not (tmp_path / "runs").exists()  # refused before a run directory was claimed


def test_free_fields_apply_on_top_of_the_weights(tmp_path: Path) -> None:
    path = tiny_weights(tmp_path)
    module = built(finetune_recipe(tmp_path, str(path), drop_path_rate=0.2, grad_checkpointing=True))
    assert module.model.config.drop_path_rate == 0.2 and module.model.grad_checkpointing
    assert module.model.blocks[1].drop_path1.drop_prob == pytest.approx(0.2)


def test_maes_finetuning_pools_the_patch_tokens_under_a_new_norm(tmp_path: Path) -> None:
    """``model.global_pool=avg`` on an encoder pre-trained with the norm on every token: MAE's
    fine-tuning (facebookresearch/mae ``models_vit.py``: ``fc_norm(x[:, 1:].mean(1))``, ``self.norm``
    deleted), the blocks kept, the new norm as LayerNorm's own init."""
    path = tiny_weights(tmp_path, num_classes=0)
    encoder = load_model(path)
    model = built(finetune_recipe(tmp_path, str(path), global_pool="avg")).model
    assert isinstance(model.norm, torch.nn.Identity) and model.config.use_fc_norm
    for key, value in encoder.state_dict().items():
        if not key.startswith("norm."):
            assert torch.equal(model.state_dict()[key], value), key
    images = torch.randn(3, 1, 8, 8)
    encoder.norm = torch.nn.Identity()  # the blocks' output, before the encoder's own last norm
    tokens = encoder.forward_features(images)[:, 1:]
    expected = torch.nn.functional.layer_norm(tokens.mean(dim=1), (32,), eps=model.config.norm_eps)
    torch.testing.assert_close(model.eval().forward_head(model.forward_features(images), pre_logits=True), expected)


def test_keeping_a_classifier_with_the_final_norm_moved_is_refused(tmp_path: Path) -> None:
    path = tiny_weights(tmp_path)  # 10 classes, as the digits: the classifier would be kept
    with pytest.raises(RecipeError, match=r"final norm moved \(after pooling\).*reset the head"):
        built(finetune_recipe(tmp_path, str(path), global_pool="avg", reset_head=False))
    assert built(finetune_recipe(tmp_path, str(path), global_pool="avg")).model.config.global_pool == "avg"


def test_a_variants_default_pooling_keeps_the_weights_own(tmp_path: Path) -> None:
    path = tiny_weights(tmp_path, global_pool="avg")
    module = built(finetune_recipe(tmp_path, str(path), name="vit_cifar_tiny", **TINY))  # its default: token
    assert module.model.config.global_pool == "avg" and module.model.config.use_fc_norm


def test_a_model_saved_with_token_merging_fine_tunes_without_it(tmp_path: Path) -> None:
    path = tiny_weights(tmp_path, merge_tokens=2, merge_prop_attn=False)  # inference options, not architecture
    assert read_model(path)[0].merge_tokens == 2
    module = built(finetune_recipe(tmp_path, str(path), merge_tokens=0))
    assert module.model.config.merge_tokens == 0
    assert built(finetune_recipe(tmp_path, str(path), merge_tokens=1)).model.config.merge_tokens == 1
    assert built(finetune_recipe(tmp_path, str(path), merge_prop_attn=True)).model.config.merge_prop_attn


def test_pretrained_references_are_checked_before_anything_runs(tmp_path: Path) -> None:
    with pytest.raises(RecipeError, match=r"model.pretrained: .*missing.safetensors does not exist"):
        train(finetune_recipe(tmp_path, str(tmp_path / "missing.safetensors")))
    with pytest.raises(RecipeError, match=r"model.pretrained_file: .*missing.pth does not exist"):
        train(finetune_recipe(tmp_path, "timm:test_vit", pretrained_file=str(tmp_path / "missing.pth")))
    assert not (tmp_path / "runs").exists()
    with pytest.raises(RecipeError, match=r"model.pretrained_file .*only applies to pretrained weights"):
        load_recipe(tiny_recipe(tmp_path) | {"model": {"pretrained_file": "x.safetensors"}})
    path = tiny_weights(tmp_path)
    with pytest.raises(RecipeError, match="names no timm model"):
        load_recipe(finetune_recipe(tmp_path, str(path), pretrained_file=str(path)))
    with pytest.raises(RecipeError, match=r"Did you mean 'timm:test_vit'"):
        train(finetune_recipe(tmp_path, "timm:test_vitt", pretrained_file=str(path)))


def test_a_timm_state_dict_given_as_a_vitkit_file_says_how_to_name_it(tmp_path: Path) -> None:
    timm_file = tmp_path / "timm.safetensors"
    save_file(timm.create_model("test_vit", num_classes=10).state_dict(), str(timm_file))
    with pytest.raises(RecipeError, match=r"model.pretrained=timm:<timm model name> model.pretrained_file="):
        train(finetune_recipe(tmp_path, str(timm_file)))


class _Payload:
    def __reduce__(self):
        return (print, ("pickled code ran",))


def test_a_pth_holding_pickled_code_is_refused_and_never_run(tmp_path: Path, capsys) -> None:
    path = tmp_path / "evil.pth"
    path.write_bytes(pickle.dumps({"patch_embed.proj.weight": _Payload()}))
    with pytest.raises(RecipeError, match="model.pretrained_file: refusing to load"):
        train(finetune_recipe(tmp_path, "timm:test_vit", pretrained_file=str(path)))
    assert "pickled code ran" not in capsys.readouterr().out


def timm_file(tmp_path: Path, name: str, suffix: str = ".safetensors", **kwargs: object) -> Path:
    model = timm.create_model(name, pretrained=False, **kwargs)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.02 * torch.randn_like(param))
    path = tmp_path / f"{name}{suffix}"
    if suffix == ".safetensors":
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    else:
        torch.save(model.state_dict(), path)
    return path


def test_timm_weights_of_another_architecture_are_refused_in_one_line(tmp_path: Path) -> None:
    path = timm_file(tmp_path, "test_vit2", num_classes=10)
    with pytest.raises(RecipeError, match=r"does not hold the weights of timm model test_vit"):
        train(finetune_recipe(tmp_path, "timm:test_vit", pretrained_file=str(path)))


@pytest.mark.parametrize("suffix", [".safetensors", ".pth"])
def test_timm_weights_fine_tune_from_the_timm_models_own_logits(tmp_path: Path, suffix: str) -> None:
    path = timm_file(tmp_path, "test_vit", suffix, num_classes=10)
    recipe = finetune_recipe(tmp_path, "timm:test_vit.r160_in1k", pretrained_file=str(path))
    recipe["data"]["img_size"] = 160  # timm's own size: no resampling, so the logits must be timm's
    recipe["data"]["in_chans"] = 3
    module = built(recipe)
    reference = timm.create_model("test_vit", num_classes=10).eval()
    reference.load_state_dict(torch.load(path, weights_only=True) if suffix == ".pth" else _safetensors(path))
    images = torch.randn(2, 3, 160, 160)
    torch.testing.assert_close(module.model.eval()(images), reference(images), atol=1e-4, rtol=1e-4)
    # the data are normalised as the tag's pretrained_cfg says (test_vit.r160_in1k: mean 0.5, bicubic)
    assert module.hparams["extra"]["mean"] == [0.5, 0.5, 0.5]
    assert module.hparams["extra"]["interpolation"] == "bicubic"


def _safetensors(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(path))


def test_a_timm_fine_tuning_run_trains_exports_and_resumes(tmp_path: Path) -> None:
    path = timm_file(tmp_path, "test_vit", num_classes=1000)  # ImageNet's head: reset for the 10 digits
    recipe = finetune_recipe(tmp_path, "timm:test_vit", pretrained_file=str(path), pretrained_kwargs={"depth": 6})
    recipe["data"]["img_size"] = 32
    result = train(recipe)
    assert result.summary["model"].startswith("fine-tuned from timm:test_vit")
    extra = read_model(result.run_dir / "model.safetensors")[2]
    assert extra["pretrained"] == {"pretrained": "timm:test_vit", "pretrained_file": str(path)}
    model = load_model(result.run_dir / "model.safetensors")
    assert model.config.in_chans == 1 and model.config.num_classes == 10 and model.config.img_size == (32, 32)
    reference = from_timm(timm.create_model("test_vit", num_classes=1000))
    assert model.config.embed_dim == reference.config.embed_dim and model.config.depth == reference.config.depth
    saved = json.loads(json.dumps(load_recipe(result.run_dir / "config.yaml").data.mean))
    assert saved == [0.5]  # the weights' normalisation is recorded in the run's config
    path.unlink()  # a resumed run reads its architecture off the checkpoint: the weights file may be gone
    resumed = train(result.run_dir / "config.yaml", ["trainer.max_epochs=2"],
                    resume=result.run_dir / "checkpoints" / "last.ckpt")
    assert resumed.run_dir == result.run_dir and resumed.summary["epochs"] == 2


def test_model_impl_timm_fine_tunes_timms_own_model_from_vitkit_weights(tmp_path: Path) -> None:
    path = tiny_weights(tmp_path)
    module = built(finetune_recipe(tmp_path, str(path), impl="timm"))
    assert isinstance(module.model, timm.models.vision_transformer.VisionTransformer)
    images = torch.randn(3, 1, 8, 8)
    torch.testing.assert_close(module.model.eval()(images), load_model(path).eval()(images), atol=1e-5, rtol=1e-5)


def test_training_the_built_model_does_not_touch_the_loaded_weights_file(tmp_path: Path) -> None:
    path = tiny_weights(tmp_path)
    before = path.read_bytes()
    train(finetune_recipe(tmp_path, str(path)))
    assert path.read_bytes() == before


#: One model of each timm family vitkit imports (tests/models/test_timm_interop.py's table and the
#: RoPE ViTs timm builds as Eva), each fine-tuned for a few steps from random weights on a file.
TIMM_FAMILIES = [
    "vit_small_patch16_224",
    "vit_base_patch16_gap_224",
    "vit_base_patch16_clip_quickgelu_224",
    "vit_base_patch16_siglip_224",
    "vit_small_patch14_reg4_dinov2",
    "vit_medium_patch16_reg4_gap_256",
    "deit_small_distilled_patch16_224",
    "deit3_small_patch16_224",
    "flexivit_small",
    "vit_small_patch16_rope_mixed_ape_224",
    "vit_medium_patch16_rope_reg1_gap_256",
]


#: Families whose RoPE is defined on a reference grid (timm's ref_feat_shape): trained at their own size.
OWN_SIZE = {"vit_medium_patch16_rope_reg1_gap_256": 256}


@pytest.mark.parametrize("name", TIMM_FAMILIES)
def test_every_timm_family_fine_tunes_end_to_end(tmp_path: Path, name: str) -> None:
    with torch.device("meta"):
        patch = timm.create_model(name, pretrained=False, depth=1).patch_embed.patch_size[0]
    size = OWN_SIZE.get(name, 2 * patch)
    kwargs = {"depth": 2, "img_size": size}
    path = timm_file(tmp_path, name, **kwargs)
    recipe = finetune_recipe(tmp_path, f"timm:{name}", pretrained_file=str(path), pretrained_kwargs=kwargs)
    recipe["data"]["img_size"] = size
    recipe["trainer"].update(batch_size=8, limit_train_batches=2, limit_val_batches=1, limit_test_batches=1)
    result = train(recipe)
    model = load_model(result.run_dir / "model.safetensors")
    source = from_timm(timm.create_model(name, pretrained=False, num_classes=0, **kwargs))
    expected = source.config.replace(  # as save_model records it, with the recipe's free fields
        num_heads=source.config.heads_per_layer(), head_dim=source.config.resolved_head_dim(),
        drop_path_rate=model.config.drop_path_rate, attn_impl=model.config.attn_impl, init=model.config.init,
    )
    assert model.config.replace(num_classes=0, in_chans=3) == expected
    assert model.config.num_classes == 10 and result.summary["global_steps"] == 2


def test_the_recipe_that_trained_the_weights_fine_tunes_them_as_it_is(tmp_path: Path) -> None:
    # model.name's variant has other image sizes and classes (the data's) and leaves derived fields
    # (pos_embed, fc_norm) unset: neither contradicts weights trained by the same recipe
    path = tiny_weights(tmp_path)
    recipe = tiny_recipe(tmp_path / "runs", **SHORT)
    recipe["model"]["pretrained"] = str(path)
    module = built(recipe)
    assert torch.equal(module.model.pos_embed, load_model(path).pos_embed)


def test_a_linear_probe_run_trains_only_the_head_and_the_frozen_depth_is_checked(tmp_path: Path) -> None:
    path = tiny_weights(tmp_path, num_classes=3)
    result = train(finetune_recipe(tmp_path, str(path), freeze="backbone"))
    trained, source = load_model(result.run_dir / "model.safetensors").state_dict(), load_model(path).state_dict()
    for key, value in source.items():
        if not key.startswith("head."):
            assert torch.equal(trained[key], value), key  # frozen through real optimiser steps
    with pytest.raises(RecipeError, match=r"model.freeze must be .*blocks:N' with N in \[0, 2\], got 'blocks:3'"):
        train(finetune_recipe(tmp_path, str(path), freeze="blocks:3"))


def test_a_lora_run_trains_adapters_and_the_head_and_exports_a_plain_merged_model(tmp_path: Path) -> None:
    path = tiny_weights(tmp_path, num_classes=3)
    recipe = finetune_recipe(tmp_path, str(path), lora={"rank": 2, "alpha": 4.0, "targets": ["qkv", "fc1"]})
    module = built(recipe)
    trainable = {name.removeprefix("model.") for name, p in module.named_parameters() if p.requires_grad}
    assert trainable == {"head.weight", "head.bias"} | {
        f"blocks.{i}.{layer}.lora_{m}" for i in range(2) for layer in ("attn.qkv", "mlp.fc1") for m in "AB"
    }
    result = train(recipe)
    exported = read_model(result.run_dir / "model.safetensors")
    assert not any("lora" in key for key in exported[1])  # merged: a plain model every tool loads
    best = read_model(result.summary["best_checkpoint"])  # the checkpoint's adapters merge on read
    images = torch.randn(3, 1, 8, 8)
    model = load_model(result.run_dir / "model.safetensors").eval()
    torch.testing.assert_close(model(images), load_model(result.summary["best_checkpoint"]).eval()(images))
    source = load_model(path).state_dict()
    assert not torch.equal(best[1]["blocks.0.attn.qkv.weight"], source["blocks.0.attn.qkv.weight"])  # adapted
    assert torch.equal(best[1]["blocks.0.attn.proj.weight"], source["blocks.0.attn.proj.weight"])  # not targeted
    resumed = train(result.run_dir / "config.yaml", ["trainer.max_epochs=2"],
                    resume=result.run_dir / "checkpoints" / "last.ckpt")
    assert resumed.summary["epochs"] == 2
    with pytest.raises(RecipeError, match=r"model.freeze .*leave model.freeze unset"):
        load_recipe(finetune_recipe(tmp_path, str(path), lora={"rank": 2}, freeze="blocks:1"))


def test_the_same_class_count_with_other_class_names_resets_the_classifier(tmp_path: Path) -> None:
    model = load_model(tiny_weights(tmp_path))
    digits = [str(i) for i in range(10)]
    others = save_model(model, tmp_path / "others.safetensors", extra={"class_names": [f"c{i}" for i in range(10)]})
    same = save_model(model, tmp_path / "same.safetensors", extra={"class_names": digits})
    assert not torch.equal(built(finetune_recipe(tmp_path, str(others))).model.head.weight, model.head.weight)
    assert torch.equal(built(finetune_recipe(tmp_path, str(same))).model.head.weight, model.head.weight)


def test_the_fine_tuning_recipe_fine_tunes_timm_weights_on_an_image_folder_and_every_tool_takes_the_result(
    tmp_path: Path, capsys
) -> None:
    from PIL import Image

    from vitkit.cli import attention_maps, predict
    from vitkit.prune import prune_heads

    root = tmp_path / "folder"
    rng = np.random.default_rng(0)
    for split, count in (("train", 6), ("val", 3)):
        for name in ("cat", "dog", "owl"):
            (root / split / name).mkdir(parents=True)
            for index in range(count):
                pixels = rng.integers(0, 255, (40, 48, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(root / split / name / f"{index}.png")
    weights = timm_file(tmp_path, "test_vit", depth=2, img_size=32)
    overrides = [
        "model.pretrained=timm:test_vit", f"model.pretrained_file={weights}", "model.pretrained_kwargs={depth: 2, img_size: 32}",
        f"data.root={root}", "data.img_size=32", "data.num_workers=0", "data.augment.rand_augment=null",
        "trainer.max_epochs=1", "trainer.batch_size=6", "trainer.accelerator=cpu", "trainer.devices=1",
        "trainer.precision=32-true", "trainer.enable_progress_bar=false", f"output.dir={tmp_path / 'runs'}",
    ]
    result = train("recipes/finetune_imagefolder.yaml", overrides)
    model_file = result.run_dir / "model.safetensors"
    model = load_model(model_file)
    assert model.config.num_classes == 3 and model.config.embed_dim == 64  # test_vit's width, 3 new classes
    assert result.summary["model"].startswith("fine-tuned from timm:test_vit")
    image = root / "val" / "owl" / "0.png"
    assert predict.main([str(model_file), str(image)]) == 0
    printed = capsys.readouterr().out
    assert any(name in printed for name in ("cat", "dog", "owl"))  # the class names travel with the model file
    assert attention_maps.main(["--checkpoint", str(model_file), str(image), "--out", str(tmp_path / "maps")]) == 0
    assert list((tmp_path / "maps").glob("*.png"))
    heads = model.heads_per_layer()
    assert prune_heads(model, {0: [0]}).heads_per_layer() == [heads[0] - 1, *heads[1:]]
