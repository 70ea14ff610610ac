"""Token merging through the block contract: a registered block whose forward takes ``merge`` merges
tokens (checked against ToMe's merge and attention written out in ``tome_reference``), the attention
returns its keys on request, a single image merges as ToMe merges it and as it merges in a batch,
gradient checkpointing recomputes the same merges, and a block or an attention that cannot merge is
refused in one line."""

from __future__ import annotations

from typing import Any

import pytest
import timm
import torch
from tome_reference import ToMeAttention, tome_apply_patch, tome_bipartite_soft_matching, tome_merge_wavg

import vitkit
from vitkit.errors import UnsupportedModelError
from vitkit.layers import EncoderBlock, MultiHeadSelfAttention, register_attention, register_block
from vitkit.layers.positions import TokenPositions


@register_block("test_merging_post_norm")
class MergingPostNormBlock(EncoderBlock):
    """The original Transformer's post-norm order, merging between its branches:
    ``LN(x + Attn(x))``, the merge on the attention's keys, then ``LN(x + MLP(x))``."""

    def forward(self, x, *, attn_bias=None, positions=None, head_gates=None, need_weights=False, merge=None):  # noqa: ANN001, ANN201
        attended, weights, keys = self.attn(x, attn_bias=attn_bias, positions=positions, head_gates=head_gates,
                                            need_weights=need_weights, need_keys=True)
        x = self.norm1(x + attended)
        if merge is not None:
            x = merge(x, keys)
        x = self.norm2(x + self.mlp(x))
        return (x, weights) if need_weights else x


@register_block("test_post_norm_without_merge")
class PostNormBlockWithoutMerge(EncoderBlock):
    """A post-norm block written before token merging: its forward takes no ``merge``."""

    def forward(self, x, *, attn_bias=None, positions=None, head_gates=None, need_weights=False):  # noqa: ANN001, ANN201
        attended = self.attn(x, attn_bias=attn_bias, positions=positions, head_gates=head_gates)
        x = self.norm1(x + attended)
        return self.norm2(x + self.mlp(x))


@register_attention("test_attention_without_keys")
class AttentionWithoutKeys(MultiHeadSelfAttention):
    """An attention whose own forward cannot return its keys."""

    def forward(self, x, *, attn_bias=None, positions=None, head_gates=None, need_weights=False):  # noqa: ANN001, ANN201
        return super().forward(x, attn_bias=attn_bias, positions=positions, head_gates=head_gates, need_weights=need_weights)


SMALL: dict[str, Any] = dict(img_size=16, patch_size=4, embed_dim=32, depth=3, num_heads=4, num_classes=5, mlp_ratio=2.0)


def small(**changes: Any) -> vitkit.VisionTransformer:
    model = vitkit.VisionTransformer(**{**SMALL, **changes}).eval()
    with torch.no_grad():  # prefix tokens and positions away from their near-zero init
        for name, parameter in model.named_parameters():
            if name in ("cls_token", "reg_token", "pos_embed"):
                parameter.normal_(0, 1)
    return model


def images(batch: int = 2, size: int = 16) -> torch.Tensor:
    return torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(3))


def tome_post_norm_logits(model: vitkit.VisionTransformer, pixels: torch.Tensor, r: int) -> torch.Tensor:
    """The post-norm blocks run by hand with ToMe's own attention (``ToMeAttention.forward`` on each
    block's attention weights, whose qkv layout is timm's), matching and size-weighted merge."""
    x, _ = model.embed(pixels)
    size = None
    for block in model.blocks:
        attended, metric = ToMeAttention.forward(block.attn, x, size)
        x = block.norm1(x + attended)
        merge, _ = tome_bipartite_soft_matching(metric, r, class_token=True)
        x, size = tome_merge_wavg(merge, x, size)
        x = block.norm2(x + block.mlp(x))
    return model.forward_head(model.norm(x))


def test_a_registered_custom_block_merges_tokens_as_tome_would_between_its_branches() -> None:
    model = small(block="test_merging_post_norm")
    with torch.no_grad():
        plain = model(images())
        vitkit.merge_tokens(model, 3)
        merged, features = model(images()), model.forward_features(images())
        reference = tome_post_norm_logits(model, images(), 3)
    assert (plain - reference).abs().max() > 1e-3  # merging changed the logits
    torch.testing.assert_close(merged, reference, rtol=0, atol=1e-5)
    assert features.shape[1] == 17 - 3 * 3


def test_a_block_or_an_attention_that_cannot_merge_is_refused_in_one_line() -> None:
    for changes, message in (({"block": "test_post_norm_without_merge"}, r"PostNormBlockWithoutMerge.forward takes no merge="),
                             ({"attn_layer": "test_attention_without_keys"}, r"AttentionWithoutKeys.forward takes no need_keys=")):
        model = small(**changes)
        with pytest.raises(UnsupportedModelError, match=message) as refused:
            vitkit.merge_tokens(model, 2)
        assert "\n" not in str(refused.value) and model.merge_schedule == []
        vitkit.merge_tokens(model, 0)  # no merging asks nothing of the blocks


def test_the_attention_returns_its_normed_keys_averaged_over_the_heads_before_rope() -> None:
    attn = MultiHeadSelfAttention(32, 4, qk_norm=True, rope="axial").eval()
    with torch.no_grad():
        attn.k_norm.weight.normal_(1, 0.5)  # a key norm that is not the identity's
    x = torch.randn(2, 17, 32)
    positions = TokenPositions.of_grid((4, 4), 1)
    with torch.no_grad():
        out, weights, keys = attn(x, positions=positions, need_keys=True)
        keys_by_hand = attn.k_norm(attn.qkv(x)[..., 32:64].unflatten(-1, (4, 8))).mean(dim=2)  # qkv rows: q, k, v
        torch.testing.assert_close(keys, keys_by_hand)
        torch.testing.assert_close(out, attn(x, positions=positions))
        assert weights is None
        _, weights, _ = attn(x, positions=positions, need_weights=True, need_keys=True)
    assert weights.shape == (2, 4, 17, 17)
    attn.prune_heads(range(4))
    assert attn(x, positions=positions, need_keys=True)[2] is x  # no heads: the tokens match on themselves


def test_a_single_image_merges_as_tome_merges_it_and_as_it_does_in_a_batch() -> None:
    source = timm.create_model("test_vit", pretrained=False).eval()
    with torch.no_grad():
        source.cls_token.normal_(0, 0.5)
        source.pos_embed.normal_(0, 0.5)
    model = vitkit.merge_tokens(vitkit.from_timm(source).eval(), 8)
    batch = images(3, 160)
    with torch.no_grad():
        together = model(batch)
        for index in range(3):
            alone = model(batch[index : index + 1])
            torch.testing.assert_close(alone, together[index : index + 1], rtol=0, atol=1e-5)
            torch.testing.assert_close(alone, tome_apply_patch(source, 8)(batch[index : index + 1]), rtol=0, atol=1e-4)


def test_checkpointed_blocks_recompute_the_same_merges_and_gradients() -> None:
    model = vitkit.merge_tokens(small(rope="axial", reg_tokens=2), [4, 3, 2]).train()
    grads = []
    for checkpointing in (False, True):
        model.set_grad_checkpointing(checkpointing)
        model.zero_grad()
        model(images()).square().sum().backward()
        grads.append({name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys() and "blocks.0.attn.qkv.weight" in grads[0]
    for name, grad in grads[0].items():
        torch.testing.assert_close(grads[1][name], grad, msg=name)
