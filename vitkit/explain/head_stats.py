"""Per-head attention diagnostics: a checklist of attention pathologies, as numbers.

For every layer and head, averaged over images and query tokens:

* ``entropy``: entropy of each query's attention distribution divided by ``log N`` (1 = uniform,
  an unfocused head; 0 = one key only);
* ``diagonal``: weight a token puts on itself (a bright diagonal: nothing mixed between tokens);
* ``cls_share``: weight put on the class token (an attention sink); NaN without a class token;
* ``reg_share``: weight put on the register tokens together (Darcet et al. 2023, "Vision
  Transformers Need Registers", arXiv:2309.16588: registers are meant to take over the sink);
  NaN without registers. :meth:`HeadStats.sink_shares` gives both per layer;
* ``similarity[l, h, g]``: ``1 - JS(p_h, p_g) / log 2`` between heads ``h`` and ``g`` of layer
  ``l``, averaged over queries (1 = the two heads attend identically: collapse).

:func:`head_warnings` turns them into plain-language warnings with the thresholds of
:class:`HeadThresholds`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

from ..layers.attention_stats import row_entropy
from ..layers.token_merging import unmerge_attention
from ..models import VisionTransformer

_EPS = 1e-12


@dataclass
class HeadStats:
    """Diagnostics of every head. Layers with fewer heads (pruned) are NaN-padded to ``H_max``.

    Attributes:
        entropy, diagonal, cls_share, reg_share: ``[L, H_max]``.
        similarity: ``[L, H_max, H_max]``, symmetric, 1 on the diagonal.
        heads_per_layer: head count of each layer.
        num_images: images averaged over.
    """

    entropy: torch.Tensor
    diagonal: torch.Tensor
    cls_share: torch.Tensor
    reg_share: torch.Tensor
    similarity: torch.Tensor
    heads_per_layer: list[int]
    num_images: int

    def most_similar(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``([L, H_max] highest similarity to another head, [L, H_max] that head's index)``;
        NaN / -1 for single-head layers and padding."""
        others = self.similarity.clone()
        eye = torch.eye(others.shape[-1], dtype=torch.bool)
        others[:, eye] = float("nan")
        filled = others.nan_to_num(nan=-1.0)
        if filled.shape[-1] == 0:  # every head pruned: nothing to compare
            return filled.new_full(filled.shape[:-1], float("nan")), torch.full(filled.shape[:-1], -1)
        values, index = filled.max(dim=-1)
        missing = values < 0
        return values.masked_fill(missing, float("nan")), index.masked_fill(missing, -1)

    def rows(self) -> list[dict[str, float | int]]:
        """One record per existing head: ``layer, head, entropy, diagonal, cls_share, reg_share,
        max_similarity, most_similar_head`` (for a CSV)."""
        best, partner = self.most_similar()
        return [
            {
                "layer": layer,
                "head": head,
                "entropy": self.entropy[layer, head].item(),
                "diagonal": self.diagonal[layer, head].item(),
                "cls_share": self.cls_share[layer, head].item(),
                "reg_share": self.reg_share[layer, head].item(),
                "max_similarity": best[layer, head].item(),
                "most_similar_head": int(partner[layer, head]),
            }
            for layer, heads in enumerate(self.heads_per_layer)
            for head in range(heads)
        ]

    def sink_shares(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The seed's "sink" check per layer: ``([L] attention on the class token, [L] attention
        on the registers)``, each the mean over the layer's heads (NaN where the token is absent
        or the layer has no heads)."""
        return self.cls_share.nanmean(dim=1), self.reg_share.nanmean(dim=1)

    def merge(self, other: HeadStats) -> HeadStats:
        """Image-weighted average of two sets of statistics of the same model."""
        if self.heads_per_layer != other.heads_per_layer:
            raise ValueError(
                f"cannot merge statistics of different models: {self.heads_per_layer} vs {other.heads_per_layer}."
            )
        total = self.num_images + other.num_images
        a, b = self.num_images / total, other.num_images / total
        return HeadStats(
            entropy=a * self.entropy + b * other.entropy,
            diagonal=a * self.diagonal + b * other.diagonal,
            cls_share=a * self.cls_share + b * other.cls_share,
            reg_share=a * self.reg_share + b * other.reg_share,
            similarity=a * self.similarity + b * other.similarity,
            heads_per_layer=self.heads_per_layer,
            num_images=total,
        )


def _js_similarity(attention: torch.Tensor) -> torch.Tensor:
    """``[B, H, N, N]`` (float32) to ``[H, H]``: mean over images and queries of ``1 - JS / log 2``."""
    heads = attention.shape[1]
    logs = attention.clamp_min(_EPS).log()
    similarity = torch.eye(heads)
    for h in range(heads):
        for g in range(h + 1, heads):
            p, q = attention[:, h], attention[:, g]
            mix = (p + q) / 2
            log_mix = mix.clamp_min(_EPS).log()
            js = 0.5 * (p * (logs[:, h] - log_mix)).sum(-1) + 0.5 * (q * (logs[:, g] - log_mix)).sum(-1)
            similarity[h, g] = similarity[g, h] = 1.0 - js.mean().item() / math.log(2)
    return similarity


def attention_statistics(
    attentions: Sequence[torch.Tensor], num_prefix_tokens: int = 1, reg_tokens: int = 0
) -> HeadStats:
    """Diagnostics of one batch of captured attention.

    Args:
        attentions: one ``[B, H_l, N, N]`` post-softmax tensor per block.
        num_prefix_tokens: tokens before the patches (class, distillation and register tokens);
            ``cls_share`` is NaN when there is no class token (no prefix token but registers).
        reg_tokens: how many of the prefix tokens are registers: the last ``reg_tokens`` of them,
            as in :class:`~vitkit.models.VisionTransformer`; ``reg_share`` is NaN when 0.
    """
    if not 0 <= reg_tokens <= num_prefix_tokens:
        raise ValueError(f"reg_tokens ({reg_tokens}) must lie in [0, num_prefix_tokens={num_prefix_tokens}].")
    heads = [a.shape[1] for a in attentions]
    depth, width = len(attentions), max(heads)
    entropy, diagonal, cls_share, reg_share = (torch.full((depth, width), float("nan")) for _ in range(4))
    similarity = torch.full((depth, width, width), float("nan"))
    for layer, attention in enumerate(attentions):
        attention = attention.detach().float().cpu()
        h = attention.shape[1]
        entropy[layer, :h] = row_entropy(attention, normalize=True).mean(dim=(0, 2))
        diagonal[layer, :h] = attention.diagonal(dim1=-2, dim2=-1).mean(dim=(0, 2))
        if num_prefix_tokens > reg_tokens:  # the class token comes first
            cls_share[layer, :h] = attention[..., 0].mean(dim=(0, 2))
        if reg_tokens > 0:
            registers = attention[..., num_prefix_tokens - reg_tokens : num_prefix_tokens]
            reg_share[layer, :h] = registers.sum(dim=-1).mean(dim=(0, 2))
        similarity[layer, :h, :h] = _js_similarity(attention)
    return HeadStats(
        entropy=entropy,
        diagonal=diagonal,
        cls_share=cls_share,
        reg_share=reg_share,
        similarity=similarity,
        heads_per_layer=heads,
        num_images=attentions[0].shape[0],
    )


@torch.no_grad()
def model_head_stats(
    model: VisionTransformer, batches: Iterable[torch.Tensor], max_images: int | None = None
) -> HeadStats:
    """:func:`attention_statistics` of ``model`` averaged over image batches ``[B, C, H, W]``
    (at most ``max_images`` images). The model should be in eval mode."""
    parameter = next(model.parameters())
    stats: HeadStats | None = None
    seen = 0
    for images in batches:
        if max_images is not None:
            images = images[: max_images - seen]
        if len(images) == 0:
            break
        images = images.to(parameter.device, parameter.dtype)
        run = model.forward_intermediates(images, intermediates_only=True, return_attention=True)
        attentions = run.attentions if run.sources is None else [  # merged tokens back on the patches
            unmerge_attention(a, source) for a, source in zip(run.attentions, run.sources)
        ]
        batch_stats = attention_statistics(attentions, model.num_prefix_tokens, model.config.reg_tokens)
        stats = batch_stats if stats is None else stats.merge(batch_stats)
        seen += len(images)
        if max_images is not None and seen >= max_images:
            break
    if stats is None:
        raise ValueError("no images to compute head statistics on: the data iterable was empty.")
    return stats


@dataclass(frozen=True)
class HeadThresholds:
    """When a head is worth a warning (see the module docstring for the metrics).

    Attributes:
        uniform_entropy: normalised entropy at or above which a head is unfocused (0.9: the head
            spreads its attention almost evenly; random-init ViTs sit at 0.9-1.0).
        self_attention: mean weight on itself at or above which a head has a bright diagonal.
        cls_sink: mean weight on the class token at or above which it is an attention sink.
        collapse_similarity: JS similarity at or above which two heads are the same pattern.
            Heads already flagged as unfocused are left out (near-uniform heads are trivially
            alike).
    """

    uniform_entropy: float = 0.9
    self_attention: float = 0.5
    cls_sink: float = 0.5
    collapse_similarity: float = 0.9


def _heads_at_or_above(values: torch.Tensor, threshold: float) -> dict[int, list[int]]:
    """``{layer: [heads]}`` whose value is ``>= threshold`` (NaN never is)."""
    found: dict[int, list[int]] = {}
    for layer, head in (values >= threshold).nonzero().tolist():
        found.setdefault(layer, []).append(head)
    return found


def _collapsed_groups(similarity: torch.Tensor, threshold: float, skip: list[int]) -> list[list[int]]:
    """Connected groups of heads of one layer whose pairwise similarity reaches ``threshold``."""
    heads = [h for h in range(similarity.shape[0]) if not similarity[h, h].isnan() and h not in skip]
    groups: list[list[int]] = []
    for h in heads:
        linked = [g for g in groups if any(similarity[h, other] >= threshold for other in g)]
        merged = sorted({h}.union(*map(set, linked)))
        groups = [g for g in groups if g not in linked] + [merged]
    return sorted(g for g in groups if len(g) > 1)


def head_warnings(stats: HeadStats, thresholds: HeadThresholds = HeadThresholds()) -> list[str]:
    """Plain-language warnings naming the layers and heads concerned (empty when all is well)."""
    warnings: list[str] = []
    checks = [
        (stats.entropy, thresholds.uniform_entropy, "near-uniform, unfocused attention (entropy >= {t:.2f} of the "
         "maximum); expected before training, a problem after it (check masks, learning rate, training length)"),
        (stats.diagonal, thresholds.self_attention, "tokens attend mostly to themselves (diagonal share >= {t:.2f}): "
         "little is mixed between tokens"),
        (stats.cls_share, thresholds.cls_sink, "the class token draws most of the attention (share >= {t:.2f}): "
         "an attention sink; heads may be idle"),
    ]
    for values, threshold, message in checks:
        found = _heads_at_or_above(values, threshold)
        if found:
            where = "; ".join(f"layer {layer} heads {heads}" for layer, heads in sorted(found.items()))
            warnings.append(f"{where}: {message.format(t=threshold)}.")
    unfocused = _heads_at_or_above(stats.entropy, thresholds.uniform_entropy)
    for layer in range(len(stats.heads_per_layer)):
        skip = unfocused.get(layer, [])
        for group in _collapsed_groups(stats.similarity[layer], thresholds.collapse_similarity, skip):
            warnings.append(
                f"layer {layer}, heads {group}: these heads attend alike (JS similarity >= "
                f"{thresholds.collapse_similarity:.2f}): attention collapse, multi-head has degenerated; "
                "they are candidates for pruning."
            )
    return warnings
