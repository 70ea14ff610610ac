"""Weighted k-NN and linear-probe accuracy of frozen features: how a pre-trained encoder is judged
without fine-tuning it. k-NN trains no classifier at all (Wu et al. 2018, https://arxiv.org/abs/1805.01978, as DINO's ``eval_knn.py``,
facebookresearch/dino, evaluates; Caron et al. 2021, https://arxiv.org/abs/2104.14294).

Features are L2-normalised, so the dot product is the cosine similarity. Each test image takes
its ``k`` most similar training images (the memory bank), each voting for its label with weight
``exp(similarity / T)``; the class with the largest sum is the prediction. The linear probe
(:func:`linear_probe_accuracy`) fits one linear layer on the standardised features, as MAE's and
DINO's linear evaluation does (there with SGD over augmented images; here full-batch L-BFGS on the
fixed features, which converges in seconds). The labels are used for these measurements only,
never in pre-training.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

#: Test images compared with the memory bank at once: ``TEST_CHUNK x N`` similarities in memory.
TEST_CHUNK = 256


@torch.no_grad()
def knn_accuracy(
    train_features: torch.Tensor,
    train_labels: torch.Tensor,
    test_features: torch.Tensor,
    test_labels: torch.Tensor,
    num_classes: int,
    k: int = 20,
    temperature: float = 0.07,
) -> float:
    """Top-1 accuracy (percent) of DINO's weighted k-NN classifier.

    Args:
        train_features: ``[N, D]`` memory bank (any scale: normalised here).
        train_labels: ``[N]`` integer labels in ``[0, num_classes)``.
        test_features: ``[M, D]`` features to classify.
        test_labels: ``[M]`` their labels.
        num_classes: classes of the labels.
        k: neighbours that vote (at most ``N``; DINO's 20).
        temperature: ``T`` of the votes' weights ``exp(cos / T)`` (DINO's 0.07).

    Returns:
        the percentage of test images whose weighted vote is their label; test images are
        compared with the bank :data:`TEST_CHUNK` at a time, so memory stays bounded.
    """
    if len(test_labels) == 0:
        raise ValueError("knn_accuracy needs at least one test image.")
    bank = F.normalize(train_features.float(), dim=1).t()
    train_labels = train_labels.to(bank.device).long()
    k = min(k, bank.shape[1])
    correct = 0
    for start in range(0, len(test_labels), TEST_CHUNK):
        queries = F.normalize(test_features[start : start + TEST_CHUNK].float().to(bank.device), dim=1)
        targets = test_labels[start : start + TEST_CHUNK].to(bank.device).long()
        similarity, neighbours = (queries @ bank).topk(k, dim=1, largest=True, sorted=True)
        votes = F.one_hot(train_labels[neighbours], num_classes).float()  # [chunk, k, classes]
        scores = (votes * (similarity / temperature).exp().unsqueeze(-1)).sum(dim=1)
        correct += int((scores.argmax(dim=1) == targets).sum())
    return 100.0 * correct / len(test_labels)


def linear_probe_accuracy(
    train_features: torch.Tensor,
    train_labels: torch.Tensor,
    test_features: torch.Tensor,
    test_labels: torch.Tensor,
    num_classes: int,
    *,
    weight_decay: float = 1e-4,
    steps: int = 100,
) -> float:
    """Top-1 accuracy (percent) of a linear classifier fitted on frozen features.

    The features are standardised with the training features' mean and std (MAE's probe puts a
    BatchNorm without affine before its linear layer), then a ``[D, num_classes]`` layer is fitted by
    full-batch L-BFGS (``steps`` iterations) on cross-entropy plus ``weight_decay`` times the
    squared weights; deterministic for given features.
    """
    # Gradients on, even where it is called from an evaluation loop (Lightning's test runs in inference mode).
    with torch.inference_mode(False), torch.enable_grad():
        train, test = train_features.float().clone(), test_features.float().clone()  # not inference tensors
        mean, std = train.mean(dim=0), train.std(dim=0) + 1e-6
        train, test = (train - mean) / std, (test - mean) / std
        layer = nn.Linear(train.shape[1], num_classes, device=train.device)
        nn.init.zeros_(layer.weight)
        nn.init.zeros_(layer.bias)
        optimizer = torch.optim.LBFGS(layer.parameters(), lr=1.0, max_iter=steps, line_search_fn="strong_wolfe")
        labels = train_labels.long().clone().to(train.device)

        def closure() -> torch.Tensor:
            optimizer.zero_grad()
            loss = F.cross_entropy(layer(train), labels) + weight_decay * layer.weight.pow(2).sum()
            loss.backward()
            return loss

        optimizer.step(closure)
        with torch.no_grad():
            predictions = layer(test).argmax(dim=1).cpu()
    return 100.0 * float((predictions == test_labels.long().cpu()).float().mean())


@torch.no_grad()
def pooled_features(model: nn.Module, batches: Iterable[Any], device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """The encoder's pooled features (``forward_head(forward_features(x), pre_logits=True)``, what
    a classifier fine-tuned from it reads) and the labels of ``(images, labels)`` batches, as
    ``[N, D]`` and ``[N]`` CPU tensors. ``model`` is used as it is (put it in eval mode first)."""
    features, labels = [], []
    for images, targets in batches:
        tokens = model.forward_features(images.to(device))
        features.append(model.forward_head(tokens, pre_logits=True).float().cpu())
        labels.append(torch.as_tensor(targets).cpu())
    return torch.cat(features), torch.cat(labels)
