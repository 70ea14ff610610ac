"""Fine-tuning's optimiser side: layer-wise learning-rate decay (BEiT, as timm's
param_groups_layer_decay on timm's own ViT) through the warm-up + cosine schedule and a resume, and
freezing ('backbone', 'blocks:N'): no gradient, no optimiser state, no weight decay, fixed BatchNorm."""

from __future__ import annotations

import copy
from pathlib import Path

import lightning as L
import pytest
import timm
import torch
from timm.optim import param_groups_layer_decay
from tiny_runs import SHORT, tiny_recipe

import vitkit
from vitkit.models.timm_interop import timm_twin
from vitkit.schema import FieldError
from vitkit.train import CheckpointError, train
from vitkit.train.config import OptimConfig
from vitkit.train.freezing import freeze
from vitkit.train.optim import Horizon, build_optimizer, param_groups, warmup_cosine

#: A 2-block model on 8x8 RGB images (4 patches), 3 classes.
TINY = dict(img_size=8, patch_size=4, embed_dim=16, depth=2, num_heads=2, num_classes=3)


def tiny(**overrides: object) -> vitkit.VisionTransformer:
    torch.manual_seed(0)
    return vitkit.create_model("vit_cifar_tiny", **{**TINY, **overrides})


def named_groups(model: torch.nn.Module, groups: list[dict]) -> list[tuple[set[str], float, float]]:
    """Each group as (parameter names, lr scale, weight decay), in the groups' order."""
    names = {id(p): n for n, p in model.named_parameters()}
    return [({names[id(p)] for p in g["params"]}, g["lr_scale"], g["weight_decay"]) for g in groups]


def scale_of(model: torch.nn.Module, groups: list[dict]) -> dict[str, float]:
    return {name: scale for names, scale, _ in named_groups(model, groups) for name in names}


@pytest.mark.parametrize(
    "overrides",
    [{}, {"global_pool": "map"}, {"global_pool": "avg"}, {"reg_tokens": 2, "pre_norm": True}, {"distilled": True}],
    ids=["token", "map", "avg_fc_norm", "registers_pre_norm", "distilled"],
)
def test_layer_decay_groups_equal_timms_on_timms_own_vit(overrides: dict) -> None:
    # The reference is timm's group_matcher on timm's VisionTransformer / DeiT, not vitkit's.
    model = tiny(**overrides)
    twin = timm_twin(model.config)
    ours = named_groups(model, param_groups(model, 0.05, layer_decay=0.6))
    theirs = named_groups(
        twin, param_groups_layer_decay(twin, 0.05, no_weight_decay_list=twin.no_weight_decay(), layer_decay=0.6)
    )
    assert ours == theirs
    assert len({scale for _, scale, _ in ours}) == TINY["depth"] + 2  # stem, 2 blocks, head


def test_layer_decay_scales_are_beits_with_the_embeddings_at_0_and_the_head_at_depth_plus_1() -> None:
    # depth 2, decay 0.5: layer i learns at 0.5 ** (3 - i); the conv stem and every prefix token
    # are embeddings, the final norm joins the last block (timm), fc_norm / head_dist are the head's.
    for overrides, extra in (
        ({"patch_embed": "conv", "reg_tokens": 2, "pre_norm": True, "global_pool": "avg"}, {}),
        ({"patch_embed": "conv", "distilled": True}, {"dist_token": 0.125, "norm.weight": 0.5, "head_dist.weight": 1.0}),
    ):
        model = tiny(**overrides)
        scales = scale_of(model, param_groups(model, 0.05, layer_decay=0.5))
        assert set(scales) == {name for name, _ in model.named_parameters()}
        for name, scale in scales.items():
            stem = name.startswith(("patch_embed.", "cls_token", "reg_token", "dist_token", "pos_embed", "norm_pre."))
            if stem:
                assert scale == 0.125, name
            elif name.startswith("blocks."):
                assert scale == 0.5 ** (2 - int(name.split(".")[1])), name
        assert {n: scales[n] for n in extra} == extra
        assert scales["cls_token"] == 0.125 and scales["blocks.0.attn.qkv.weight"] == 0.25
        assert scales["blocks.1.mlp.fc2.weight"] == 0.5 and scales["head.weight"] == 1.0


def test_mixed_rope_frequencies_decay_with_their_block_where_timms_eva_leaves_them_at_scale_1() -> None:
    # A deliberate difference (OptimConfig.layer_decay): vitkit's frequencies are each block's own
    # parameter and follow BEiT's rule with it; timm's Eva keeps every block's in one model-level
    # tensor that no group matches, so it learns at the head's rate.
    model = tiny(rope="mixed")
    groups = named_groups(model, param_groups(model, 0.05, layer_decay=0.5))
    rope = {name: (scale, decay) for names, scale, decay in groups for name in names if name.endswith("rope.freqs")}
    assert rope == {"blocks.0.attn.rope.freqs": (0.25, 0.0), "blocks.1.attn.rope.freqs": (0.5, 0.0)}
    eva = timm.create_model("vit_small_patch16_rope_mixed_224", pretrained=False, depth=2, img_size=32, embed_dim=48,
                            num_heads=2, num_classes=3)
    theirs = named_groups(eva, param_groups_layer_decay(eva, 0.05, no_weight_decay_list=eva.no_weight_decay(),
                                                        layer_decay=0.5))
    assert [(scale, decay) for names, scale, decay in theirs if "rope.freqs" in names] == [(1.0, 0.0)]


def test_layer_decay_keeps_the_weight_decay_rule() -> None:
    model = tiny(patch_embed="conv", reg_tokens=2)
    decayed = {
        name
        for names, _, decay in named_groups(model, param_groups(model, 0.05, layer_decay=0.7))
        if decay == 0.05
        for name in names
    }
    assert decayed == {n for n, p in model.named_parameters() if p.ndim > 1 and n not in model.no_weight_decay()}


def test_without_layer_decay_the_groups_are_timm_s_two_in_timm_s_order() -> None:
    from timm.optim import param_groups_weight_decay

    model = tiny()
    no_decay, decay = param_groups(model, 0.05)
    assert (no_decay["weight_decay"], decay["weight_decay"]) == (0.0, 0.05) and "lr_scale" not in decay
    timm_groups = param_groups_weight_decay(model, 0.05, no_weight_decay_list=model.no_weight_decay())
    assert [[id(p) for p in g["params"]] for g in timm_groups] == [[id(p) for p in g["params"]] for g in (no_decay, decay)]
    assert all(group["lr"] == 0.01 for group in build_optimizer(model, OptimConfig(lr=0.01)).param_groups)


def drive(optimizer: torch.optim.Optimizer, scheduler: torch.optim.lr_scheduler.LRScheduler, steps: int) -> None:
    for _ in range(steps):
        optimizer.step()
        scheduler.step()


def test_after_warmup_each_group_is_at_its_scale_times_the_peak_and_ends_at_its_scale_times_min_lr() -> None:
    config = OptimConfig(lr=1e-2, min_lr=1e-4, layer_decay=0.5)
    optimizer = build_optimizer(tiny(), config)
    scheduler = warmup_cosine(optimizer, Horizon(warmup_steps=3, total_steps=10, floor=config.min_lr / config.lr))
    scales = [group["lr_scale"] for group in optimizer.param_groups]
    assert sorted(set(scales)) == [0.125, 0.25, 0.5, 1.0]
    assert [group["lr"] for group in optimizer.param_groups] == pytest.approx([s * 1e-2 / 3 for s in scales])
    drive(optimizer, scheduler, 2)  # warm-up done: the peak
    assert [group["lr"] for group in optimizer.param_groups] == pytest.approx([s * 1e-2 for s in scales])
    drive(optimizer, scheduler, 8)
    assert [group["lr"] for group in optimizer.param_groups] == pytest.approx([s * 1e-4 for s in scales])


def test_the_scales_survive_an_optimizer_and_scheduler_state_dict_round_trip() -> None:
    config = OptimConfig(lr=1e-2, min_lr=1e-4, layer_decay=0.5)
    model = tiny()
    images, labels = torch.randn(4, 3, 8, 8), torch.tensor([0, 1, 2, 0])

    def build(net: torch.nn.Module) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
        optimizer = build_optimizer(net, config)
        return optimizer, warmup_cosine(optimizer, Horizon(warmup_steps=2, total_steps=10, floor=config.min_lr / config.lr))

    def train_steps(net: torch.nn.Module, optimizer, scheduler, steps: int) -> None:
        for _ in range(steps):
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(net(images), labels).backward()
            optimizer.step()
            scheduler.step()

    optimizer, scheduler = build(model)
    train_steps(model, optimizer, scheduler, 4)
    resumed_model = copy.deepcopy(model)
    saved = copy.deepcopy((optimizer.state_dict(), scheduler.state_dict()))
    train_steps(model, optimizer, scheduler, 3)

    fresh_optimizer, fresh_scheduler = build(resumed_model)
    fresh_optimizer.load_state_dict(saved[0])
    fresh_scheduler.load_state_dict(saved[1])
    train_steps(resumed_model, fresh_optimizer, fresh_scheduler, 3)
    lrs = [group["lr"] for group in fresh_optimizer.param_groups]
    assert lrs == pytest.approx([group["lr"] for group in optimizer.param_groups])
    scales = [group["lr_scale"] for group in fresh_optimizer.param_groups]
    assert [lr / lrs[-1] for lr in lrs] == pytest.approx([s / scales[-1] for s in scales])
    assert min(scales) == 0.125
    for after, before in zip(resumed_model.parameters(), model.parameters()):
        torch.testing.assert_close(after, before)


# ------------------------------------------------------------------------------------- freezing
@pytest.mark.parametrize(
    ("spec", "overrides", "trainable"),
    [
        ("backbone", {"global_pool": "avg"}, ("fc_norm.", "head.")),
        ("backbone", {"distilled": True}, ("head.", "head_dist.")),
        ("backbone", {"global_pool": "map"}, ("head.",)),
        ("blocks:0", {"patch_embed": "conv", "reg_tokens": 2}, ("blocks.", "norm.", "head.")),
        ("blocks:1", {"global_pool": "map"}, ("blocks.1.", "norm.", "attn_pool.", "head.")),
        ("blocks:2", {}, ("head.",)),  # the final norm is the last block's layer (timm's grouping)
    ],
)
def test_frozen_parameters_get_no_gradient_no_state_no_decay_and_stay_as_loaded(
    spec: str, overrides: dict, trainable: tuple[str, ...]
) -> None:
    model = tiny(**overrides).train()
    frozen = freeze(model, spec)
    named = dict(model.named_parameters())
    assert set(frozen) == {name for name in named if not name.startswith(trainable)}
    assert {name for name, p in named.items() if p.requires_grad} == set(named) - set(frozen)
    before = {name: p.detach().clone() for name, p in named.items()}
    optimizer = build_optimizer(model, OptimConfig(lr=1e-2, weight_decay=0.5, layer_decay=0.75))
    generator = torch.Generator().manual_seed(0)
    for _ in range(3):
        optimizer.zero_grad(set_to_none=False)
        out = model(torch.randn(4, 3, 8, 8, generator=generator))
        loss = torch.nn.functional.cross_entropy(out[0] if isinstance(out, tuple) else out, torch.tensor([0, 1, 2, 0]))
        loss.backward()
        optimizer.step()
    grouped = {id(p) for group in optimizer.param_groups for p in group["params"]}
    for name in frozen:
        param = named[name]
        assert torch.equal(param, before[name]), name
        assert param.grad is None and param not in optimizer.state and id(param) not in grouped, name
    for name in set(named) - set(frozen):
        assert not torch.equal(named[name], before[name]), name


@pytest.mark.parametrize("spec", ["backbone", "blocks:0", "blocks:1", "blocks:2"])
def test_freeze_picks_the_same_parameters_of_timms_own_vit(spec: str) -> None:
    # timm's group_matcher decides timm's layers: the same names as vitkit's on the same shape
    model = tiny(reg_tokens=1, global_pool="map")
    assert freeze(model, spec) == freeze(timm_twin(model.config), spec)


def test_a_frozen_conv_stem_keeps_its_batchnorm_statistics_in_training_mode() -> None:
    model = tiny(patch_embed="conv")
    with torch.no_grad():  # running statistics unlike a batch's, so normalising by them shows
        for module in model.patch_embed.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                module.running_mean.fill_(0.3)
                module.running_var.fill_(2.0)
    stats = {k: v.clone() for k, v in model.patch_embed.state_dict().items() if "running" in k or "batches" in k}
    images = torch.randn(8, 3, 8, 8)
    with torch.no_grad():
        evaluated = model.eval().patch_embed(images)
    freeze(model, "blocks:0")
    model.train()
    for _ in range(3):
        trained = model(images)
    assert model.training and model.blocks[0].training
    assert all(torch.equal(model.patch_embed.state_dict()[k], v) for k, v in stats.items())
    torch.testing.assert_close(model.patch_embed(images), evaluated)
    assert trained.requires_grad


def test_freeze_none_changes_nothing() -> None:
    model = tiny(patch_embed="conv").train()
    assert freeze(model, "none") == []
    assert all(p.requires_grad for p in model.parameters())
    model(torch.randn(4, 3, 8, 8))
    assert not all(torch.equal(m.running_mean, torch.zeros_like(m.running_mean))
                   for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d))


@pytest.mark.parametrize("spec", ["blocks:3", "blocks:-1", "blocks:", "blocks", "blocks:x", "Backbone", "all", ""])
def test_a_bad_freeze_spec_is_one_line_naming_the_choices(spec: str) -> None:
    model = tiny()
    with pytest.raises(FieldError) as error:
        freeze(model, spec)
    assert str(error.value) == (
        f"freeze must be 'none', 'backbone' or 'blocks:N' with N in [0, 2], got {spec!r}."
    )
    assert all(p.requires_grad for p in model.parameters())


# ---------------------------------------------------------------------------------- in a run
class GroupRates(L.Callback):
    """Every parameter group's learning rate and scale at every training step."""

    def __init__(self) -> None:
        self.steps: list[list[tuple[float, float]]] = []

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: object) -> None:
        self.steps.append([(g["lr"], g["lr_scale"]) for g in trainer.optimizers[0].param_groups])


@pytest.mark.slow
def test_a_run_with_layer_decay_resumes_with_its_scales_and_a_recipe_without_it_is_refused(tmp_path: Path) -> None:
    recipe = tiny_recipe(tmp_path, **SHORT)
    recipe["optim"].update(layer_decay=0.5, warmup_epochs=0.5)
    last = train(recipe).run_dir / "checkpoints" / "last.ckpt"
    rates = GroupRates()
    train(recipe, ["trainer.max_epochs=2"], resume=last, callbacks=[rates])
    assert len(rates.steps) == 4  # the second epoch's steps only
    for step in rates.steps:
        head_lr = step[-1][0]
        assert sorted({scale for _, scale in step}) == [0.125, 0.25, 0.5, 1.0]
        assert [lr for lr, _ in step] == pytest.approx([scale * head_lr for _, scale in step])
    with pytest.raises(CheckpointError, match="parameter groups"):
        train(recipe, ["trainer.max_epochs=3", "optim.layer_decay=null"], resume=last)
