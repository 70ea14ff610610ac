"""LoRA adapters (Hu et al. 2021, arXiv 2106.09685): a fresh adapter changes nothing, the update is
``W + (alpha / r) B A`` on exactly the targeted projections, only the adapters train, and the
merged model is a plain ViT that every tool loads."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from vitkit import load_model, save_model
from vitkit.io import CheckpointError, read_model
from vitkit.layers import (
    CrossAttention,
    LoraConfig,
    LoraError,
    LoRALinear,
    add_lora,
    has_lora,
    merge_lora,
    merge_lora_state_dict,
)
from vitkit.models import VisionTransformer, ViTConfig, to_timm
from vitkit.schema import ConfigError

CONFIG = ViTConfig(img_size=8, patch_size=2, in_chans=1, num_classes=5, embed_dim=16, depth=2, num_heads=2,
                   mlp_ratio=2.0, attn_impl="explicit")


def noisy_(module: nn.Module) -> nn.Module:
    """Noise on every adapter's B (a trained adapter), so each one changes the output."""
    with torch.no_grad():
        for name, param in module.named_parameters():
            if name.endswith("lora_B"):
                param.normal_(std=0.1)
    return module


def test_a_fresh_adapter_leaves_the_model_exactly_as_it_was() -> None:
    model = VisionTransformer(CONFIG).eval()
    images = torch.randn(3, 1, 8, 8)
    expected = model(images)
    add_lora(model, LoraConfig(rank=2, targets=["qkv", "proj", "fc1", "fc2"]))
    assert torch.equal(model(images), expected)


def test_the_update_is_the_base_layer_plus_scaled_b_times_a() -> None:
    base = nn.Linear(6, 4)
    x = torch.randn(5, 6)
    layer = noisy_(LoRALinear(base, rank=2, alpha=3.0))
    expected = x @ base.weight.T + base.bias + (3.0 / 2) * (x @ layer.lora_A.T @ layer.lora_B.T)
    torch.testing.assert_close(layer(x), expected)
    torch.testing.assert_close(layer.merged()(x), expected)


@pytest.mark.parametrize("target", ["qkv", "proj", "fc1", "fc2"])
def test_each_target_gets_its_adapter_and_only_it(target: str) -> None:
    model = VisionTransformer(CONFIG).eval()
    images = torch.randn(2, 1, 8, 8)
    expected = model(images)
    names = add_lora(model, LoraConfig(rank=2, targets=[target]))
    assert len(names) == 2 and all(name.endswith(target) for name in names)
    noisy_(model)
    assert not torch.allclose(model(images), expected)


def test_merged_and_unmerged_models_give_the_same_logits_and_the_merged_one_is_a_plain_vit(tmp_path) -> None:
    model = VisionTransformer(CONFIG).eval()
    add_lora(model, LoraConfig(rank=3, alpha=6.0, targets=["qkv", "fc2"]))
    noisy_(model)
    images = torch.randn(4, 1, 8, 8)
    unmerged = model(images)
    state = merge_lora_state_dict(model.state_dict())
    merge_lora(model)
    assert not has_lora(model)
    torch.testing.assert_close(model(images), unmerged, atol=1e-5, rtol=1e-5)
    plain = VisionTransformer(CONFIG).eval()
    assert set(plain.state_dict()) == set(model.state_dict()) == set(state)
    plain.load_state_dict(state)  # strict: the state-dict merge gives the same plain model
    torch.testing.assert_close(plain(images), unmerged, atol=1e-5, rtol=1e-5)
    reloaded = load_model(save_model(model, tmp_path / "merged.safetensors")).eval()
    torch.testing.assert_close(reloaded(images), unmerged, atol=1e-5, rtol=1e-5)


def test_only_the_adapters_train_and_the_base_weights_stay() -> None:
    model = VisionTransformer(CONFIG)
    for param in model.parameters():
        param.requires_grad_(False)
    add_lora(model, LoraConfig(rank=2))
    trainable = {name for name, param in model.named_parameters() if param.requires_grad}
    assert trainable == {f"blocks.{i}.attn.{p}.lora_{m}" for i in range(2) for p in ("qkv", "proj") for m in "AB"}
    before = {name: value.clone() for name, value in model.state_dict().items()}
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=0.1, weight_decay=0.0)
    model(torch.randn(4, 1, 8, 8)).logsumexp(-1).sum().backward()
    optimizer.step()
    changed = {name for name, value in model.state_dict().items() if not torch.equal(value, before[name])}
    assert changed == {name for name in trainable if name.endswith("lora_B")}  # A moves only once B is nonzero


def test_an_adapter_takes_over_its_base_layers_tensors_and_they_stop_requiring_grad() -> None:
    base = nn.Linear(6, 4)
    layer = LoRALinear(base, rank=2, alpha=2.0)
    assert layer.weight is base.weight and layer.bias is base.bias
    assert not base.weight.requires_grad and not base.bias.requires_grad
    assert layer.lora_A.requires_grad and layer.lora_B.requires_grad


def test_adapter_dropout_acts_on_the_adapter_path_in_training_only() -> None:
    base = nn.Linear(8, 8)
    layer = noisy_(LoRALinear(base, rank=4, alpha=4.0, dropout=0.5))
    x = torch.randn(64, 8)
    layer.eval()
    torch.testing.assert_close(layer(x), layer.merged()(x))
    layer.train()
    torch.manual_seed(1)
    trained = layer(x)
    assert not torch.allclose(trained, layer.merged()(x))
    plain = noisy_(LoRALinear(nn.Linear(8, 8), rank=4, alpha=4.0)).train()
    torch.testing.assert_close(plain(x), plain.merged()(x))  # no dropout: training output is the merged one


def test_pruning_heads_of_an_unmerged_adapter_is_refused_and_a_pruned_model_takes_adapters() -> None:
    model = VisionTransformer(CONFIG.replace(num_heads=[2, 1], head_dim=8))
    add_lora(model, LoraConfig(rank=2))
    with pytest.raises(ValueError, match="merge them first"):
        model.blocks[0].attn.prune_heads([0])
    noisy_(model)
    images = torch.randn(2, 1, 8, 8)
    model.eval()
    plain = VisionTransformer(CONFIG.replace(num_heads=[2, 1], head_dim=8)).eval()
    plain.load_state_dict(merge_lora_state_dict(model.state_dict()))
    torch.testing.assert_close(plain(images), model(images), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"rank": 0}, "rank"),
        ({"alpha": 0}, "alpha"),
        ({"targets": []}, "targets"),
        ({"targets": ["qkv", "qkv"]}, "targets"),
        ({"targets": ["q"]}, "targets"),
    ],
)
def test_bad_adapter_settings_are_one_line(values: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as error:
        LoraConfig.from_dict(values)
    assert "\n" not in str(error.value)


def test_a_rank_above_the_layer_size_is_refused() -> None:
    with pytest.raises(ValueError, match="LoRA rank 9 exceeds the layer's 8 inputs"):
        LoRALinear(nn.Linear(8, 16), rank=9, alpha=1.0)


def test_cross_attention_goes_through_the_adapter_and_its_dropout() -> None:
    msa = CrossAttention(16, 2).eval()
    msa.qkv = noisy_(LoRALinear(msa.qkv, rank=4, alpha=4.0, dropout=0.5))
    x, context = torch.randn(2, 3, 16), torch.randn(2, 5, 16)
    adapted = msa(x, context)
    assert not torch.allclose(msa.train()(x, context), adapted)  # training: the adapter's input is dropped
    merge_lora(msa.eval())
    torch.testing.assert_close(msa(x, context), adapted, atol=1e-5, rtol=1e-5)


def test_save_model_and_to_timm_of_an_unmerged_model_give_plain_models(tmp_path) -> None:
    model = VisionTransformer(CONFIG.replace(attn_impl="auto")).eval()
    add_lora(model, LoraConfig(rank=2, targets=["qkv", "proj", "fc1", "fc2"]))
    noisy_(model)
    images = torch.randn(2, 1, 8, 8)
    reloaded = load_model(save_model(model, tmp_path / "lora.safetensors")).eval()
    assert has_lora(model) and not has_lora(reloaded)  # the caller's model keeps its adapters
    torch.testing.assert_close(reloaded(images), model(images), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(to_timm(model).eval()(images), model(images), atol=1e-5, rtol=1e-5)


def test_a_lora_checkpoint_loads_merged_and_a_broken_adapter_is_one_line(tmp_path: Path) -> None:
    model = VisionTransformer(CONFIG).eval()
    add_lora(model, LoraConfig(rank=2, targets=["fc1"]))
    noisy_(model)
    images = torch.randn(2, 1, 8, 8)
    path = lightning_checkpoint(model.state_dict(), model.config, tmp_path / "best.ckpt")
    torch.testing.assert_close(load_model(path).eval()(images), model(images), atol=1e-5, rtol=1e-5)
    for broken in ("lora_B", "lora_scale"):
        state = model.state_dict()
        del state[f"blocks.1.mlp.fc1.{broken}"]
        with pytest.raises(CheckpointError, match=rf"best\.ckpt: .*blocks\.1\.mlp\.fc1\.{broken}") as error:
            read_model(lightning_checkpoint(state, model.config, path))
        assert "\n" not in str(error.value)
    with pytest.raises(LoraError, match=r"fc1\.weight \[32, 16\] has lora_A \[2, 32\], lora_B \[32, 2\]"):
        merge_lora_state_dict({**model.state_dict(), "blocks.0.mlp.fc1.lora_A": torch.zeros(2, 32)})


def lightning_checkpoint(state: dict, config: ViTConfig, path: Path) -> Path:
    """``state`` laid out as a training run's Lightning checkpoint of a ``config`` model."""
    hparams = {"vit_config": config.to_dict(), "vitkit_format": "2", "extra": {}}
    torch.save({"state_dict": {"model." + k: v for k, v in state.items()}, "hyper_parameters": hparams}, path)
    return path


def test_a_float64_model_merges_in_float64() -> None:
    model = VisionTransformer(CONFIG).double()
    add_lora(model, LoraConfig(rank=2, targets=["qkv", "fc1"]))
    state = model.state_dict()
    merged = merge_lora_state_dict(state)
    assert torch.equal(merged["blocks.0.attn.qkv.weight"], state["blocks.0.attn.qkv.weight"])  # B is zero: exact
    noisy_(model)
    state = model.state_dict()
    merged = merge_lora_state_dict(state)
    key = "blocks.1.mlp.fc1."
    expected = state[key + "weight"] + state[key + "lora_scale"] * (state[key + "lora_B"] @ state[key + "lora_A"])
    assert merged[key + "weight"].dtype == torch.float64
    torch.testing.assert_close(merged[key + "weight"], expected, rtol=1e-12, atol=1e-14)


def test_a_state_dict_without_adapters_comes_back_unchanged() -> None:
    state = VisionTransformer(CONFIG).state_dict()
    assert merge_lora_state_dict(state) is state and not has_lora(state)


def test_a_rank_above_a_pruned_layer_is_one_line_naming_it_and_changes_nothing() -> None:
    model = VisionTransformer(CONFIG.replace(num_heads=[2, 1], head_dim=4))  # block 1's proj takes 4 features
    with pytest.raises(LoraError, match=r"rank 5 exceeds blocks\.1\.attn\.proj's 4 inputs") as error:
        add_lora(model, LoraConfig(rank=5))
    assert "\n" not in str(error.value) and not has_lora(model)


def test_adapters_added_to_a_model_in_eval_mode_do_not_drop() -> None:
    model = VisionTransformer(CONFIG).eval()
    add_lora(model, LoraConfig(rank=2, dropout=0.5))
    noisy_(model)
    images = torch.randn(2, 1, 8, 8)
    assert torch.equal(model(images), model(images))
