"""Weighted k-NN accuracy (``vitkit.train.knn``): a hand-computed example, and DINO's
``knn_classifier`` (facebookresearch/dino, ``eval_knn.py``, written out below) on random features."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from vitkit.models import VisionTransformer, ViTConfig
from vitkit.train import knn
from vitkit.train.knn import knn_accuracy, linear_probe_accuracy, pooled_features

# Memory bank on the unit circle: a (1, 0) and d (-1, 0) of class 0, b (0.8, 0.6) and c (0, 1) of class 1.
BANK = torch.tensor([[1.0, 0.0], [0.8, 0.6], [0.0, 1.0], [-1.0, 0.0]])
LABELS = torch.tensor([0, 1, 1, 0])
QUERY, QUERY_LABEL = torch.tensor([[1.0, 0.0]]), torch.tensor([0])


def test_a_hand_computed_vote() -> None:
    # cosines to the query: a 1, b 0.8, c 0, d -1.
    # k=2, T=1: class 0 gets e^1 = 2.72, class 1 e^0.8 = 2.23 -> class 0, right.
    assert math.exp(1) > math.exp(0.8)
    assert knn_accuracy(BANK, LABELS, QUERY, QUERY_LABEL, 2, k=2, temperature=1.0) == 100.0
    # k=3, T=1: class 1 adds c's e^0 = 1: 3.23 > 2.72 -> class 1, wrong.
    assert math.exp(0.8) + 1 > math.exp(1)
    assert knn_accuracy(BANK, LABELS, QUERY, QUERY_LABEL, 2, k=3, temperature=1.0) == 0.0
    # k=3, T=0.1: e^10 outweighs e^8 + e^0 -> class 0 (a plain majority of the three would say 1)
    assert knn_accuracy(BANK, LABELS, QUERY, QUERY_LABEL, 2, k=3, temperature=0.1) == 100.0


def test_features_are_compared_by_cosine_not_length() -> None:
    scaled = BANK * torch.tensor([[1.0], [5.0], [0.2], [3.0]])
    assert knn_accuracy(scaled, LABELS, 7 * QUERY, QUERY_LABEL, 2, k=3, temperature=1.0) == 0.0
    assert knn_accuracy(scaled, LABELS, 7 * QUERY, QUERY_LABEL, 2, k=2, temperature=1.0) == 100.0


def test_k_larger_than_the_bank_uses_the_whole_bank() -> None:
    assert knn_accuracy(BANK, LABELS, QUERY, QUERY_LABEL, 2, k=20, temperature=0.07) == 100.0


# --- facebookresearch/dino, eval_knn.py ---------------------------------------------------------------
@torch.no_grad()
def dino_knn_classifier(train_features, train_labels, test_features, test_labels, k, T, num_classes=1000):  # noqa: N803
    top1, top5, total = 0.0, 0.0, 0
    train_features = train_features.t()
    num_test_images, num_chunks = test_labels.shape[0], 100
    imgs_per_chunk = num_test_images // num_chunks
    retrieval_one_hot = torch.zeros(k, num_classes).to(train_features.device)
    for idx in range(0, num_test_images, imgs_per_chunk):
        features = test_features[idx: min((idx + imgs_per_chunk), num_test_images), :]
        targets = test_labels[idx: min((idx + imgs_per_chunk), num_test_images)]
        batch_size = targets.shape[0]
        similarity = torch.mm(features, train_features)
        distances, indices = similarity.topk(k, largest=True, sorted=True)
        candidates = train_labels.view(1, -1).expand(batch_size, -1)
        retrieved_neighbors = torch.gather(candidates, 1, indices)
        retrieval_one_hot.resize_(batch_size * k, num_classes).zero_()
        retrieval_one_hot.scatter_(1, retrieved_neighbors.view(-1, 1), 1)
        distances_transform = distances.clone().div_(T).exp_()
        probs = torch.sum(
            torch.mul(retrieval_one_hot.view(batch_size, -1, num_classes), distances_transform.view(batch_size, -1, 1)),
            1,
        )
        _, predictions = probs.sort(1, True)
        correct = predictions.eq(targets.data.view(-1, 1))
        top1 = top1 + correct.narrow(1, 0, 1).sum().item()
        top5 = top5 + correct.narrow(1, 0, min(5, k)).sum().item()
        total += targets.size(0)
    return top1 * 100.0 / total, top5 * 100.0 / total
# ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("k", "temperature"), [(20, 0.07), (5, 0.5)])
def test_equals_dinos_knn_classifier_in_chunks(monkeypatch: pytest.MonkeyPatch, k: int, temperature: float) -> None:
    generator = torch.Generator().manual_seed(0)
    centres = torch.randn(5, 16, generator=generator)
    train_labels = torch.randint(0, 5, (300,), generator=generator)
    test_labels = torch.randint(0, 5, (200,), generator=generator)
    train = centres[train_labels] + 1.5 * torch.randn(300, 16, generator=generator)
    test = centres[test_labels] + 1.5 * torch.randn(200, 16, generator=generator)
    # DINO normalises the features before its classifier (eval_knn.py's main)
    reference, _ = dino_knn_classifier(F.normalize(train, dim=1), train_labels, F.normalize(test, dim=1), test_labels,
                                       k, temperature, num_classes=5)
    assert 30.0 < reference < 100.0  # neither trivial nor hopeless
    assert knn_accuracy(train, train_labels, test, test_labels, 5, k=k, temperature=temperature) == pytest.approx(reference)
    monkeypatch.setattr(knn, "TEST_CHUNK", 7)  # chunks that do not divide the test set
    assert knn_accuracy(train, train_labels, test, test_labels, 5, k=k, temperature=temperature) == pytest.approx(reference)


def test_pooled_features_are_what_a_classifier_reads() -> None:
    model = VisionTransformer(ViTConfig(img_size=8, patch_size=2, in_chans=1, num_classes=0, embed_dim=16, depth=1,
                                        num_heads=2)).eval()
    images = torch.randn(6, 1, 8, 8)
    features, labels = pooled_features(model, [(images[:4], torch.arange(4)), (images[4:], torch.arange(4, 6))])
    assert torch.allclose(features, model(images), atol=1e-6)  # headless: forward is the pooled features
    assert labels.tolist() == list(range(6))


def test_the_linear_probe_separates_linearly_separable_features_whatever_their_scale() -> None:
    generator = torch.Generator().manual_seed(0)
    train, test = torch.randn(200, 8, generator=generator), torch.randn(100, 8, generator=generator)
    direction = torch.tensor([1.0, -2.0, 0.5, 0, 0, 0, 0, 3.0])
    train_labels, test_labels = (((x @ direction) > 0).long() for x in (train, test))
    scale = torch.tensor([1e3, 1.0, 1e-3, 1.0, 1.0, 1.0, 1.0, 10.0])  # standardised away
    assert linear_probe_accuracy(train * scale, train_labels, test * scale, test_labels, 2) >= 97.0
    # the k-NN of these features is worse than the probe: the probe learns the direction
    assert knn_accuracy(train * scale, train_labels, test * scale, test_labels, 2) < 90.0


def test_the_linear_probe_of_labels_unrelated_to_the_features_is_near_chance() -> None:
    generator = torch.Generator().manual_seed(1)
    train, test = torch.randn(300, 16, generator=generator), torch.randn(300, 16, generator=generator)
    labels = torch.randint(0, 3, (600,), generator=generator)
    assert 20.0 < linear_probe_accuracy(train, labels[:300], test, labels[300:], 3) < 47.0


def test_the_linear_probe_is_the_minimiser_of_its_regularised_loss_after_its_steps() -> None:
    """With ``steps`` L-BFGS iterations the probe predicts as the minimiser of cross-entropy plus
    ``weight_decay |W|^2`` on standardised features, found here by Newton's method in float64; one
    step does not get there, and well separated clusters score exactly 100."""
    generator = torch.Generator().manual_seed(3)
    train, test = torch.randn(120, 4, generator=generator), torch.randn(400, 4, generator=generator)
    labels = (train @ torch.tensor([1.0, -1.0, 0.5, 0.0]) + 0.8 * torch.randn(120, generator=generator) > 0).long()
    test_labels = (test @ torch.tensor([1.0, -1.0, 0.5, 0.0]) > 0).long()
    mean, std = train.double().mean(0), train.double().std(0) + 1e-6
    x = torch.cat([(train.double() - mean) / std, torch.ones(120, 1, dtype=torch.float64)], 1)  # bias column
    weights = torch.zeros(5, 2, dtype=torch.float64, requires_grad=True)

    def objective(w: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(x @ w, labels) + 0.05 * (w[:4] ** 2).sum()

    for _ in range(30):  # Newton (pinv: a bias shared by both classes changes nothing)
        grad = torch.autograd.grad(objective(weights), weights)[0]
        hessian = torch.autograd.functional.hessian(objective, weights.detach()).reshape(10, 10)
        with torch.no_grad():
            weights -= (torch.linalg.pinv(hessian) @ grad.reshape(10)).reshape(5, 2)
    test_x = torch.cat([(test.double() - mean) / std, torch.ones(400, 1, dtype=torch.float64)], 1)
    expected = 100.0 * ((test_x @ weights.detach()).argmax(1) == test_labels).double().mean().item()
    assert linear_probe_accuracy(train, labels, test, test_labels, 2, weight_decay=0.05) == pytest.approx(expected)
    assert linear_probe_accuracy(train, labels, test, test_labels, 2, weight_decay=0.05, steps=1) != pytest.approx(expected)
    clusters = torch.tensor([[5.0, 5.0], [5.5, 5.0], [-5.0, -5.0], [-5.5, -5.0]])
    assert linear_probe_accuracy(clusters, torch.tensor([1, 1, 0, 0]), clusters, torch.tensor([1, 1, 0, 0]), 2) == 100.0
