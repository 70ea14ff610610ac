"""The shipped recipes train what their names and the README promise."""

from __future__ import annotations

from pathlib import Path

import timm

from vitkit.models import VisionTransformer
from vitkit.train.config import load_recipe

RECIPES = Path(__file__).parent.parent / "recipes"


def test_vit_small_recipe_trains_vit_s_at_patch_4_on_cifar10() -> None:
    config = load_recipe(RECIPES / "vit_small.yaml")
    assert config.data.name == "cifar10"
    vit = config.vit_config(img_size=32, in_chans=3, num_classes=10)
    assert (vit.embed_dim, vit.depth, vit.num_heads, tuple(vit.patch_size)) == (384, 12, 6, (4, 4))
    reference = timm.create_model("vit_small_patch16_224", pretrained=False, img_size=32, patch_size=4, num_classes=10)
    model = VisionTransformer(vit)
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in reference.parameters())
    assert model.pos_embed.shape[1] == 65  # 8 x 8 patches + the class token


def test_vit_cifar_small_recipe_is_vit_lite_7_4() -> None:
    vit = load_recipe(RECIPES / "vit_cifar_small.yaml").vit_config(img_size=32, in_chans=3, num_classes=10)
    assert (vit.embed_dim, vit.depth, vit.num_heads, tuple(vit.patch_size)) == (256, 7, 4, (4, 4))


def test_fashion_mnist_fast_recipe_is_the_plain_recipe_plus_distillation_and_random_erasing() -> None:
    plain, fast = load_recipe(RECIPES / "fashion_mnist.yaml"), load_recipe(RECIPES / "fashion_mnist_fast.yaml")
    assert fast.model.replace(distilled=None) == plain.model  # the same ViT, with a distillation token
    assert fast.model.distilled and plain.model.distilled is None
    assert (fast.distill.type, fast.distill.alpha, fast.distill.teacher.model) == ("hard", 0.5, "test_resnet")
    assert fast.data.augment.random_erasing == 0.25 and plain.data.augment.random_erasing == 0.0
    assert fast.optim == plain.optim and fast.trainer == plain.trainer
