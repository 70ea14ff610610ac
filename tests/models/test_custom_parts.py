"""A ViT built from a registered custom part trains, explains, prunes, saves and reloads; an unknown
part name and a part timm lacks are one line each."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tiny_runs import short_recipe
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

import vitkit
from vitkit.errors import UnsupportedModelError
from vitkit.explain import explain
from vitkit.layers import EncoderBlock, UnknownPartError, get_part, register_block, register_mlp
from vitkit.layers.lora import LoraConfig, LoraError, add_lora
from vitkit.models import vit_flops
from vitkit.models.timm_interop import to_timm
from vitkit.prune import full_gates, head_importance, prune_heads


@register_mlp("test_swiglu")
class SwiGLU(nn.Module):
    """SwiGLU feed-forward (Shazeer 2020, arXiv 2002.05202): ``[..., D] -> [..., D]``."""

    def __init__(self, dim: int, hidden_dim: int, drop: float = 0.0, *, act_layer: str = "gelu",
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, 2 * hidden_dim, device=device, dtype=dtype)
        self.fc2 = nn.Linear(hidden_dim, dim, device=device, dtype=dtype)
        self.drop = nn.Dropout(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        value, gate = self.fc1(x).chunk(2, dim=-1)
        return self.drop(self.fc2(value * nn.functional.silu(gate)))


@register_block("test_post_norm")
class PostNormBlock(EncoderBlock):
    """The original Transformer's post-norm order: ``LN(x + Attn(x))`` then ``LN(x + MLP(x))``."""

    def forward(self, x, *, attn_bias=None, positions=None, head_gates=None, need_weights=False):  # noqa: ANN001, ANN201
        attended = self.attn(x, attn_bias=attn_bias, positions=positions, head_gates=head_gates, need_weights=need_weights)
        attended, weights = attended if need_weights else (attended, None)
        x = self.norm1(x + attended)
        x = self.norm2(x + self.mlp(x))
        return (x, weights) if need_weights else x


@register_mlp("test_swiglu_named")
class NamedSwiGLU(nn.Module):
    """SwiGLU as Meta's LLaMA names it: ``w1`` (gate), ``w3`` (value), ``w2`` (out), no ``fc1``/``fc2``."""

    def __init__(self, dim: int, hidden_dim: int, drop: float = 0.0, *, act_layer: str = "gelu",
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, hidden_dim, device=device, dtype=dtype)
        self.w3 = nn.Linear(dim, hidden_dim, device=device, dtype=dtype)
        self.w2 = nn.Linear(hidden_dim, dim, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(nn.functional.silu(self.w1(x)) * self.w3(x))


@register_block("test_ffn_block")
class FfnBlock(nn.Module):
    """A block without ``.mlp``: its feed-forward network is ``ffn``, a plain Sequential."""

    def __init__(self, dim: int, num_heads: int, attention_options=None, *, mlp_ratio: float = 4.0,  # noqa: ANN001
                 drop_path: float = 0.0, init_values=None, act_layer="gelu", attn_layer="mhsa",  # noqa: ANN001
                 mlp_layer="mlp", device=None, dtype=None) -> None:  # noqa: ANN001
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        hidden = int(dim * mlp_ratio)
        self.norm = nn.LayerNorm(dim, **factory)
        self.attn = get_part("attention", attn_layer)(dim, num_heads, attention_options, **factory)
        self.ffn = nn.Sequential(nn.Linear(dim, hidden, **factory), nn.GELU(), nn.Linear(hidden, dim, **factory))

    def forward(self, x, *, attn_bias=None, positions=None, head_gates=None, need_weights=False):  # noqa: ANN001, ANN201
        attended = self.attn(self.norm(x), attn_bias=attn_bias, positions=positions, head_gates=head_gates, need_weights=need_weights)
        attended, weights = attended if need_weights else (attended, None)
        x = x + attended
        x = x + self.ffn(self.norm(x))
        return (x, weights) if need_weights else x


CUSTOM_NAMES = {"named_swiglu": {"mlp_layer": "test_swiglu_named"}, "ffn_block": {"block": "test_ffn_block"}}


def swiglu_model(**changes: object) -> vitkit.VisionTransformer:
    fields = {"img_size": 8, "patch_size": 2, "embed_dim": 16, "depth": 2, "num_heads": 4, "num_classes": 3,
              "mlp_layer": "test_swiglu", **changes}
    return vitkit.VisionTransformer(**fields).eval()


def test_the_registered_mlp_builds_every_block_and_round_trips_through_a_model_file(tmp_path: Path) -> None:
    model = swiglu_model()
    assert all(isinstance(block.mlp, SwiGLU) for block in model.blocks)
    images = torch.randn(2, 3, 8, 8)
    loaded = vitkit.load_model(vitkit.save_model(model, tmp_path / "swiglu.safetensors"))
    assert loaded.config.mlp_layer == "test_swiglu" and isinstance(loaded.blocks[1].mlp, SwiGLU)
    torch.testing.assert_close(loaded(images), model(images))


def test_a_registered_block_and_block_fn_replace_the_encoder_block() -> None:
    by_name = vitkit.VisionTransformer(img_size=8, patch_size=2, embed_dim=16, depth=2, num_heads=4, num_classes=3,
                                       block="test_post_norm").eval()
    by_fn = vitkit.VisionTransformer(by_name.config.replace(block="encoder"), block_fn=PostNormBlock).eval()
    by_fn.load_state_dict(by_name.state_dict())
    assert all(type(block) is PostNormBlock for block in (*by_name.blocks, *by_fn.blocks))
    images = torch.randn(2, 3, 8, 8)
    torch.testing.assert_close(by_fn(images), by_name(images))
    pre_norm = vitkit.VisionTransformer(by_name.config.replace(block="encoder")).eval()
    pre_norm.load_state_dict(by_name.state_dict())  # same weights, the default pre-norm order
    assert (pre_norm(images) - by_name(images)).abs().max() > 1e-4


def test_maps_and_head_pruning_work_through_a_custom_part() -> None:
    model = swiglu_model()
    images = torch.randn(3, 3, 8, 8)
    for method in ("rollout", "chefer"):
        maps = explain(model, images, method)
        assert maps.shape == (3, 8, 8) and torch.isfinite(maps).all() and maps.max() > 0
    batches = [(images, torch.tensor([0, 1, 2]))]
    scores = head_importance(model, batches)
    assert scores.shape == (2, 4) and torch.isfinite(scores).all()
    gates = full_gates(model)
    gates[0][1] = 0.0
    gated = model(images, head_gates=gates)
    prune_heads(model, {0: [1]})
    assert model.heads_per_layer() == [3, 4] and isinstance(model.blocks[0].mlp, SwiGLU)
    torch.testing.assert_close(model(images), gated, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("part", CUSTOM_NAMES)
def test_parts_with_their_own_layer_names_build_and_take_the_init_scheme(part: str) -> None:
    """Under ``jax`` the MLP's biases are N(0, 1e-6) (torch's default would be up to 1/sqrt(fan_in))
    and under ``vitkit`` zero; the weights are Xavier-uniform, bounded by sqrt(6 / (fan_in + fan_out))."""
    for scheme, bias_bound in (("jax", 1e-4), ("vitkit", 0.0)):
        model = swiglu_model(init=scheme, **CUSTOM_NAMES[part])
        attention = {id(m) for block in model.blocks for m in block.attn.modules()}
        linears = [m for block in model.blocks for m in block.modules() if isinstance(m, nn.Linear) and id(m) not in attention]
        assert len(linears) == 2 * (3 if part == "named_swiglu" else 2)
        for layer in linears:
            assert layer.bias.abs().max() <= bias_bound
            if scheme == "vitkit":
                fan_out, fan_in = layer.weight.shape
                assert layer.weight.abs().max() <= (6 / (fan_in + fan_out)) ** 0.5


@pytest.mark.parametrize("part", CUSTOM_NAMES)
def test_vit_flops_counts_parts_with_their_own_layer_names_as_torchs_counter(part: str) -> None:
    model = swiglu_model(attn_impl="explicit", **CUSTOM_NAMES[part])
    with FlopCounterMode(display=False) as counter:
        model(torch.randn(1, 3, 8, 8))
    assert vit_flops(model.config) == pytest.approx(counter.get_total_flops(), rel=0.01)
    model.blocks[1].attn.prune_heads([0, 2])
    with FlopCounterMode(display=False) as counter:
        model(torch.randn(1, 3, 8, 8))
    assert vit_flops(model.config, model.heads_per_layer()) == pytest.approx(counter.get_total_flops(), rel=0.01)


@pytest.mark.parametrize("part", CUSTOM_NAMES)
def test_parts_with_their_own_layer_names_explain_prune_and_take_attention_lora(part: str) -> None:
    model = swiglu_model(**CUSTOM_NAMES[part])
    images = torch.randn(2, 3, 8, 8)
    assert explain(model, images, "chefer").shape == (2, 8, 8)
    prune_heads(model, {0: [1]})
    assert model.heads_per_layer() == [3, 4]
    assert len(add_lora(model, LoraConfig(rank=2))) == 4
    with pytest.raises(LoraError, match=r"has no blocks.0.mlp.fc1 .*choose among qkv, proj"):
        add_lora(swiglu_model(**CUSTOM_NAMES[part]), LoraConfig(rank=2, targets=["fc1"]))


@pytest.mark.slow
def test_a_recipe_naming_the_registered_mlp_trains_it(tmp_path: Path) -> None:
    recipe = short_recipe(tmp_path / "runs")
    recipe["model"]["mlp_layer"] = "test_swiglu"
    result = vitkit.train.train(recipe)
    assert all(isinstance(block.mlp, SwiGLU) for block in result.model.blocks)
    assert vitkit.load_model(result.run_dir / "model.safetensors").config.mlp_layer == "test_swiglu"


def test_an_unknown_part_and_a_part_timm_lacks_are_one_line_each() -> None:
    with pytest.raises(UnknownPartError, match=r"mlp_layer 'test_swiglo' is not a registered mlp.*Did you mean 'test_swiglu'"):
        swiglu_model(mlp_layer="test_swiglo")
    with pytest.raises(UnsupportedModelError, match="custom mlp_layer='test_swiglu'") as error:
        to_timm(swiglu_model())
    assert "\n" not in str(error.value)
