"""AdamW parameter groups (timm's param_groups_weight_decay): which parameters are decayed."""

from __future__ import annotations

import vitkit
from vitkit.train.optim import param_groups


def test_exactly_the_weight_matrices_are_decayed_as_before_timms_function() -> None:
    # LayerScale gammas, the LSA temperature (0-d) and qk-norms are there to be excluded too.
    model = vitkit.create_model(
        "vit_cifar_tiny", depth=2, embed_dim=16, num_heads=2, init_values=0.1, qk_norm=True, locality_attention=True
    )
    # vitkit's rule before it called timm: 1-d (or 0-d) parameters and model.no_weight_decay() names
    expected_no_decay = {n for n, p in model.named_parameters() if p.ndim <= 1 or n in {"pos_embed", "cls_token"}}
    decay, no_decay = param_groups(model, weight_decay=0.05)
    names = {id(p): n for n, p in model.named_parameters()}
    assert {names[id(p)] for p in no_decay["params"]} == expected_no_decay
    assert {names[id(p)] for p in decay["params"]} == set(names.values()) - expected_no_decay
    assert (decay["weight_decay"], no_decay["weight_decay"]) == (0.05, 0.0)
    assert {"blocks.0.ls1.gamma", "blocks.1.attn.log_scale", "blocks.0.attn.q_norm.weight"} <= expected_no_decay


def test_frozen_parameters_are_left_out_of_every_group() -> None:
    model = vitkit.create_model("vit_cifar_tiny", depth=1, embed_dim=16, num_heads=2)
    model.patch_embed.requires_grad_(False)
    grouped = {id(p) for group in param_groups(model, 0.05) for p in group["params"]}
    assert grouped == {id(p) for p in model.parameters() if p.requires_grad}
