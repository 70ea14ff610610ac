"""Initialisation schemes: each part follows its scheme's rule (checked against the rule's own
formula), the option round-trips through configs and model files, and a part can be swapped."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from vitkit.io import load_model, save_model
from vitkit.models import VisionTransformer, ViTConfig
from vitkit.models.init import INIT_SCHEMES, init_parts

DIM, DEPTH, HEADS, PATCH, CLASSES = 64, 3, 4, 4, 10


def model_with(init: str) -> VisionTransformer:
    return VisionTransformer(img_size=32, patch_size=PATCH, in_chans=3, num_classes=CLASSES, embed_dim=DIM,
                             depth=DEPTH, num_heads=HEADS, mlp_ratio=4.0, init=init)


def stds(model: VisionTransformer) -> dict[str, float]:
    """Empirical weight std of each part, pooled over the blocks."""

    def pooled(tensors: list[torch.Tensor]) -> float:
        return torch.cat([t.detach().flatten() for t in tensors]).std().item()

    return {
        "patch": pooled([model.patch_embed.proj.weight]),
        "qkv": pooled([b.attn.qkv.weight for b in model.blocks]),
        "proj": pooled([b.attn.proj.weight for b in model.blocks]),
        "fc1": pooled([b.mlp.fc1.weight for b in model.blocks]),
        "fc2": pooled([b.mlp.fc2.weight for b in model.blocks]),
        "head": pooled([model.head.weight]),
    }


def uniform_std(bound: float) -> float:
    return bound / math.sqrt(3.0)


def xavier_std(fan_in: int, fan_out: int) -> float:
    return math.sqrt(2.0 / (fan_in + fan_out))


PATCH_IN = PATCH * PATCH * 3
TRUNC_002 = 0.02 * 0.99998  # a N(0, 0.02) truncated at +-2 (100 sigma) keeps its std
OUT_SCALE = (2 * DEPTH) ** -0.5

#: Expected std of each part under each scheme, from the scheme's definition.
EXPECTED = {
    "vitkit": {"patch": xavier_std(PATCH_IN, DIM), "qkv": xavier_std(DIM, DIM),
               "proj": xavier_std(DIM, DIM) * OUT_SCALE, "fc1": xavier_std(DIM, 4 * DIM),
               "fc2": xavier_std(4 * DIM, DIM), "head": TRUNC_002},
    "timm": {"patch": uniform_std(1 / math.sqrt(PATCH_IN)), "qkv": TRUNC_002, "proj": TRUNC_002, "fc1": TRUNC_002,
             "fc2": TRUNC_002, "head": TRUNC_002},
    # LeCun normal truncated at 2 std: timm rescales so the std is exactly sqrt(1 / fan_in).
    "jax": {"patch": math.sqrt(1 / PATCH_IN), "qkv": xavier_std(DIM, 3 * DIM), "proj": xavier_std(DIM, DIM),
            "fc1": xavier_std(DIM, 4 * DIM), "fc2": xavier_std(4 * DIM, DIM), "head": 0.0},
    # facebookresearch/mae: models_mae.py's _init_weights (Xavier-uniform on every Linear, the fused qkv
    # included, and on the patch projection seen as a matrix), main_finetune.py's head (trunc. normal 2e-5).
    "mae": {"patch": xavier_std(PATCH_IN, DIM), "qkv": xavier_std(DIM, 3 * DIM), "proj": xavier_std(DIM, DIM),
            "fc1": xavier_std(DIM, 4 * DIM), "fc2": xavier_std(4 * DIM, DIM), "head": 2e-5},
}


@pytest.mark.parametrize("init", INIT_SCHEMES)
def test_every_part_has_its_schemes_std(init: str) -> None:
    measured = stds(model_with(init))
    for part, expected in EXPECTED[init].items():
        assert measured[part] == pytest.approx(expected, rel=0.08, abs=1e-9), (part, measured[part], expected)


@pytest.mark.parametrize("init", INIT_SCHEMES)
def test_biases_follow_the_scheme(init: str) -> None:
    model = model_with(init)
    blocks = model.blocks
    assert all(b.attn.qkv.bias.abs().max() == 0 and b.attn.proj.bias.abs().max() == 0 for b in blocks)
    mlp_bias = torch.cat([b.mlp.fc1.bias.detach() for b in blocks])
    assert mlp_bias.abs().max() == 0 if init != "jax" else 0 < mlp_bias.std() < 1e-5
    patch_bias = model.patch_embed.proj.bias.detach()
    assert patch_bias.abs().max() == 0 if init != "timm" else patch_bias.abs().max() > 0


def test_position_embedding_is_timms_and_tokens_follow_the_scheme() -> None:
    for init in INIT_SCHEMES:
        model = VisionTransformer(img_size=32, patch_size=PATCH, num_classes=CLASSES, embed_dim=768, depth=1,
                                  num_heads=4, reg_tokens=4, init=init)
        assert model.pos_embed.std().item() == pytest.approx(0.02, rel=0.1)
        tokens = torch.cat([model.cls_token.flatten(), model.reg_token.flatten()])
        if init == "mae":  # models_mae.py: torch.nn.init.normal_(self.cls_token, std=.02)
            assert tokens.std().item() == pytest.approx(0.02, rel=0.1)
        else:  # timm: nn.init.normal_(self.cls_token, std=1e-6)
            assert tokens.abs().max().item() < 1e-5


def test_init_parts_swaps_only_the_named_part() -> None:
    model = model_with("vitkit")
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    init_parts(model, "timm", ["mlp"])
    changed = {name for name, tensor in model.state_dict().items() if not torch.equal(tensor, before[name])}
    assert changed and all(".mlp.fc" in name for name in changed)
    assert stds(model)["fc1"] == pytest.approx(TRUNC_002, rel=0.08)
    with pytest.raises(ValueError, match="unknown init part 'ffn'"):
        init_parts(model, "timm", ["ffn"])
    with pytest.raises(ValueError, match="unknown init scheme 'kaiming'"):
        init_parts(model, "kaiming")


def test_init_option_is_validated_and_round_trips_through_model_files(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="init must be one of"):
        ViTConfig(init="he")
    model = model_with("jax")
    assert ViTConfig.from_dict(model.config.to_dict()).init == "jax"
    save_model(model, tmp_path / "m.safetensors")
    loaded = load_model(tmp_path / "m.safetensors")
    assert loaded.config.init == "jax"
    for name, tensor in model.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[name], tensor)


def test_reset_classifier_initialises_the_new_head_by_the_scheme() -> None:
    model = model_with("jax")
    model.reset_classifier(5)
    assert model.head.weight.abs().max() == 0
    model = model_with("vitkit")
    model.reset_classifier(5)
    assert model.head.weight.std().item() == pytest.approx(0.02, rel=0.25)
