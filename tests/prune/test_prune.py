"""Head importance, gating == pruning, saving pruned models, iterative pruning."""

from __future__ import annotations

import math

import pytest
import torch
from tiny_models import DEPTH, DIM, HEADS, tiny_model, toy_batches

import vitkit
from vitkit.models import count_parameters, vit_flops
from vitkit.prune import (
    attention_entropy,
    full_gates,
    gated_off,
    head_importance,
    iterative_pruning,
    least_scored,
    prune_heads,
    pruned_copy,
    random_scorer,
    redundancy_test,
    time_forward,
    within_budget,
)
from vitkit.prune.iterative import PruningStep


def gates_off(model: vitkit.VisionTransformer, heads: dict[int, list[int]]) -> list[torch.Tensor]:
    gates = full_gates(model)
    for layer, layer_heads in heads.items():
        gates[layer][layer_heads] = 0.0
    return gates


def silence_head(model: vitkit.VisionTransformer, layer: int, head: int, where: str) -> None:
    """Make ``head`` of ``layer`` irrelevant: zero its value rows (weights and bias) or its W_o columns."""
    attn = model.blocks[layer].attn
    d = attn.head_dim
    with torch.no_grad():
        if where == "value":
            rows = slice(2 * HEADS * d + head * d, 2 * HEADS * d + (head + 1) * d)
            attn.qkv.weight[rows] = 0
            attn.qkv.bias[rows] = 0
        else:
            attn.proj.weight[:, head * d : (head + 1) * d] = 0


@pytest.mark.parametrize("where", ["value", "output"])
def test_importance_ranks_a_silenced_head_last(seed: int, where: str) -> None:
    model = tiny_model()
    silence_head(model, layer=1, head=2, where=where)
    scores = head_importance(model, toy_batches())
    assert scores.shape == (DEPTH, HEADS)
    assert least_scored(scores, full_gates(model), 1) == [(1, 2)]
    assert scores[1, 2] == 0
    assert (scores.flatten().sort().values[1:] > 0).all()


def test_importance_is_per_example_so_batching_does_not_change_it(seed: int) -> None:
    model = tiny_model()
    (images, labels), _ = toy_batches(batch=6)
    whole = head_importance(model, [(images, labels)], normalize_layers=False)
    singles = head_importance(model, list(zip(images.split(1), labels.split(1))), normalize_layers=False)
    torch.testing.assert_close(whole, singles, rtol=1e-4, atol=1e-7)


def test_importance_rows_have_unit_norm_and_gated_heads_score_zero(seed: int) -> None:
    model = tiny_model()
    scores = head_importance(model, toy_batches(), gates=gates_off(model, {0: [1, 3]}))
    assert scores[0, 1] == 0 and scores[0, 3] == 0
    torch.testing.assert_close(scores.norm(dim=1), torch.ones(DEPTH))


def test_importance_of_a_pruned_model_marks_absent_heads_nan(seed: int) -> None:
    model = prune_heads(tiny_model(), {0: [0, 1], 1: [0, 1, 2, 3]})
    scores = head_importance(model, toy_batches())
    assert scores.shape == (DEPTH, 2)
    assert torch.isnan(scores[1]).all() and not torch.isnan(scores[0]).any()
    assert sorted(least_scored(scores, full_gates(model), 5)) == [(0, 0), (0, 1)]


def test_uniform_attention_has_entropy_log_n(seed: int) -> None:
    model = tiny_model()
    for block in model.blocks:  # zero queries and keys: every score is 0, the softmax is uniform
        with torch.no_grad():
            block.attn.qkv.weight[: 2 * DIM] = 0
            block.attn.qkv.bias[: 2 * DIM] = 0
    tokens = 4 + 1
    torch.testing.assert_close(attention_entropy(model, toy_batches()), torch.full((DEPTH, HEADS), math.log(tokens)))


@pytest.mark.parametrize("heads", [{0: [1]}, {0: [0, 3], 1: [2]}, {1: [0, 1, 2]}])
def test_pruned_model_equals_gated_model(seed: int, heads: dict[int, list[int]]) -> None:
    model = tiny_model()
    images, _ = toy_batches()[0]
    gated = model(images, head_gates=gates_off(model, heads))
    pruned = pruned_copy(model, gates_off(model, heads))
    torch.testing.assert_close(pruned(images), gated, atol=1e-5, rtol=1e-5)
    assert pruned.heads_per_layer() == [HEADS - len(heads.get(layer, [])) for layer in range(DEPTH)]
    assert pruned.config.heads_per_layer() == pruned.heads_per_layer()
    assert count_parameters(pruned) < count_parameters(model)
    assert vit_flops(pruned.config) < vit_flops(model.config)
    assert model.heads_per_layer() == [HEADS] * DEPTH  # the original is untouched


def test_pruning_every_head_of_a_layer_equals_gating_without_the_wo_bias(seed: int) -> None:
    model = tiny_model()
    with torch.no_grad():
        model.blocks[0].attn.proj.bias.normal_()
    images, _ = toy_batches()[0]
    gates = gates_off(model, {0: [0, 1, 2, 3]})
    pruned = pruned_copy(model, gates)
    assert pruned.heads_per_layer() == [0, HEADS]
    # Gated-off heads still pass W_o's bias into the residual stream; a pruned layer adds nothing.
    assert not torch.allclose(pruned(images), model(images, head_gates=gates), atol=1e-4)
    with torch.no_grad():
        model.blocks[0].attn.proj.bias.zero_()
    torch.testing.assert_close(pruned(images), model(images, head_gates=gates), atol=1e-5, rtol=1e-5)


def test_pruned_model_saves_and_reloads_with_its_shapes_and_outputs(seed: int, tmp_path) -> None:
    model = prune_heads(tiny_model(), {0: [2], 1: [0, 1, 2, 3]})
    path = vitkit.save_model(model, tmp_path / "pruned.safetensors", extra={"dataset": "toy"})
    loaded = vitkit.load_model(path).eval()
    images, _ = toy_batches()[0]
    assert loaded.heads_per_layer() == [3, 0]
    assert {k: v.shape for k, v in loaded.state_dict().items()} == {k: v.shape for k, v in model.state_dict().items()}
    torch.testing.assert_close(loaded(images), model(images))
    assert vitkit.io.read_model_file(path)[2] == {"dataset": "toy"}


def test_prune_heads_rejects_a_layer_outside_the_model() -> None:
    with pytest.raises(ValueError, match=r"layer index 5 is outside \[0, 2\)"):
        prune_heads(tiny_model(), {5: [0]})


def test_gates_of_the_wrong_shape_are_rejected_with_a_hint() -> None:
    with pytest.raises(ValueError, match="full_gates"):
        pruned_copy(tiny_model(), [torch.ones(HEADS)])


def test_least_scored_skips_gated_off_heads() -> None:
    scores = torch.tensor([[0.1, 0.2], [0.3, 0.05]])
    gates = [torch.tensor([0.0, 1.0]), torch.tensor([1.0, 1.0])]
    assert least_scored(scores, gates, 2) == [(1, 1), (0, 1)]
    assert gated_off(gates) == {0: [0]}


def test_iterative_pruning_removes_heads_every_step_and_records_costs(seed: int) -> None:
    model = tiny_model()
    data = toy_batches()
    records = iterative_pruning(model, data, step_fraction=0.3, eval_loader=data, speed_batch=data[0][0],
                                progress=False)
    heads_left = [r.heads_left for r in records]
    assert heads_left[0] == DEPTH * HEADS and heads_left[-1] == 0
    assert all(a > b for a, b in zip(heads_left, heads_left[1:]))
    assert heads_left[1] == DEPTH * HEADS - round(0.3 * DEPTH * HEADS)
    assert all(a.parameters > b.parameters and a.flops > b.flops for a, b in zip(records, records[1:]))
    assert all(r.images_per_s > 0 and sum(r.heads_per_layer) == r.heads_left for r in records)
    assert records[-1].fraction_pruned == 1.0
    assert model.heads_per_layer() == [HEADS] * DEPTH


def test_iterative_pruning_stops_at_min_heads_and_follows_the_scorer(seed: int) -> None:
    model = tiny_model()
    data = toy_batches()
    records = iterative_pruning(model, data, eval_loader=data, scorer=random_scorer(0), min_heads=3, progress=False)
    assert records[-1].heads_left == 3
    again = iterative_pruning(model, data, eval_loader=data, scorer=random_scorer(0), min_heads=3, progress=False)
    assert [r.pruned for r in again] == [r.pruned for r in records]


def test_within_budget_picks_the_most_pruned_step_inside_the_drop() -> None:
    def step(fraction: float, accuracy: float) -> PruningStep:
        return PruningStep(0, 0, fraction, accuracy, 0, 0, None, [])

    records = [step(0.0, 90.0), step(0.2, 89.5), step(0.4, 89.1), step(0.6, 89.2), step(0.8, 80.0)]
    assert within_budget(records, 1.0).fraction_pruned == 0.6


def test_within_budget_stops_at_the_first_step_over_the_drop() -> None:
    def step(fraction: float, accuracy: float) -> PruningStep:
        return PruningStep(0, 0, fraction, accuracy, 0, 0, None, [])

    # 0.4 fails the budget; 0.6 passes again by luck and must not be chosen.
    records = [step(0.0, 90.0), step(0.2, 89.5), step(0.4, 88.5), step(0.6, 89.2), step(0.8, 80.0)]
    assert within_budget(records, 1.0).fraction_pruned == 0.2
    assert within_budget(records[:1] + [step(0.2, 70.0)], 1.0).fraction_pruned == 0.0


def test_scoring_data_is_never_the_default_evaluation_data() -> None:
    import inspect

    for function in (iterative_pruning, redundancy_test):
        parameter = inspect.signature(function).parameters["eval_loader"]
        assert parameter.default is inspect.Parameter.empty, function.__name__


def test_redundancy_test_halves_every_layer(seed: int) -> None:
    result = redundancy_test(tiny_model(), toy_batches(), eval_loader=toy_batches())
    assert result.heads_before == DEPTH * HEADS and result.heads_after == DEPTH * HEADS // 2
    assert {layer: len(h) for layer, h in result.pruned.items()} == {0: 2, 1: 2}
    assert result.change == result.accuracy_pruned - result.accuracy_full


def test_time_forward_gives_one_positive_median_per_model(seed: int) -> None:
    model = tiny_model()
    times = time_forward([model, pruned_copy(model, gates_off(model, {0: [0]}))], torch.randn(2, 3, 8, 8), rounds=3)
    assert len(times) == 2 and all(t > 0 for t in times)
