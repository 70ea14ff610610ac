"""DINO's optimisation as facebookresearch/dino's ``main_dino.py`` does it, each piece against its
code written out here: the weight decay on ``utils.cosine_scheduler``'s values (0.04 to 0.4) step by
step through a run, each parameter's gradient clipped as ``utils.clip_gradients`` clips it, and the
parameter groups of ``utils.get_params_groups`` (``pos_embed`` and ``cls_token`` decayed, norms and
biases not); the shipped DINO recipes use all three and release the last teacher."""

from __future__ import annotations

import copy
from pathlib import Path
from types import SimpleNamespace

import lightning as L
import numpy as np
import pytest
import torch
from tiny_runs import dino_recipe
from torch import nn

import vitkit
from vitkit.schema import RecipeError
from vitkit.tasks.dino import DinoHead
from vitkit.train import load_recipe, train
from vitkit.train.distributed import clip_grad_per_param
from vitkit.train.module import ViTModule
from vitkit.train.optim import Horizon, OptimConfig, WeightDecaySchedule, build_optimizer

DINO_OPTIM = {"weight_decay": 0.04, "weight_decay_end": 0.4, "decay_embeddings": True, "clip_grad": 3.0,
              "clip_mode": "per_param"}


# ------------------------------------------------------------ facebookresearch/dino's utils.py, as written there
def cosine_scheduler(base_value, final_value, epochs, niter_per_ep, warmup_epochs=0, start_warmup_value=0):
    warmup_schedule = np.array([])
    warmup_iters = warmup_epochs * niter_per_ep
    if warmup_epochs > 0:
        warmup_schedule = np.linspace(start_warmup_value, base_value, warmup_iters)

    iters = np.arange(epochs * niter_per_ep - warmup_iters)
    schedule = final_value + 0.5 * (base_value - final_value) * (1 + np.cos(np.pi * iters / len(iters)))

    schedule = np.concatenate((warmup_schedule, schedule))
    assert len(schedule) == epochs * niter_per_ep
    return schedule


def clip_gradients(model, clip):
    norms = []
    for name, p in model.named_parameters():  # noqa: B007 (as written there)
        if p.grad is not None:
            param_norm = p.grad.data.norm(2)
            norms.append(param_norm.item())
            clip_coef = clip / (param_norm + 1e-6)
            if clip_coef < 1:
                p.grad.data.mul_(clip_coef)
    return norms


def get_params_groups(model):
    regularized = []
    not_regularized = []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        # we do not regularize biases nor Norm parameters
        if name.endswith(".bias") or len(param.shape) == 1:
            not_regularized.append(param)
        else:
            regularized.append(param)
    return [{'params': regularized}, {'params': not_regularized, 'weight_decay': 0.}]
# ------------------------------------------------------------------------------------------------------------


def student() -> tuple[nn.Module, DinoHead]:
    """A ViT with a class token, a register token and a position embedding, and a DINO head."""
    model = vitkit.create_model("vit_cifar_tiny", img_size=8, patch_size=2, in_chans=1, num_classes=0, embed_dim=16,
                                depth=2, num_heads=2, reg_tokens=1)
    return model, DinoHead(16, 32, hidden_dim=24, bottleneck_dim=8)


def test_weight_decay_follows_dinos_cosine_scheduler_step_by_step() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4))
    optimizer = build_optimizer(model, OptimConfig(weight_decay=0.04, weight_decay_end=0.4))
    epochs, per_epoch = 3, 7
    schedule = WeightDecaySchedule(optimizer, Horizon(warmup_steps=5, total_steps=epochs * per_epoch, floor=0.01),
                                   start=0.04, end=0.4)
    expected = cosine_scheduler(0.04, 0.4, epochs, per_epoch)  # no warm-up for the decay, whatever the lr's
    for step, value in enumerate(expected):
        schedule.apply(step)
        no_decay, decay = optimizer.param_groups  # timm's order
        assert decay["weight_decay"] == pytest.approx(value, rel=1e-12, abs=1e-15), step
        assert no_decay["weight_decay"] == 0.0
    assert expected[0] == pytest.approx(0.04) and expected[-1] == pytest.approx(0.4, rel=1e-2)
    schedule.apply(10 * epochs * per_epoch)  # past the end: the end value, as the learning rate keeps min_lr
    assert optimizer.param_groups[1]["weight_decay"] == pytest.approx(0.4)


def test_the_weight_decay_schedule_follows_a_moved_horizon() -> None:
    """A time budget moves the horizon once it has timed the steps: the decay's cosine then spans
    the new length, as the learning rate's does."""
    optimizer = build_optimizer(nn.Linear(4, 4), OptimConfig(weight_decay=0.04, weight_decay_end=0.4))
    horizon = Horizon(warmup_steps=0, total_steps=100, floor=0.01)
    schedule = WeightDecaySchedule(optimizer, horizon, start=0.04, end=0.4)
    horizon.total_steps = 40
    assert schedule.value(20) == pytest.approx(cosine_scheduler(0.04, 0.4, 1, 40)[20])


class DecayRecorder(L.Callback):
    """At every optimiser step: each group's weight decay, and the parameters of the decayed groups."""

    def __init__(self) -> None:
        self.decays: list[list[float]] = []
        self.decayed: set[int] = set()

    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer) -> None:
        self.decays.append([group["weight_decay"] for group in optimizer.param_groups])
        self.decayed = {id(p) for group in optimizer.param_groups if group["weight_decay"] > 0 for p in group["params"]}
        self.module = pl_module


def test_a_dino_run_steps_the_decay_on_dinos_schedule_and_decays_the_position_embedding(tmp_path: Path) -> None:
    recorder = DecayRecorder()
    recipe = dino_recipe(tmp_path, max_epochs=2)  # 4 steps an epoch
    recipe["optim"].update(DINO_OPTIM)
    train(recipe, callbacks=[recorder])
    expected = cosine_scheduler(0.04, 0.4, 2, 4)
    assert len(recorder.decays) == len(expected)
    for step, (decays, value) in enumerate(zip(recorder.decays, expected)):
        # the backbone's and the head's groups: decayed ones on the schedule, the others at 0
        assert sorted({round(d, 12) for d in decays}) == [0.0, round(value, 12)], step
    model = recorder.module.model
    assert {id(model.pos_embed), id(model.cls_token)} <= recorder.decayed
    assert id(model.norm.weight) not in recorder.decayed and id(model.blocks[0].attn.qkv.bias) not in recorder.decayed


def test_without_weight_decay_end_a_run_keeps_the_decay(tmp_path: Path) -> None:
    recorder = DecayRecorder()
    train(dino_recipe(tmp_path), ["optim.weight_decay=0.04"], callbacks=[recorder])
    assert {d for decays in recorder.decays for d in decays} == {0.0, 0.04}
    assert id(recorder.module.model.pos_embed) not in recorder.decayed  # timm's groups: no_weight_decay() exempt


def test_per_param_clipping_equals_dinos_clip_gradients() -> None:
    model, head = student()
    ours = nn.ModuleDict({"backbone": model, "head": head})
    torch.manual_seed(0)
    for index, p in enumerate(ours.parameters()):
        p.grad = torch.randn_like(p) * (0.2 if index % 3 else 20.0)  # some under the bound, some far over it
    ours.backbone.blocks[1].mlp.fc2.bias.grad = None  # a parameter without a gradient is left alone
    reference = copy.deepcopy(ours)
    for p, q in zip(ours.parameters(), reference.parameters()):
        q.grad = None if p.grad is None else p.grad.clone()
    expected_norms = clip_gradients(reference, 3.0)

    fake = SimpleNamespace(parameters=ours.parameters, trainer=SimpleNamespace(strategy="auto"),
                           optim_config=OptimConfig(clip_grad=3.0, clip_mode="per_param"))
    ViTModule.on_before_optimizer_step(fake, None)
    clipped = 0
    for (name, p), q in zip(ours.named_parameters(), reference.parameters()):
        if q.grad is None:
            assert p.grad is None
            continue
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-6, atol=1e-7, msg=name)
        clipped += bool(q.grad.norm() < 3.0 - 1e-3)
    assert 0 < clipped and any(q.grad.norm() > 2.9 for q in reference.parameters() if q.grad is not None)

    for p in reference.parameters():  # the norms returned are the ones before clipping
        if p.grad is not None:
            p.grad.mul_(7.0)
    norms = clip_grad_per_param(reference.parameters(), 3.0)
    present = [n for n, p in zip(norms.tolist(), reference.parameters()) if p.grad is not None]
    np.testing.assert_allclose(present, [7.0 * min(n, 3.0) for n in expected_norms], rtol=1e-5)


def test_global_norm_clipping_is_not_per_param() -> None:
    """``clip_mode: norm`` (the default) scales every gradient by one factor: the per-parameter
    norms keep their ratios, which DINO's clipping does not."""
    model, _ = student()
    for index, p in enumerate(model.parameters()):
        p.grad = torch.full_like(p, 10.0 if index % 2 else 0.1)
    before = [p.grad.norm().item() for p in model.parameters()]
    fake = SimpleNamespace(parameters=model.parameters, trainer=SimpleNamespace(strategy="auto"),
                           optim_config=OptimConfig(clip_grad=3.0))
    ViTModule.on_before_optimizer_step(fake, None)
    after = [p.grad.norm().item() for p in model.parameters()]
    np.testing.assert_allclose(np.array(after) / np.array(before), after[0] / before[0], rtol=1e-5)
    assert np.linalg.norm(after) == pytest.approx(3.0, rel=1e-4)


def test_decay_embeddings_groups_equal_dinos_get_params_groups() -> None:
    model, head = student()
    config = OptimConfig(weight_decay=0.04, decay_embeddings=True)
    head.last_layer.parametrizations.weight.original0.requires_grad_(True)  # norm_last_layer=False: a [K, 1] norm
    groups = build_optimizer(model, config, extra=head).param_groups
    decayed = {id(p) for group in groups if group["weight_decay"] > 0 for p in group["params"]}
    undecayed = {id(p) for group in groups if group["weight_decay"] == 0 for p in group["params"]}
    regularized, not_regularized = get_params_groups(nn.ModuleDict({"backbone": model, "head": head}))
    assert decayed == {id(p) for p in regularized["params"]}
    assert undecayed == {id(p) for p in not_regularized["params"]}
    assert {id(model.pos_embed), id(model.cls_token), id(model.reg_token)} <= decayed
    assert id(model.norm.weight) in undecayed and id(model.blocks[0].attn.qkv.bias) in undecayed
    # timm's groups (the default) exempt the model's no_weight_decay() too
    default = build_optimizer(model, OptimConfig(weight_decay=0.04)).param_groups
    exempt = {id(p) for group in default if group["weight_decay"] == 0 for p in group["params"]}
    assert {id(model.pos_embed), id(model.cls_token), id(model.reg_token)} <= exempt


def test_a_weight_decay_schedule_from_no_decay_is_refused_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(RecipeError, match=r"optim\.weight_decay_end .*optim\.weight_decay is 0") as caught:
        load_recipe(dino_recipe(tmp_path), ["optim.weight_decay=0", "optim.weight_decay_end=0.4"])
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("name", ["dino_fashion_mnist", "dino_imagefolder"])
def test_the_dino_recipes_optimise_as_dino_and_release_the_last_teacher(name: str) -> None:
    recipe = load_recipe(name)
    optim, trainer = recipe.optim, recipe.trainer
    assert (optim.weight_decay, optim.weight_decay_end, optim.decay_embeddings) == (0.04, 0.4, True)
    assert (optim.clip_grad, optim.clip_mode) == (3.0, "per_param")
    assert trainer.monitor == "last"
    # a budget plans the epochs, so every schedule ends with training (a max_time_minutes stop cuts them)
    assert (trainer.time_budget_minutes, trainer.max_time_minutes) == (15, None)


def test_a_dino_recipe_without_a_monitor_releases_the_last_teacher(tmp_path: Path) -> None:
    recipe = dino_recipe(tmp_path)
    del recipe["trainer"]["monitor"]
    assert load_recipe(recipe).trainer.monitor == "last"
