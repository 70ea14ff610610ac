"""Maps read out as the classifier pools, blocks whose heads were all pruned, and Chefer et al.
relevance, each against a reference written out here with plain loops."""

from __future__ import annotations

import pytest
import torch

import vitkit
from vitkit.explain import (
    attention_rollout,
    capture_attention,
    chefer_relevance,
    explain,
    grad_rollout,
    maps_from_capture,
    per_head_maps,
)


def random_attention(batch: int, heads: int, tokens: int) -> torch.Tensor:
    return torch.rand(batch, heads, tokens, tokens).softmax(dim=-1)


def reference_rollout(attentions: list[torch.Tensor], prefix: int, pooling: str) -> torch.Tensor:
    """Abnar & Zuidema's rollout with mean fusion, one image at a time, then the pooled rows."""
    maps = []
    for b in range(attentions[0].shape[0]):
        n = attentions[0].shape[-1]
        joint = torch.eye(n)
        for attention in attentions:
            if attention.shape[1] == 0:
                layer = torch.eye(n)
            else:
                mixed = (attention[b].mean(0) + torch.eye(n)) / 2
                layer = mixed / mixed.sum(-1, keepdim=True)
            joint = layer @ joint
        row = joint[0] if pooling == "token" else joint[prefix:].mean(0)
        patches = row[prefix:]
        maps.append(patches / patches.max())
    return torch.stack(maps)


@pytest.mark.parametrize(("prefix", "pooling"), [(1, "token"), (1, "avg"), (0, "avg")])
def test_rollout_reads_out_what_the_classifier_pools(prefix: int, pooling: str) -> None:
    attentions = [random_attention(2, 3, 5 + prefix) for _ in range(3)]
    expected = reference_rollout(attentions, prefix, pooling)
    torch.testing.assert_close(attention_rollout(attentions, num_prefix_tokens=prefix, pooling=pooling), expected)


def test_avg_pooled_read_out_differs_from_the_class_token_row() -> None:
    attentions = [random_attention(1, 2, 6) for _ in range(2)]
    token = attention_rollout(attentions, num_prefix_tokens=1, pooling="token")
    avg = attention_rollout(attentions, num_prefix_tokens=1, pooling="avg")
    assert (token - avg).abs().max() > 1e-3


def test_per_head_maps_average_the_patch_rows_for_avg_pooling() -> None:
    attention = random_attention(2, 3, 6)
    maps = per_head_maps([attention], layer=0, num_prefix_tokens=1, pooling="avg")
    expected = torch.stack([attention[:, h, 1:, 1:].mean(dim=1) for h in range(3)], dim=1)
    torch.testing.assert_close(maps, expected)
    torch.testing.assert_close(per_head_maps([attention], 0, 1, "token"), attention[:, :, 0, 1:])


def test_token_pooling_without_class_token_is_refused() -> None:
    with pytest.raises(ValueError, match="token pooling needs a class token"):
        attention_rollout([random_attention(1, 1, 4)], num_prefix_tokens=0, pooling="token")


def avg_model(class_token: bool) -> vitkit.VisionTransformer:
    return vitkit.VisionTransformer(img_size=16, patch_size=4, in_chans=3, num_classes=5, embed_dim=32, depth=3,
                                    num_heads=2, global_pool="avg", class_token=class_token).eval()


@pytest.mark.parametrize("class_token", [True, False])
def test_capture_records_pooling_and_maps_follow_it(class_token: bool) -> None:
    model = avg_model(class_token)
    images = torch.randn(2, 3, 16, 16)
    capture = capture_attention(model, images, with_gradients=True)
    assert capture.pooling == "avg"
    prefix = 1 if class_token else 0
    expected = reference_rollout(capture.attentions, prefix, "avg")
    rollout = maps_from_capture(capture, "rollout")
    torch.testing.assert_close(rollout, maps_from_capture(capture, "rollout"))
    from vitkit.explain import to_image_grid

    torch.testing.assert_close(rollout, to_image_grid(expected, capture.grid, capture.image_size))


def test_avg_pooled_class_token_row_gets_no_gradient_but_patch_rows_do() -> None:
    # The reason for the pooled read-out: the last block's class-token row never reaches the logits.
    capture = capture_attention(avg_model(True), torch.randn(2, 3, 16, 16), with_gradients=True)
    last = capture.gradients[-1]
    assert last[:, :, 0].abs().max() == 0 and last[:, :, 1:].abs().max() > 0


def chefer_reference(attentions: list[torch.Tensor], gradients: list[torch.Tensor], prefix: int, pooling: str):
    """Chefer et al. 2021 Eq. 5-6, one image at a time: R += mean_h(relu(G*A)) @ R."""
    maps = []
    for b in range(attentions[0].shape[0]):
        n = attentions[0].shape[-1]
        relevance = torch.eye(n)
        for attention, gradient in zip(attentions, gradients):
            if attention.shape[1] == 0:
                continue
            cam = torch.stack([torch.relu(gradient[b, h] * attention[b, h]) for h in range(attention.shape[1])]).mean(0)
            relevance = relevance + cam @ relevance
        row = relevance[0] if pooling == "token" else relevance[prefix:].mean(0)
        maps.append(row[prefix:] / row[prefix:].max())
    return torch.stack(maps)


@pytest.mark.parametrize(("prefix", "pooling"), [(1, "token"), (1, "avg"), (0, "avg")])
def test_chefer_relevance_matches_the_papers_rule(prefix: int, pooling: str) -> None:
    attentions = [random_attention(2, 3, 4 + prefix) for _ in range(3)]
    gradients = [torch.randn_like(a) for a in attentions]
    torch.testing.assert_close(
        chefer_relevance(attentions, gradients, prefix, pooling), chefer_reference(attentions, gradients, prefix, pooling)
    )


def test_two_heads_of_opposite_sign_cancel_in_grad_rollout_but_not_in_chefer() -> None:
    # Head 0 raises the logit through token 2, head 1 lowers it by as much: vit-explain's head mean
    # before the ReLU cancels them, Chefer's ReLU before the mean keeps head 0's evidence.
    attention = torch.full((1, 2, 3, 3), 1 / 3)
    gradient = torch.zeros(1, 2, 3, 3)
    gradient[0, 0, 0, 2], gradient[0, 1, 0, 2] = 3.0, -3.0
    grad_map = grad_rollout([attention], [gradient], num_prefix_tokens=1)
    chefer_map = chefer_relevance([attention], [gradient], num_prefix_tokens=1)
    assert grad_map[0, 1] == grad_map[0, 0] == 0  # nothing but the identity: no patch has mass
    assert chefer_map[0, 1] == 1.0 and chefer_map[0, 0] == 0.0  # token 2 is the evidence


def pruned_model(all_heads_of: int) -> vitkit.VisionTransformer:
    model = vitkit.VisionTransformer(img_size=16, patch_size=4, in_chans=3, num_classes=5, embed_dim=32, depth=3,
                                     num_heads=2).eval()
    model.blocks[all_heads_of].attn.prune_heads([0, 1])
    model.blocks[(all_heads_of + 1) % 3].attn.prune_heads([1])
    return model


@pytest.mark.parametrize("method", ["rollout", "grad_rollout", "chefer"])
def test_a_block_without_heads_is_the_identity(method: str) -> None:
    model = pruned_model(all_heads_of=1)
    images = torch.randn(2, 3, 16, 16)
    capture = capture_attention(model, images, with_gradients=True)
    assert capture.attentions[1].shape[1] == 0
    maps = maps_from_capture(capture, method)
    assert torch.isfinite(maps).all() and maps.amax(dim=(1, 2)).min() > 0
    kept = [capture.attentions[0], capture.attentions[2]]
    if method == "rollout":
        expected = attention_rollout(kept)
    elif method == "grad_rollout":
        expected = grad_rollout(kept, [capture.gradients[0], capture.gradients[2]])
    else:
        expected = chefer_relevance(kept, [capture.gradients[0], capture.gradients[2]])
    from vitkit.explain import to_image_grid

    torch.testing.assert_close(maps, to_image_grid(expected, capture.grid, capture.image_size))


@pytest.mark.parametrize("fusion", ["mean", "max", "min"])
def test_every_head_fusion_handles_an_empty_block(fusion: str) -> None:
    model = pruned_model(all_heads_of=0)
    maps = explain(model, torch.randn(1, 3, 16, 16), "rollout", head_fusion=fusion)
    assert torch.isfinite(maps).all()


def test_heads_of_an_empty_block_say_so() -> None:
    model = pruned_model(all_heads_of=2)
    with pytest.raises(ValueError, match="block 2 has no heads left"):
        explain(model, torch.randn(1, 3, 16, 16), "heads", layer=-1)
    assert explain(model, torch.randn(1, 3, 16, 16), "heads", layer=0).shape == (1, 1, 16, 16)


@pytest.mark.parametrize("pool", ["token", "avg"])
@pytest.mark.parametrize("method", ["rollout", "grad_rollout", "chefer"])
def test_a_model_without_any_head_gives_finite_maps(method: str, pool: str) -> None:
    model = vitkit.VisionTransformer(img_size=16, patch_size=4, in_chans=3, num_classes=5, embed_dim=32, depth=2,
                                     num_heads=2, global_pool=pool).eval()
    for block in model.blocks:
        block.attn.prune_heads([0, 1])
    maps = explain(model, torch.randn(2, 3, 16, 16), method)
    assert torch.isfinite(maps).all()
    # Only residual paths remain: token pooling reads the class token's own row (no patch mass),
    # average pooling the patch rows of the identity (uniform).
    expected = 0.0 if pool == "token" else 1.0
    torch.testing.assert_close(maps, torch.full_like(maps, expected))
