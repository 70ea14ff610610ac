"""``merge_tokens(model, r)``: ToMe on any vitkit ViT, timm-imported ones included (Bolya et al.
2022, "Token Merging: Your ViT But Faster", https://arxiv.org/abs/2210.09461).

No training: each block merges ``r`` pairs of similar tokens between its attention and its MLP
(:mod:`vitkit.layers.token_merging`), so later blocks run on fewer tokens. The option is recorded
in the model's config (``merge_tokens``), which a model file keeps: a saved merged model loads
merged, and ``merge_tokens(model, 0)`` undoes it.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..layers.token_merging import Schedule, merge_schedule
from .vision_transformer import VisionTransformer


def merge_tokens(
    model: VisionTransformer, r: int | Sequence[int], schedule: Schedule = "constant", prop_attn: bool | None = None
) -> VisionTransformer:
    """Make ``model`` merge tokens (ToMe) in every forward; ``r = 0`` undoes it.

    Args:
        model: a vitkit ``VisionTransformer`` (vitkit's encoder blocks and self-attention).
        r: tokens each block merges: one count for every block, or one per block. A block merges
            at most half of its tokens other than the prefix tokens (class, distillation,
            registers), which never merge; later blocks are clamped to that, as ToMe does.
        schedule: with an int ``r``, ``"constant"`` or ToMe's ``"decreasing"`` schedule
            (``2r`` in the first block down to 0 in the last).
        prop_attn: ToMe's ``prop_attn``: ``True`` adds ``log(size)`` of every key to the attention
            scores, so a merged token counts as the patches it holds; ``False`` does not (the
            merged tokens are still size-weighted averages); ``None`` keeps the model's setting
            (``config.merge_prop_attn``, on unless set otherwise).

    Returns:
        ``model`` itself, changed in place.

    Raises:
        vitkit.schema.ConfigError: a negative ``r``, a list of another length than the depth,
            or more tokens than the first block can merge.
        ValueError: a model whose blocks are not vitkit's encoder block with its self-attention.
    """
    counts = r if schedule == "constant" else merge_schedule(r, len(model.blocks), schedule)
    model.set_token_merging(counts, prop_attn)
    return model
