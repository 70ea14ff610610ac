"""AttnLRP: equal to the authors' ``lxt`` (with ``zennit``'s gamma rule) on a torchvision twin of a
vitkit model, conservation (the relevances of image, embeddings and tokens add up to the logit when
the model has no biases), each rule's effect, and every architecture vitkit builds."""

from __future__ import annotations

import warnings

import pytest
import torch
from lxt_reference import lxt_relevance, torchvision_twin, twin_problem

import vitkit
from vitkit.explain import HeadlessModelError
from vitkit.explain.lrp import LRPRules, lrp_relevance, lrp_rules
from vitkit.prune.pruning import prune_heads

#: Parameters whose relevance, with the image's, makes up the logit of a bias-free model.
TOKEN_PARAMETERS = ("pos_embed", "cls_token", "reg_token", "dist_token")


def random_model(**options: object) -> vitkit.VisionTransformer:
    """A 3-block, 3-head ViT on 32x32 RGB images with 8x8 patches and weights large enough for
    every rule to matter (std 0.2), in eval mode."""
    torch.manual_seed(0)
    settings = dict(img_size=32, patch_size=8, embed_dim=48, depth=3, num_heads=3, num_classes=5)
    model = vitkit.create_model("vit_cifar_tiny", **{**settings, **options}).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "norm" not in name:
                parameter.normal_(0, 0.2)
    return model


@pytest.mark.parametrize(("linear_gamma", "patch_gamma"), [(0.0, 0.0), (0.05, 0.25), (1.0, 100.0)])
def test_relevance_equals_lxt_on_the_models_torchvision_twin(linear_gamma: float, patch_gamma: float) -> None:
    pytest.importorskip("lxt")
    # float64: the epsilon rule divides by outputs near 0, where float32's rounding (which differs
    # between CPU kinds) is amplified; in float64 what is left is the rules' own difference
    model = random_model().double()
    images = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    twin = torchvision_twin(model).double()
    # lxt's patch of torchvision's ViT holds the attention weights constant (CP-LRP)
    ours = lrp_relevance(model, images, rules=LRPRules("cp", linear_gamma=linear_gamma, patch_gamma=patch_gamma))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs, logits = lxt_relevance(twin, images, ours.targets, linear_gamma, patch_gamma)
    assert ours.pixels.dtype == ours.logits.dtype == torch.float64  # float64 stays float64
    torch.testing.assert_close(logits, ours.logits, atol=1e-12, rtol=1e-9)  # the twin is the same model
    scale = theirs.abs().amax(dim=(1, 2), keepdim=True)
    assert ((ours.pixels - theirs).abs() / scale).max() < 1e-9
    # lxt's patches are undone: the next model's LayerNorm is torch's again
    assert torch.nn.LayerNorm.forward.__module__ == "torch.nn.modules.normalization"


def test_a_grayscale_models_relevance_equals_lxt_on_its_three_channel_twin() -> None:
    pytest.importorskip("lxt")
    model = random_model(in_chans=1).double()
    images = torch.randn(3, 1, 32, 32, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    rules = LRPRules("cp", linear_gamma=0.25, patch_gamma=1.0)  # lxt's ViT patch holds the attention weights
    ours = lrp_relevance(model, images, rules=rules)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs, logits = lxt_relevance(torchvision_twin(model).double(), images, ours.targets, rules.linear_gamma,
                                       rules.patch_gamma)
    torch.testing.assert_close(logits, ours.logits, atol=1e-12, rtol=1e-9)
    assert ((ours.pixels - theirs).abs() / theirs.abs().amax(dim=(1, 2), keepdim=True)).max() < 1e-9
    assert twin_problem(random_model(locality=True)) == "torchvision's ViT has no LSA (locality)"


def source_relevance(model: vitkit.VisionTransformer, images: torch.Tensor, rules: LRPRules) -> tuple[torch.Tensor, torch.Tensor]:
    """``[B]`` relevance of the image plus the position embedding and prefix tokens, and ``[B]``
    target logits (each image alone, so the embeddings' relevance is its own)."""
    sources = [p for name, p in model.named_parameters() if name in TOKEN_PARAMETERS]
    totals, logits = [], []
    for image in images:
        x = image[None].clone().requires_grad_(True)
        with torch.enable_grad(), lrp_rules(model, rules):
            logit = model(x)[0].max()
            grads = torch.autograd.grad(logit, [x, *sources])
        totals.append(sum((tensor * grad).sum() for tensor, grad in zip([x, *sources], grads)))
        logits.append(logit.detach())
    return torch.stack(totals), torch.stack(logits)


@pytest.mark.parametrize("options", [{}, {"reg_tokens": 2}, {"distilled": True}, {"global_pool": "avg", "class_token": False},
                                     {"rope": "axial", "pos_embed": "none"}, {"qk_norm": True, "init_values": 0.1}])
def test_relevance_adds_up_to_the_logit_when_nothing_has_a_bias(options: dict) -> None:
    model = random_model(**options)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("bias"):
                parameter.zero_()
    images = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    for rules in (LRPRules("cp"), LRPRules("cp", linear_gamma=0.5, patch_gamma=2.0)):
        total, logit = source_relevance(model, images, rules)
        torch.testing.assert_close(total, logit, atol=1e-4, rtol=1e-4)
    # with biases, they take a share: the image and tokens alone no longer make up the logit
    biased = random_model(**options)
    total, logit = source_relevance(biased, images, LRPRules("cp"))
    assert (total - logit).abs().max() > 1e-2


def test_the_attention_rules_split_the_projection_gradient_as_stated_and_leave_no_hook() -> None:
    model = random_model()
    attention = model.blocks[0].attn
    tokens = torch.randn(1, 5, 48, requires_grad=True)
    rows = attention.qkv.weight.detach().view(3, -1, 48)  # the query, key and value projections
    for rule, shares in (("cp", (0.0, 0.0, 1.0)), ("attnlrp", (0.25, 0.25, 0.5))):
        with lrp_rules(model, LRPRules(attention=rule)):
            (gradient,) = torch.autograd.grad(attention.qkv(tokens).sum(), tokens)
        by_hand = sum(share * rows[part].sum(0) for part, share in enumerate(shares))
        torch.testing.assert_close(gradient[0, 0], by_hand, atol=1e-5, rtol=1e-5)
    (plain,) = torch.autograd.grad(attention.qkv(tokens).sum(), tokens)  # outside: an ordinary gradient
    torch.testing.assert_close(plain[0, 0], rows.sum((0, 1)), atol=1e-5, rtol=1e-5)
    images = torch.randn(2, 3, 32, 32)
    cp, attnlrp = (lrp_relevance(model, images, rules=LRPRules(attention=rule)).pixels for rule in ("cp", "attnlrp"))
    assert (cp - attnlrp).abs().max() > 1e-3 * cp.abs().max()


@pytest.mark.parametrize("options", [{"global_pool": "map", "class_token": False}, {"patch_embed": "conv"},
                                     {"shifted_patches": True, "locality": True}, {"act_layer": "quick_gelu"}])
def test_every_architecture_gets_finite_relevance_for_the_target_class(options: dict) -> None:
    model = random_model(**options)
    images = torch.randn(2, 3, 32, 32)
    result = lrp_relevance(model, images, target=torch.tensor([1, 3]))
    assert result.pixels.shape == (2, 32, 32) and torch.isfinite(result.pixels).all()
    assert result.targets.tolist() == [1, 3]
    other = lrp_relevance(model, images, target=torch.tensor([2, 0]))
    assert (result.pixels - other.pixels).abs().max() > 0  # the target is explained, not ignored
    assert result.per_patch((8, 8)).shape == (2, 4, 4)
    torch.testing.assert_close(result.per_patch((8, 8)).sum((1, 2)), result.pixels.sum((1, 2)))


def test_pruned_layers_and_headless_models() -> None:
    model = random_model()
    model = prune_heads(model, {0: [0, 1, 2], 1: [1]})
    result = lrp_relevance(model, torch.randn(2, 3, 32, 32))
    assert torch.isfinite(result.pixels).all() and result.pixels.abs().sum() > 0
    with pytest.raises(HeadlessModelError, match="no classifier"):
        lrp_relevance(random_model(num_classes=0), torch.randn(1, 3, 32, 32))


@pytest.mark.parametrize("name", ["deit_small_distilled_patch16_224", "vit_base_patch16_siglip_224",
                                  "vit_small_patch14_reg4_dinov2", "vit_small_patch16_rope_mixed_224",
                                  "vit_base_patch16_clip_quickgelu_224"])
def test_imported_timm_families_conserve_the_logit_without_biases(name: str) -> None:
    timm = pytest.importorskip("timm")
    torch.manual_seed(0)
    source = timm.create_model(name, pretrained=False, depth=2, img_size=28 if "dinov2" in name else 32,
                               num_classes=4).eval()
    model = vitkit.from_timm(source).eval()
    with torch.no_grad():
        for parameter_name, parameter in model.named_parameters():
            if parameter_name.endswith("bias"):
                parameter.zero_()
            elif "norm" not in parameter_name:
                parameter.add_(0.1 * torch.randn_like(parameter))
    size = model.config.img_size[0]
    images = torch.randn(2, 3, size, size)
    total, logit = source_relevance(model, images, LRPRules("cp"))
    torch.testing.assert_close(total, logit, atol=1e-4, rtol=1e-4)
