"""Pruning results checked against independent derivations: the importance formula, accuracy
counts, the order a scorer dictates, and which heads the redundancy test removes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from tiny_models import DEPTH, HEADS, tiny_model, toy_batches
from torch import nn

from vitkit.prune import head_importance, iterative_pruning, redundancy_test
from vitkit.prune import redundancy as redundancy_module
from vitkit.prune.measure import evaluate_accuracy


def per_example_gradients(model: nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """dL(x)/d xi_h for every example, one at a time: ``[examples, depth, heads]``."""
    per_example = []
    for images, labels in batches:
        for image, label in zip(images, labels):
            gates = [torch.ones(HEADS, requires_grad=True) for _ in range(DEPTH)]
            loss = F.cross_entropy(model(image[None], head_gates=gates), label[None])
            per_example.append(torch.stack(torch.autograd.grad(loss, gates)))
    return torch.stack(per_example)


def test_importance_is_the_mean_over_examples_of_the_absolute_gate_gradient(seed: int) -> None:
    model = tiny_model()
    batches = toy_batches(count=2, batch=5)
    gradients = per_example_gradients(model, batches)
    expected = gradients.abs().mean(0)  # Michel et al.: I_h = E_x |dL(x)/d xi_h|
    scores = head_importance(model, batches, normalize_layers=False)
    torch.testing.assert_close(scores, expected, rtol=1e-5, atol=1e-8)
    # The alternatives the formula must not be: |batch-summed gradient| and mean squared gradient.
    whole = []
    for images, labels in batches:
        gates = [torch.ones(len(images), HEADS, requires_grad=True) for _ in range(DEPTH)]
        loss = F.cross_entropy(model(images, head_gates=gates), labels, reduction="sum")
        whole.append(torch.stack([g.sum(0) for g in torch.autograd.grad(loss, gates)]))
    batch_formula = torch.stack(whole).abs().sum(0) / 10
    assert (batch_formula - expected).abs().max() > 1e-4
    assert (gradients.square().mean(0) - expected).abs().max() > 1e-4


class FixedPredictions(nn.Module):
    """Predicts ``predictions[i]`` for an image whose first pixel holds ``i``."""

    def __init__(self, predictions: list[int], num_classes: int = 3) -> None:
        super().__init__()
        self.anchor = nn.Parameter(torch.zeros(1))
        self.register_buffer("table", F.one_hot(torch.tensor(predictions), num_classes).float())

    def forward(self, images: torch.Tensor, head_gates: object = None) -> torch.Tensor:
        return self.table[images[:, 0, 0, 0].long()] + 0 * self.anchor


def test_accuracy_equals_a_count_of_correct_predictions() -> None:
    predictions = [0, 1, 2, 2, 1, 0, 0, 1]
    labels = torch.tensor([0, 1, 1, 2, 0, 0, 2, 1])  # 5 of 8 right
    images = torch.arange(8).float().view(8, 1, 1, 1).expand(8, 1, 2, 2).contiguous()
    loader = [(images[:3], labels[:3]), (images[3:], labels[3:])]
    assert evaluate_accuracy(FixedPredictions(predictions), loader) == pytest.approx(100 * 5 / 8)


def test_iterative_pruning_removes_heads_in_the_scorers_order(seed: int) -> None:
    model = tiny_model()
    order = [(1, 3), (0, 0), (1, 1), (0, 2), (0, 3), (1, 0), (0, 1), (1, 2)]  # least important first
    ranks = torch.zeros(DEPTH, HEADS)
    for rank, (layer, head) in enumerate(order):
        ranks[layer, head] = rank + 1.0

    def scorer(model: nn.Module, gates: list[torch.Tensor]) -> torch.Tensor:
        return ranks.clone()

    data = toy_batches(count=1, batch=4)
    records = iterative_pruning(model, data, step_fraction=0.01, eval_loader=data, scorer=scorer, progress=False)
    for step, record in enumerate(records):
        removed = sorted((layer, head) for layer, heads in record.pruned.items() for head in heads)
        assert removed == sorted(order[:step])


def test_redundancy_test_removes_each_layers_least_important_heads(seed: int, monkeypatch) -> None:
    scores = torch.tensor([[0.9, 0.1, 0.5, 0.3], [0.2, 0.8, 0.05, 0.6]])
    monkeypatch.setattr(redundancy_module, "head_importance", lambda *args, **kwargs: scores)
    data = toy_batches(count=1, batch=4)
    result = redundancy_test(tiny_model(), data, eval_loader=data, fraction=0.5)
    assert {layer: sorted(heads) for layer, heads in result.pruned.items()} == {0: [1, 3], 1: [0, 2]}
