"""The convolutional stem (``patch_embed: conv``, Xiao et al. 2021, arXiv 2106.14881) against the
stem written out with torch's functional ops, in models, recipes and training."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from vitkit.layers import ConvPatchEmbed, PatchEmbed
from vitkit.models import VisionTransformer, ViTConfig, timm_twin
from vitkit.train import RecipeError, load_recipe

TINY = dict(img_size=28, in_chans=1, patch_size=4, num_classes=10, embed_dim=32, depth=1, num_heads=2, mlp_ratio=2.0)


def stem_reference(stem: ConvPatchEmbed, images: torch.Tensor) -> torch.Tensor:
    """Xiao et al.'s stem by hand: (3x3 stride-2 conv, BatchNorm, ReLU) per level, a 1x1 conv,
    then the ``[B, D, h, w]`` map read row-major as ``[B, h*w, D]`` tokens."""
    x = images
    for level in stem.stem:
        bn = level.bn
        x = F.conv2d(x, level.conv.weight, None, stride=2, padding=1)
        x = F.batch_norm(x, bn.running_mean, bn.running_var, bn.weight, bn.bias, training=False, eps=bn.eps)
        x = F.relu(x)
    x = F.conv2d(x, stem.proj.weight, stem.proj.bias)
    return x.flatten(2).transpose(1, 2)


def test_conv_stem_is_log2_p_stride_2_convs_then_a_1x1_and_matches_the_formula() -> None:
    stem = ConvPatchEmbed(4, 1, 32).eval()
    convs = [level.conv for level in stem.stem]
    assert [(c.in_channels, c.out_channels, c.kernel_size, c.stride) for c in convs] == [
        (1, 16, (3, 3), (2, 2)), (16, 32, (3, 3), (2, 2))
    ]  # widths double up to embed_dim at the last 3x3
    assert all(isinstance(level.bn, nn.BatchNorm2d) for level in stem.stem)
    assert (stem.proj.kernel_size, stem.proj.out_channels) == ((1, 1), 32)
    with torch.no_grad():  # non-trivial BatchNorm statistics, so eval-mode BN really is applied
        for level in stem.stem:
            level.bn.running_mean.uniform_(-0.5, 0.5)
            level.bn.running_var.uniform_(0.5, 2.0)
    images = torch.randn(3, 1, 28, 28)
    tokens = stem(images)
    assert tokens.shape == (3, 7 * 7, 32) and stem.grid_size(28, 28) == (7, 7)
    torch.testing.assert_close(tokens, stem_reference(stem, images), atol=1e-5, rtol=1e-5)
    assert len(ConvPatchEmbed(16, 3, 192).stem) == 4  # ViT_C-1GF: four stride-2 convs for 16x16 patches


@pytest.mark.parametrize("patch", [1, 6, (4, 2)])
def test_conv_stem_refuses_a_patch_size_stride_2_convs_cannot_reach(patch: int | tuple[int, int]) -> None:
    with pytest.raises(ValueError, match="power of two"):
        ConvPatchEmbed(patch, 1, 32)
    patch_size = patch if isinstance(patch, tuple) else (patch, patch)
    with pytest.raises(ValueError, match="must be a square power of two"):
        ViTConfig(**{**TINY, "img_size": 24, "patch_size": patch_size}, patch_embed="conv").validate()


def test_patch_embed_option_builds_the_conv_stem_and_linear_stays_the_default() -> None:
    assert ViTConfig().patch_embed == "linear"
    torch.manual_seed(0)
    linear = VisionTransformer(ViTConfig(**TINY))
    torch.manual_seed(0)
    conv = VisionTransformer(ViTConfig(**TINY, patch_embed="conv"))
    assert type(linear.patch_embed) is PatchEmbed and type(conv.patch_embed) is ConvPatchEmbed
    assert any(key.startswith("patch_embed.stem.0.bn.") for key in conv.state_dict())
    images = torch.randn(2, 1, 28, 28)
    assert conv(images).shape == linear(images).shape == (2, 10)
    intermediates = conv.forward_intermediates(images, indices=1)
    assert intermediates.intermediates[0].shape == (2, 32, 7, 7)  # the same 7x7 grid as 4x4 patches


def test_conv_stem_model_trains_a_step_through_the_stem() -> None:
    model = VisionTransformer(ViTConfig(**TINY, patch_embed="conv")).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    images, targets = torch.randn(8, 1, 28, 28), torch.randint(0, 10, (8,))
    first = model.patch_embed.stem[0].conv.weight.detach().clone()
    losses = []
    for _ in range(3):
        loss = F.cross_entropy(model(images), targets)
        optimizer.zero_grad()
        loss.backward()
        assert model.patch_embed.stem[0].conv.weight.grad.abs().sum() > 0
        optimizer.step()
        losses.append(loss.item())
    assert not torch.equal(first, model.patch_embed.stem[0].conv.weight)
    assert losses[-1] < losses[0]
    assert model.patch_embed.stem[0].bn.num_batches_tracked == 3  # BatchNorm ran in training mode


def test_conv_stem_has_no_timm_twin_and_does_not_combine_with_shifted_patches() -> None:
    with pytest.raises(ValueError, match="convolutional stem"):
        timm_twin(ViTConfig(**TINY, patch_embed="conv"))
    with pytest.raises(ValueError, match="choose one"):
        ViTConfig(**TINY, patch_embed="conv", shifted_patches=True).validate()


def test_recipe_key_model_patch_embed_reaches_the_model_and_timm_reference_is_refused() -> None:
    with pytest.raises(RecipeError, match=r"model.patch_size in a command-line override must be a square power of two"):
        load_recipe("recipes/fashion_mnist.yaml", ["model.patch_embed=conv", "model.patch_size=14",
                                                  "model.shifted_patches=false"])
    config = load_recipe("recipes/fashion_mnist.yaml", ["model.patch_embed=conv", "model.patch_size=4",
                                                       "model.shifted_patches=false"])
    vit = config.vit_config(img_size=(28, 28), in_chans=1)
    assert vit.patch_embed == "conv"
    with pytest.raises(RecipeError, match="also set model.patch_embed=linear"):
        load_recipe("recipes/fashion_mnist.yaml", ["model.impl=timm", "model.patch_embed=conv", "model.patch_size=4",
                                                  "model.shifted_patches=false", "model.locality=false"])
