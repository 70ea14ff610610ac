"""Weighted k-NN accuracy of frozen features: how a pre-trained encoder is judged without training
a classifier (Wu et al. 2018, https://arxiv.org/abs/1805.01978, as DINO's ``eval_knn.py``,
facebookresearch/dino, evaluates; Caron et al. 2021, https://arxiv.org/abs/2104.14294).

Features are L2-normalised, so the dot product is the cosine similarity. Each test image takes
its ``k`` most similar training images (the memory bank), each voting for its label with weight
``exp(similarity / T)``; the class with the largest sum is the prediction. The labels are used
for this measurement only, never in pre-training.
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
