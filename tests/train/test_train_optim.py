"""AdamW parameter groups (timm's param_groups_weight_decay): which parameters are decayed."""

from __future__ import annotations

import copy

import pytest
import torch

import vitkit
from vitkit.train.config import OptimConfig
from vitkit.train.optim import build_optimizer, fused_supported, param_groups


def test_exactly_the_weight_matrices_are_decayed_as_before_timms_function() -> None:
    # LayerScale gammas, the LSA temperature (0-d) and qk-norms are there to be excluded too.
    model = vitkit.create_model(
        "vit_cifar_tiny", depth=2, embed_dim=16, num_heads=2, init_values=0.1, qk_norm=True, locality=True
    )
    # vitkit's rule before it called timm: 1-d (or 0-d) parameters and model.no_weight_decay() names
    expected_no_decay = {n for n, p in model.named_parameters() if p.ndim <= 1 or n in {"pos_embed", "cls_token"}}
    no_decay, decay = param_groups(model, weight_decay=0.05)  # timm's order
    names = {id(p): n for n, p in model.named_parameters()}
    assert {names[id(p)] for p in no_decay["params"]} == expected_no_decay
    assert {names[id(p)] for p in decay["params"]} == set(names.values()) - expected_no_decay
    assert (decay["weight_decay"], no_decay["weight_decay"]) == (0.05, 0.0)
    assert {"blocks.0.ls1.gamma", "blocks.1.attn.temperature", "blocks.0.attn.q_norm.weight"} <= expected_no_decay


def test_frozen_parameters_are_left_out_of_every_group() -> None:
    model = vitkit.create_model("vit_cifar_tiny", depth=1, embed_dim=16, num_heads=2)
    model.patch_embed.requires_grad_(False)
    grouped = {id(p) for group in param_groups(model, 0.05) for p in group["params"]}
    assert grouped == {id(p) for p in model.parameters() if p.requires_grad}


def test_optimizer_is_fused_on_cpu_float_parameters() -> None:
    model = vitkit.create_model("vit_cifar_tiny", depth=1, embed_dim=16, num_heads=2)
    optimizer = build_optimizer(model, OptimConfig())
    assert all(group["fused"] for group in optimizer.param_groups)


def test_optimizer_falls_back_when_a_parameter_has_no_fused_kernel() -> None:
    assert fused_supported([torch.zeros(2), torch.zeros(2, dtype=torch.bfloat16)])
    assert not fused_supported([torch.zeros(2), torch.zeros(2, device="meta")])
    assert not fused_supported([])


def test_fused_updates_equal_the_foreach_implementation() -> None:
    """Five steps of vitkit's fused AdamW against torch's foreach AdamW from the same start and the
    same gradients (random, set by hand: backpropagated ones would carry the models' own rounding),
    with weight decay, betas and eps as configured."""
    config = OptimConfig(lr=1e-2, weight_decay=0.05, betas=(0.8, 0.9), eps=1e-6)
    fused_model = vitkit.create_model("vit_cifar_tiny", depth=1, embed_dim=16, num_heads=2)
    foreach_model = copy.deepcopy(fused_model)
    start = copy.deepcopy(fused_model)
    fused = build_optimizer(fused_model, config)
    foreach = torch.optim.AdamW(
        param_groups(foreach_model, config.weight_decay), lr=1e-2, betas=(0.8, 0.9), eps=1e-6, foreach=True
    )
    for _ in range(5):
        for a, b in zip(fused_model.parameters(), foreach_model.parameters()):
            a.grad = torch.randn_like(a)
            b.grad = a.grad.clone()
        fused.step()
        foreach.step()
    for (name, a), b in zip(fused_model.named_parameters(), foreach_model.parameters()):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5, msg=name)
    # the steps moved the weights (Adam moves each by about lr a step, in random directions here)
    for a, b in zip(fused_model.parameters(), start.parameters()):
        assert (a - b).abs().mean() > 1e-3


def test_a_fused_optimizer_gets_its_gradients_clipped_by_norm_and_float16_scaling_is_not_fused() -> None:
    from types import SimpleNamespace

    from vitkit.train.module import ViTModule

    model = vitkit.create_model("vit_cifar_tiny", depth=1, embed_dim=16, num_heads=2)
    for p in model.parameters():
        p.grad = torch.full_like(p, 3.0)
    fused = build_optimizer(model, OptimConfig())
    # Lightning's bf16 plugin would raise here; vitkit clips the (unscaled) gradients itself
    module = SimpleNamespace(parameters=model.parameters, trainer=SimpleNamespace(strategy="auto"),
                             optim_config=SimpleNamespace(clip_grad=0.5, clip_mode="norm"))
    ViTModule.on_before_optimizer_step(module, fused)
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad) for p in model.parameters()]))
    assert norm.item() == pytest.approx(0.5, rel=1e-4)
    assert not any(group["fused"] for group in build_optimizer(model, OptimConfig(), allow_fused=False).param_groups)
