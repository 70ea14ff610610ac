"""I-JEPA (``vitkit.tasks.ijepa``): the multi-block masks, targets, loss, predictor and momentum as
facebookresearch/ijepa computes them (its code in ``tests/helpers/ijepa_reference.py``), run on the
same inputs, and what the task guarantees on top: the context encoder never sees a pixel outside
the context, the target encoder follows the model and is what the task releases."""

from __future__ import annotations

from functools import partial
from types import SimpleNamespace

import ijepa_reference as reference
import numpy as np
import pytest
import torch
from torch import nn

from vitkit.models import VisionTransformer, ViTConfig
from vitkit.schema import FieldError
from vitkit.tasks import ijepa
from vitkit.tasks.ijepa import IjepaOptions, IjepaTask, JepaPredictor, jepa_loss, jepa_targets, target_momentum
from vitkit.tasks.ijepa_masks import MultiBlockMasks, block_size
from vitkit.tasks.mae import decoder_weights


def encoder(**changes: object) -> VisionTransformer:
    """A 2-block encoder on 8x8 images in 2-px patches: a 4x4 grid, as Fashion-MNIST's 32 px in 8-px patches."""
    fields = dict(img_size=8, patch_size=2, in_chans=3, num_classes=0, embed_dim=32, depth=2, num_heads=2, mlp_ratio=2.0)
    return VisionTransformer(ViTConfig(**{**fields, **changes}))


def small_task(model: VisionTransformer, **options: object) -> IjepaTask:
    task = IjepaTask(model.config, IjepaOptions(**{"predictor_depth": 1, "predictor_dim": 16, "predictor_heads": 2,
                                                   **options}))
    task.prepare(model)
    return task


class EveryPlacement:
    """``torch`` for the reference's module, its ``randint`` upper end one higher: the reference's
    corner drawn over every placement, as vitkit draws it (the module docstring of ``ijepa_masks``)."""

    def __getattr__(self, name: str) -> object:
        return getattr(torch, name)

    @staticmethod
    def randint(low: int, high: int, size: tuple[int, ...]) -> torch.Tensor:
        return torch.randint(low, high + 1, size)


# The reference's grids and block options; every block is smaller than its grid, where the reference's sizes are vitkit's.
REFERENCE_CASES = [
    dict(input_size=(56, 56), patch_size=4, enc_mask_scale=(0.6, 0.9), pred_mask_scale=(0.15, 0.2),
         aspect_ratio=(0.75, 1.5), npred=4, min_keep=10),  # the paper's targets on a 14x14 grid
    dict(input_size=(32, 32), patch_size=4, enc_mask_scale=(0.5, 0.7), pred_mask_scale=(0.3, 0.4),
         aspect_ratio=(0.5, 2.0), npred=4, min_keep=8),  # large targets: the context's constraints are relaxed
]


#: (step, seed) of each batch compared: the collator seeds the block sizes with its call count.
DRAWS = ((0, 3), (1, 11))


def vitkit_draws(case: dict) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """vitkit's masks for 16 images of each of :data:`DRAWS`, on the reference ``case``'s grid."""
    grid = (case["input_size"][0] // case["patch_size"],) * 2
    masks = MultiBlockMasks(grid, case["npred"], case["pred_mask_scale"], case["aspect_ratio"], case["enc_mask_scale"],
                            case["min_keep"])
    return [masks.sample(16, torch.Generator().manual_seed(step), torch.Generator().manual_seed(seed))
            for step, seed in DRAWS]


@pytest.mark.parametrize("case", REFERENCE_CASES)
def test_the_masks_are_the_reference_collators_for_the_same_draws(case: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reference, "torch", EveryPlacement())
    collator = reference.MaskCollator(nenc=1, **case)
    for (_, seed), (context, targets) in zip(DRAWS, vitkit_draws(case)):
        torch.manual_seed(seed)
        _, (reference_context,), reference_targets = collator([torch.zeros(1)] * 16)
        assert torch.equal(context, reference_context)
        assert torch.equal(targets, torch.stack(reference_targets))


def test_a_training_steps_masks_are_the_reference_collators_call_of_the_steps_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    """The reference seeds its batch's block sizes with its call count and draws the corners from
    torch's global generator: the task after ``k`` steps draws call ``k``'s masks, whatever the global seed."""
    case = REFERENCE_CASES[0]
    model = encoder(img_size=56, patch_size=4)  # the case's 14x14 grid
    task = small_task(model, targets=case["npred"], target_scale=case["pred_mask_scale"], target_aspect=case["aspect_ratio"],
                      context_scale=case["enc_mask_scale"], min_keep=case["min_keep"])
    drawn = []
    monkeypatch.setattr(task, "loss", lambda model, images, context, targets: drawn.append((context, targets)) or torch.zeros(()))
    monkeypatch.setattr(reference, "torch", EveryPlacement())
    collator = reference.MaskCollator(nenc=1, **case)
    for step, seed in ((0, 5), (1, 5), (2, 7)):
        task.steps.fill_(step)
        torch.manual_seed(seed)
        out = task.training_step(model, (torch.zeros(3, 3, 56, 56), None))
        torch.manual_seed(seed)
        _, (reference_context,), reference_targets = collator([torch.zeros(1)] * 3)
        context, targets = drawn[-1]
        assert torch.equal(context, reference_context) and torch.equal(targets, torch.stack(reference_targets))
        assert out.batch_size == 3 and out.metrics.keys() == {"context_patches"}
        assert out.metrics["context_patches"].item() == reference_context.shape[1]


def test_the_second_reference_case_relaxes_the_contexts_constraints() -> None:
    """Some of its contexts overlap a target (a constraint dropped after 20 tries), so the
    comparison above covers the reference's relaxation too."""
    overlaps = sum(bool(set(context[i].tolist()) & set(targets[:, i].flatten().tolist()))
                   for context, targets in vitkit_draws(REFERENCE_CASES[1]) for i in range(16))
    assert overlaps > 0


@pytest.mark.parametrize(("draw", "size"), [(0.0, (1, 2)), (0.3, (1, 1)), (0.5, (2, 1)), (0.76, (2, 2)), (0.8, (2, 1)), (0.99, (2, 1))])
def test_block_sizes_follow_the_reference_rule_on_a_4x4_grid(draw: float, size: tuple[int, int]) -> None:
    """Hand-computed: at draw 0, int(16 * 0.15) = 2 patches at aspect 0.75 give h = round(sqrt(1.5)) = 1,
    w = round(sqrt(2.67)) = 2; at 0.3, int(2.64) = 2 at 0.975 give round(1.40) = 1 by round(1.43) = 1; at 0.5,
    2 patches at 1.125 give round(1.5) = 2 by round(1.33) = 1; at 0.76, int(3.008) = 3 at 1.32 give
    round(1.99) = 2 by round(1.51) = 2; at 0.8, int(3.04) = 3 at 1.35 give round(2.01) = 2 by
    round(1.49) = 1; at 0.99, int(3.18) = 3 at 1.4925 give round(2.12) = 2 by round(1.42) = 1."""
    assert block_size(draw, (0.15, 0.2), (0.75, 1.5), (4, 4)) == size
    assert block_size(draw, (0.85, 1.0), (1.0, 1.0), (4, 4)) == (4, 4)  # the whole grid, which the reference caps at 3x3


def test_every_cell_can_be_a_target_or_context_where_the_reference_never_reaches_the_last_row_and_column() -> None:
    masks = MultiBlockMasks((4, 4))
    # targets of 2 patches or more: the reference's squeeze fails on a one-patch block
    collator = reference.MaskCollator(input_size=(32, 32), patch_size=8, enc_mask_scale=(0.85, 1.0), pred_mask_scale=(0.2, 0.25),
                                      aspect_ratio=(0.75, 1.5), npred=4, min_keep=1)
    torch.manual_seed(0)
    seen, reference_seen = set(), set()
    for seed in range(60):
        context, targets = masks.sample(1, torch.Generator().manual_seed(seed))
        seen |= set(context.flatten().tolist()) | set(targets.flatten().tolist())
        _, enc, pred = collator([torch.zeros(1)])
        reference_seen |= {int(i) for m in enc + pred for i in m.flatten()}
    assert seen == set(range(16))
    assert reference_seen.isdisjoint({3, 7, 11, 12, 13, 14, 15})  # the reference's blind row and column


def test_the_default_masks_on_a_4x4_grid_keep_the_invariants() -> None:
    masks = MultiBlockMasks((4, 4))
    for seed in range(20):
        context, targets = masks.sample(8, torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed + 100))
        assert targets.shape[:2] == (4, 8) and context.shape[0] == 8
        assert context.shape[1] > masks.min_keep and (context.diff(dim=1) > 0).all()
        for image in range(8):
            hidden = set(targets[:, image].flatten().tolist())
            assert hidden.isdisjoint(context[image].tolist()) and hidden <= set(range(16))
            for block in targets[:, image]:  # a full rectangle of the batch's size
                rows, cols = block.div(4, rounding_mode="floor"), block % 4
                height, width = rows.max() - rows.min() + 1, cols.max() - cols.min() + 1
                assert len(block) == height * width == targets.shape[2] and len(set(block.tolist())) == len(block)


@pytest.mark.timeout(60)  # a sampler that never drops its last constraint would loop forever
def test_a_context_that_no_placement_keeps_drops_every_constraint_and_overlaps_the_targets() -> None:
    """One target spanning the 4x4 grid leaves a whole-grid context no patch outside it: after 20
    tries its one constraint is dropped, and the context is the whole grid, the target's 16 patches."""
    masks = MultiBlockMasks((4, 4), targets=1, target_scale=(1.0, 1.0), target_aspect=(1.0, 1.0))
    context, targets = masks.sample(2, torch.Generator().manual_seed(0), torch.Generator().manual_seed(1))
    assert context.tolist() == [list(range(16))] * 2 and targets.tolist() == [[list(range(16))] * 2]


def test_the_batch_is_cut_to_its_shortest_context_keeping_the_first_in_grid_order() -> None:
    masks = MultiBlockMasks((4, 4))
    generator = torch.Generator().manual_seed(5)
    context, targets = masks.sample(32, torch.Generator().manual_seed(0), generator)
    full = [sorted(set(range(16)) - set(targets[:, i].flatten().tolist())) for i in range(32)]
    assert context.shape[1] == min(len(cells) for cells in full)
    assert all(context[i].tolist() == full[i][: context.shape[1]] for i in range(32))


def test_targets_and_loss_equal_the_references_forward_target_and_loss_fn() -> None:
    masks = MultiBlockMasks((4, 4))
    context, targets = masks.sample(6, torch.Generator().manual_seed(1), torch.Generator().manual_seed(2))
    features = torch.randn(6, 16, 24) * 3 + 1
    prediction = torch.randn(4 * 6, targets.shape[2], 24)
    expected_target, expected_loss = reference.reference_target_and_loss(features, prediction, [context], list(targets))
    target = jepa_targets(features, targets)
    assert torch.allclose(target, expected_target, atol=1e-6)
    assert torch.allclose(jepa_loss(prediction, target), expected_loss, atol=1e-6)


def test_the_predictor_equals_the_references_with_its_weights() -> None:
    torch.manual_seed(0)
    theirs = reference.VisionTransformerPredictor(num_patches=16, embed_dim=24, predictor_embed_dim=32, depth=2,
                                                  num_heads=4, qkv_bias=True, norm_layer=partial(nn.LayerNorm, eps=1e-6))
    mine = JepaPredictor(24, (4, 4), dim=32, depth=2, num_heads=4)
    names = {"predictor_embed.": "embed.", "predictor_blocks.": "blocks.", "predictor_norm.": "norm.",
             "predictor_proj.": "proj."}
    state = {}
    for key, value in theirs.state_dict().items():
        if key != "predictor_pos_embed":
            state[next((key.replace(a, b, 1) for a, b in names.items() if key.startswith(a)), key)] = value
    mine.load_state_dict(state)
    assert torch.allclose(mine.pos_embed, theirs.predictor_pos_embed[0], atol=1e-6)  # the same fixed table
    context, targets = MultiBlockMasks((4, 4)).sample(3, torch.Generator().manual_seed(0), torch.Generator().manual_seed(4))
    tokens = torch.randn(3, context.shape[1], 24)
    expected = theirs(tokens.clone(), context, list(targets))
    assert torch.allclose(mine(tokens, context, targets), expected, atol=1e-5)
    eps = [module.eps for module in theirs.modules() if isinstance(module, nn.LayerNorm)]
    assert [module.eps for module in mine.modules() if isinstance(module, nn.LayerNorm)] == eps == [1e-6] * 5


def test_a_non_square_grids_positions_are_the_references_column_then_row_embedding() -> None:
    """The reference's 2-D table (its grid built as ``meshgrid(w, h)``, the column's channels first)
    on a 2x3 grid: square grids cannot tell a transposed table from the right one."""
    grid = np.stack(np.meshgrid(np.arange(3.0), np.arange(2.0))).reshape(2, 1, 2, 3)
    expected = torch.from_numpy(reference.get_2d_sincos_pos_embed_from_grid(16, grid)).float()
    assert torch.allclose(JepaPredictor(8, (2, 3), dim=16, depth=1, num_heads=2).pos_embed, expected, atol=1e-6)


def test_the_predictors_mlp_ratio_sets_its_blocks_hidden_width() -> None:
    assert JepaPredictor(8, (2, 2), dim=16, depth=1, num_heads=2, mlp_ratio=2.0).blocks[0].mlp.fc1.out_features == 32


def test_under_bfloat16_autocast_the_predictors_blocks_see_a_bfloat16_sequence() -> None:
    """The encoder's bfloat16 tokens, the fixed positions and the mask tokens join one sequence in
    the autocast dtype: no float32 copy of the sequence through the blocks."""
    predictor = JepaPredictor(8, (4, 4), dim=16, depth=1, num_heads=2)
    seen = []
    predictor.blocks[0].register_forward_pre_hook(lambda module, args: seen.append(args[0].dtype))
    context, targets = MultiBlockMasks((4, 4)).sample(2, torch.Generator().manual_seed(0), torch.Generator().manual_seed(1))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        predictor(torch.randn(2, context.shape[1], 8, dtype=torch.bfloat16), context, targets)
    assert seen == [torch.bfloat16]


def test_the_predictors_init_is_the_references_with_deeper_output_projections_scaled_down() -> None:
    torch.manual_seed(0)
    predictor = JepaPredictor(64, (4, 4), dim=256, depth=3, num_heads=4)
    assert predictor.embed.weight.std().item() == pytest.approx(0.02, rel=0.03)
    assert predictor.mask_token.std().item() == pytest.approx(0.02, rel=0.3)
    for layer, block in enumerate(predictor.blocks, start=1):
        expected = 0.02 / (2 * layer) ** 0.5
        assert block.mlp.fc2.weight.std().item() == pytest.approx(expected, rel=0.03)
        assert block.attn.proj.weight.std().item() == pytest.approx(expected, rel=0.03)
        assert block.mlp.fc1.weight.std().item() == pytest.approx(0.02, rel=0.03)
        assert block.attn.qkv.bias.abs().sum() == 0


def test_the_momentum_follows_the_references_linear_schedule() -> None:
    momenta = list(reference.reference_momenta((0.996, 1.0), ipe=7, num_epochs=3))
    assert [target_momentum(i, 21, 0.996, 1.0) for i in range(22)] == pytest.approx(momenta, abs=1e-12)
    # a one-step run: the first step at the start value, the end reached after it
    assert target_momentum(0, 1, 0.9, 1.0) == 0.9 and target_momentum(1, 1, 0.9, 1.0) == 1.0


def test_the_target_encoder_follows_the_model_with_the_momentum_of_the_step_taken() -> None:
    model = encoder()
    task = small_task(model, momentum_start=0.9, momentum_end=1.0)
    with torch.no_grad():
        for p in task.target_encoder.parameters():
            p.zero_()
        for p in model.parameters():
            p.fill_(1.0)
    task.after_optimizer_step(model, step=3, total_steps=10)  # the third step: momentum 0.9 + 2 * 0.01
    assert all(torch.allclose(p, torch.full_like(p, 1 - 0.92)) for p in task.target_encoder.parameters())
    assert int(task.steps) == 3  # the next batch's block sizes are seeded with 3


def test_the_context_encoder_sees_no_pixel_outside_the_context() -> None:
    torch.manual_seed(0)
    model = encoder()
    task = small_task(model)
    context, targets = task.masks.sample(2, torch.Generator().manual_seed(0), torch.Generator().manual_seed(1))
    images = torch.randn(2, 3, 8, 8, requires_grad=True)
    encoded = model.forward_features(images, keep=context)[:, model.num_prefix_tokens :]
    task.predictor(encoded, context, targets).sum().backward()
    reached = images.grad.abs().sum(dim=1).reshape(2, 4, 2, 4, 2).sum(dim=(2, 4)).flatten(1) > 0  # per patch
    for image in range(2):
        assert set(reached[image].nonzero().flatten().tolist()) == set(context[image].tolist())


def test_the_loss_trains_the_model_and_predictor_never_the_target_encoder() -> None:
    torch.manual_seed(0)
    model = encoder()
    task = small_task(model)
    loss = task.training_step(model, (torch.randn(4, 3, 8, 8), None)).loss
    loss.backward()
    assert loss.item() > 0
    assert model.blocks[0].attn.qkv.weight.grad.abs().sum() > 0 and task.predictor.embed.weight.grad.abs().sum() > 0
    assert all(p.grad is None and not p.requires_grad for p in task.target_encoder.parameters())
    assert task.exported_model(model) is task.target_encoder and not task.target_encoder.training
    task.train()
    assert task.predictor.training and not task.target_encoder.training  # the targets never see dropout


def test_a_target_patchs_pixels_reach_the_loss_through_the_target_encoder() -> None:
    """The context encoder never sees a target patch (the test above), so its pixels change the
    loss only as the target encoder, which sees the whole image, encodes them."""
    torch.manual_seed(0)
    model = encoder()
    task = small_task(model)
    context, targets = task.masks.sample(1, torch.Generator().manual_seed(0), torch.Generator().manual_seed(1))
    row, col = divmod(int(targets[0, 0, 0]), 4)
    images = torch.randn(1, 3, 8, 8)
    changed = images.clone()
    changed[..., 2 * row : 2 * row + 2, 2 * col : 2 * col + 2] += 5.0
    with torch.no_grad():
        assert task.loss(model, images, context, targets) != task.loss(model, changed, context, targets)


def test_evaluation_uses_the_same_masks_every_time() -> None:
    torch.manual_seed(0)
    model = encoder().eval()
    task = small_task(model)
    batch = (torch.randn(4, 3, 8, 8), None)
    assert task.evaluation_step(model, batch, "val").loss == task.evaluation_step(model, batch, "val").loss


@pytest.mark.parametrize("changes", [{"patch_embed": "conv", "patch_size": 8, "img_size": 32}, {"shifted_patches": True},
                                     {"merge_tokens": 2}])
def test_a_tokenizer_that_mixes_patches_is_refused(changes: dict) -> None:
    key = next(iter(changes))
    with pytest.raises(FieldError, match=rf"^model.{key} .*\(I-JEPA's context encoder, like MAE's encoder, sees only some patches\)$"):
        small_task(encoder(**changes))


def test_blocks_that_cannot_keep_more_than_min_keep_are_refused() -> None:
    """The default targets on a 4x4 grid can be 1 patch: a min_keep of 1 would make sampling loop forever."""
    with pytest.raises(FieldError, match="^task.ijepa.min_keep is 1, but target blocks of 1 patches .* Lower min_keep, or "
                       "raise target_scale or context_scale.$"):
        small_task(encoder(), min_keep=1)
    with pytest.raises(ValueError, match="context blocks of 4 patches"):
        MultiBlockMasks((4, 4), target_scale=(0.5, 0.5), context_scale=(0.25, 0.25), min_keep=4)
    small_task(encoder(), min_keep=1, target_scale=(0.25, 0.3))  # 2x2 targets: 4 patches
    # int(8 * 0.2) = 1 patch at most on a 2x4 grid, which the refusal names rows first
    with pytest.raises(ValueError, match="^target blocks of 1 patches on the 2x4 grid can never keep more than min_keep=1"):
        MultiBlockMasks((2, 4), min_keep=1)


@pytest.mark.parametrize(("options", "key", "sentence"), [
    ({"predictor_dim": 18}, "predictor_dim", "must be divisible by 4 (its sin-cos position embedding) and by predictor_heads (4), got 18."),
    ({"predictor_dim": 20, "predictor_heads": 8}, "predictor_dim", "must be divisible by 4 (its sin-cos position embedding) and "
     "by predictor_heads (8), got 20."),  # by 4, not by the heads
    ({"predictor_dim": 6, "predictor_heads": 3}, "predictor_dim", "must be divisible by 4 (its sin-cos position embedding) and "
     "by predictor_heads (3), got 6."),  # by the heads, not by 4
    ({"target_scale": (0.3, 0.2)}, "target_scale", "must be a range (low, high) with low <= high, got (0.3, 0.2)."),
])
def test_options_out_of_shape_are_refused(options: dict, key: str, sentence: str) -> None:
    with pytest.raises(FieldError) as error:
        IjepaOptions(**options)
    assert (error.value.key, error.value.problem) == (key, sentence)


def test_a_range_of_one_value_is_a_fixed_share() -> None:
    options = IjepaOptions(target_scale=(0.25, 0.25), target_aspect=(1.0, 1.0), context_scale=(1.0, 1.0))
    assert options.masks((4, 4)).smallest_blocks() == (4, 16)


def test_a_task_built_without_options_takes_the_defaults() -> None:
    task = IjepaTask(encoder().config)
    assert task.masks == IjepaOptions().masks((4, 4)) and task.predictor.embed.out_features == 64
    assert task.momentum == (0.996, 1.0)


def test_the_step_counter_is_exact_past_float32s_whole_numbers() -> None:
    model = encoder()
    task = small_task(model)
    task.after_optimizer_step(model, step=2**24 + 1, total_steps=2**25)
    assert int(task.steps) == 2**24 + 1  # float32 would round it to 2**24


def test_a_predictor_past_the_parameter_limit_is_refused() -> None:
    with pytest.raises(FieldError, match="^task.ijepa.predictor_dim is 65536 with predictor_depth 64: a predictor of about .* "
                       "weights, which with the context and target encoders' exceeds the limit of"):
        IjepaTask(encoder().config, IjepaOptions(predictor_dim=65536, predictor_heads=1, predictor_depth=64))


def test_the_parameter_limit_counts_the_predictor_and_two_encoders(monkeypatch: pytest.MonkeyPatch) -> None:
    """Accepted at the limit, refused one weight past it; a third encoder is not counted."""
    config, options = encoder().config, IjepaOptions(predictor_dim=16, predictor_heads=2, predictor_depth=1)
    total = decoder_weights(32, 32, dim=16, depth=1) + 2 * config.num_weights()
    for limit in (total, total + config.num_weights() // 2):
        monkeypatch.setattr(ijepa, "MAX_PARAMETERS", limit)
        IjepaTask(config, options)
    monkeypatch.setattr(ijepa, "MAX_PARAMETERS", total - 1)
    with pytest.raises(FieldError, match="^task.ijepa.predictor_dim"):
        IjepaTask(config, options)


def test_conflicts_name_the_options_the_target_encoder_rules_out() -> None:
    recipe = SimpleNamespace(optim=SimpleNamespace(ema=True), model=SimpleNamespace(impl="timm"),
                             trainer=SimpleNamespace(strategy="fsdp"))
    found = IjepaTask.conflicts(IjepaOptions(), recipe)
    assert [item.split(" ")[0] for item in found] == ["optim.ema=true", "model.impl=timm", "trainer.strategy=fsdp"]
