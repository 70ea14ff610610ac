"""Per-head scores: gradient importance (Michel et al. 2019) and attention entropy.

Both return a ``[depth, max_H]`` float tensor, one row per block and one column per head of
the *current* model; after physical pruning blocks may have fewer heads than ``max_H``, and the
columns of absent heads hold NaN. Heads whose gate is 0 score 0 in :func:`head_importance`
(they are already off); ranking helpers such as :func:`vitkit.prune.iterative.least_scored`
exclude gated-off and absent heads.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
import torch.nn.functional as F

from ..evaluation import Batch, batches, eval_mode, model_device
from ..layers.attention_stats import row_entropy
from ..models import VisionTransformer
from .pruning import check_gates, full_gates


def pad_layers(rows: Sequence[torch.Tensor]) -> torch.Tensor:
    """Stack per-layer ``[H_l]`` rows into ``[depth, max_H]``, NaN where a layer has no such head."""
    width = max((len(row) for row in rows), default=0)
    out = torch.full((len(rows), width), float("nan"))
    for layer, row in enumerate(rows):
        out[layer, : len(row)] = row
    return out


def head_importance(
    model: VisionTransformer,
    dataloader: Iterable[Batch],
    *,
    gates: Sequence[torch.Tensor] | None = None,
    normalize_layers: bool = True,
    max_batches: int | None = None,
    progress: bool = False,
) -> torch.Tensor:
    """Head importance ``I_h = E_x |dL(x)/d xi_h|`` of Michel, Levy and Neubig 2019
    ("Are Sixteen Heads Really Better than One?", https://arxiv.org/abs/1905.10650).

    Each head's output is multiplied by a gate ``xi_h`` (the current ``gates``, 1 by default).
    The gates are expanded to ``[B, H_l]`` and the loss summed over the batch, so every example
    gets its own gradient; its absolute value is averaged over the examples, as the paper defines
    it (HuggingFace's ``run_bertology.py`` instead takes ``|.|`` of whole-batch gradients, which
    lets opposite-signed examples cancel). Cross-entropy on the labels is the loss; the model is
    in eval mode and its parameters get no gradients.

    Args:
        model: a :class:`VisionTransformer` (its device is used).
        dataloader: yields ``(images [B, C, H, W], labels [B])``.
        gates: current per-block ``[H_l]`` 0/1 gates; heads gated to 0 get importance 0.
        normalize_layers: divide each layer's scores by their L2 norm. In Michel et al.'s code
            this is an opt-in flag (``--normalize_pruning_by_layer``), which their README and
            Hugging Face's bertology example turn on.
            It equalises the layers, so a global ranking takes about as many heads from each
            layer; when layers differ a lot (the trained quickstart ViT's first-layer heads score
            5-20x its last layer's), raw scores (``False``) rank across layers far better.
        max_batches: use at most this many batches.
        progress: show a tqdm bar.

    Returns:
        ``[depth, max_H]`` importances (NaN for heads a pruned layer no longer has).
    """
    gates = check_gates(model, full_gates(model) if gates is None else gates)
    device = model_device(model)
    totals = [torch.zeros(len(g)) for g in gates]
    examples = 0
    with eval_mode(model, frozen=True):
        for images, labels in batches(dataloader, max_batches, "head importance", progress):
            batch = len(labels)
            xi = [g.to(device).expand(batch, -1).clone().requires_grad_(True) for g in gates]
            loss = F.cross_entropy(model(images.to(device), head_gates=xi), labels.to(device), reduction="sum")
            # A layer with no heads left never uses its gate: allow_unused gives None for it.
            grads = torch.autograd.grad(loss, xi, allow_unused=True)
            for total, grad in zip(totals, grads):
                if grad is not None:
                    total += grad.abs().sum(0).cpu()
            examples += batch
    if examples == 0:
        raise ValueError("the dataloader yielded no examples; head importance needs data.")
    scores = [total / examples * (g != 0) for total, g in zip(totals, gates)]
    if normalize_layers:
        scores = [row / (row.norm() + 1e-20) for row in scores]
    return pad_layers(scores)


@torch.no_grad()
def attention_entropy(
    model: VisionTransformer,
    dataloader: Iterable[Batch],
    *,
    gates: Sequence[torch.Tensor] | None = None,
    max_batches: int | None = None,
    progress: bool = False,
) -> torch.Tensor:
    """Mean entropy (nats) of each head's attention distributions, over queries and examples.

    Low entropy: the head attends to a few tokens; ``log N`` (the maximum): uniform attention,
    an average over the whole image.

    Args:
        model: a :class:`VisionTransformer`.
        dataloader: yields ``(images, labels)``; labels are ignored.
        gates: current per-block ``[H_l]`` gates (they change what later layers see).
        max_batches: use at most this many batches.
        progress: show a tqdm bar.

    Returns:
        ``[depth, max_H]`` entropies (NaN for absent heads).
    """
    gates = check_gates(model, full_gates(model) if gates is None else gates)
    device = model_device(model)
    head_gates = [g.to(device) for g in gates]
    totals = [torch.zeros(len(g)) for g in gates]
    examples = 0
    with eval_mode(model):
        for images, _ in batches(dataloader, max_batches, "attention entropy", progress):
            run = model.forward_intermediates(
                images.to(device), intermediates_only=True, return_attention=True, head_gates=head_gates
            )
            for total, weights in zip(totals, run.attentions):
                total += row_entropy(weights).mean(-1).sum(0).cpu()  # [B, H, N] nats, mean over queries
            examples += len(images)
    if examples == 0:
        raise ValueError("the dataloader yielded no examples; attention entropy needs data.")
    return pad_layers([total / examples for total in totals])
