"""The shipped recipes train what their names and docs/train.md promise."""

from __future__ import annotations

from pathlib import Path

import timm

from vitkit.models import VisionTransformer
from vitkit.train.config import load_recipe
from vitkit.train.pretraining import finetune_command

RECIPES = Path(__file__).parents[2] / "recipes"


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


def test_fashion_mnist_fast_recipe_is_the_plain_recipe_with_a_conv_stem_on_a_4x4_token_grid_and_mirrored_tests() -> None:
    plain, fast = load_recipe(RECIPES / "fashion_mnist.yaml"), load_recipe(RECIPES / "fashion_mnist_fast.yaml")
    vit = fast.vit_config(img_size=fast.data.resolved_img_size(), in_chans=1, num_classes=10)
    plain_vit = plain.vit_config(img_size=plain.data.resolved_img_size(), in_chans=1, num_classes=10)
    # 32 px through three stride-2 convolutions: a 4x4 grid, as many tokens as 7x7 patches of 28 px
    assert (vit.patch_embed, vit.grid_size, vit.num_tokens) == ("conv", (4, 4), plain_vit.num_tokens)
    assert vit.locality and not vit.shifted_patches and plain_vit.shifted_patches
    same = ("embed_dim", "depth", "num_heads", "mlp_ratio")
    assert [getattr(vit, key) for key in same] == [getattr(plain_vit, key) for key in same]
    assert (vit.drop_path_rate, plain_vit.drop_path_rate) == (0.0, 0.1)  # 20 epochs: no stochastic depth
    assert fast.optim == plain.optim and fast.data.augment == plain.data.augment
    # 20 epochs instead of 30, and mirrored test views (the recipe trains on mirrored images)
    assert fast.trainer.replace(max_epochs=30, tta="none") == plain.trainer and fast.trainer.tta == "hflip"
    assert fast.distill.type == "none"


def test_fashion_mnist_long_recipe_is_the_fast_recipe_deeper_longer_and_regularised() -> None:
    fast, long = load_recipe(RECIPES / "fashion_mnist_fast.yaml"), load_recipe(RECIPES / "fashion_mnist_long.yaml")
    vit = long.vit_config(img_size=long.data.resolved_img_size(), in_chans=1, num_classes=10)
    fast_vit = fast.vit_config(img_size=fast.data.resolved_img_size(), in_chans=1, num_classes=10)
    assert vit.replace(depth=4, drop_path_rate=0.0) == fast_vit and (vit.depth, vit.drop_path_rate) == (6, 0.1)
    assert long.data.augment.replace(random_erasing=0.0) == fast.data.augment and long.data.augment.random_erasing == 0.25
    assert long.optim.replace(warmup_epochs=1.0) == fast.optim and long.optim.warmup_epochs == 5.0
    assert long.trainer.replace(max_epochs=20) == fast.trainer and long.trainer.max_epochs == 100
    assert long.data.replace(augment=fast.data.augment) == fast.data and long.distill == fast.distill


def test_fashion_mnist_distilled_recipe_is_the_long_recipe_with_a_resnet10_teacher_and_stronger_erasing() -> None:
    long, distilled = load_recipe(RECIPES / "fashion_mnist_long.yaml"), load_recipe(RECIPES / "fashion_mnist_distilled.yaml")
    vit = distilled.vit_config(img_size=distilled.data.resolved_img_size(), in_chans=1, num_classes=10)
    long_vit = long.vit_config(img_size=long.data.resolved_img_size(), in_chans=1, num_classes=10)
    assert vit.replace(distilled=False) == long_vit and vit.distilled
    # hard distillation (alpha 0.5, the default) from a ResNet-10 twice as wide as the ablation's, trained first
    resnet10 = {"layers": [1, 1, 1, 1], "channels": [32, 64, 128, 256]}
    teacher = long.distill.teacher.replace(model="resnet18", model_kwargs=resnet10, small_input_stem=True, epochs=30)
    assert distilled.distill == long.distill.replace(type="hard", teacher=teacher) and long.distill.type == "none"
    assert (distilled.distill.alpha, distilled.distill.teacher.file) == (0.5, None)
    # Zhong et al.'s Fashion-MNIST erasing (arXiv 1708.04896): p = 0.5, area 0.02-0.4, random values
    erasing = {"random_erasing": 0.5, "erasing_area": (0.02, 0.4), "erasing_mode": "pixel"}
    assert distilled.data.augment == long.data.augment.replace(**erasing)
    assert distilled.optim == long.optim and distilled.data.replace(augment=long.data.augment) == long.data
    measured = {"seed": 1, "tta": "hflip_shift", "val_tta": "hflip"}
    assert distilled.trainer == long.trainer.replace(**measured)


def test_mae_fashion_mnist_pretrains_the_fast_recipes_encoder() -> None:
    """Same model keys as fashion_mnist_fast but linear patches (its conv stem would see hidden
    pixels), which the printed fine-tuning command sets, so fine-tuning reads the encoder; and MAE's
    own init and fixed sin-cos positions, which the encoder file carries into fine-tuning. The
    released encoder is the schedule's last, as MAE's paper releases it, and a time budget plans
    the epochs so that the schedule ends when training does."""
    mae, fast = load_recipe(RECIPES / "mae_fashion_mnist.yaml"), load_recipe(RECIPES / "fashion_mnist_fast.yaml")
    assert (fast.model.patch_embed, mae.model.patch_embed) == ("conv", "linear")
    assert mae.model == fast.model.replace(patch_embed="linear", init="mae", pos_embed="sincos")
    assert mae.data.name == fast.data.name and mae.data.img_size == fast.data.img_size
    assert (mae.task.name, mae.task.options.mask_ratio, mae.trainer.monitor) == ("mae", 0.75, "last")
    assert mae.trainer.time_budget_minutes == 15 and mae.trainer.max_time_minutes is None  # the schedule ends with the run


def test_mae_fashion_mnist_long_is_the_short_recipe_for_an_hour_with_a_k_nn_curve() -> None:
    short, long = load_recipe(RECIPES / "mae_fashion_mnist.yaml"), load_recipe(RECIPES / "mae_fashion_mnist_long.yaml")
    assert long.model == short.model and long.data == short.data and long.task.options == short.task.options
    assert long.optim == short.optim.replace(warmup_epochs=10)  # 5% of the epochs an hour holds, MAE's share
    assert long.trainer == short.trainer.replace(time_budget_minutes=60, max_epochs=200)
    assert (short.task.knn_every, long.task.knn_every) == (None, 10)


def test_dino_fashion_mnist_long_is_the_short_recipe_for_an_hour_with_a_k_nn_curve() -> None:
    short, long = load_recipe(RECIPES / "dino_fashion_mnist.yaml"), load_recipe(RECIPES / "dino_fashion_mnist_long.yaml")
    assert long.model == short.model and long.data == short.data
    assert long.task.options == short.task.options.replace(warmup_teacher_temp_epochs=9)  # DINO's 30 of 100 epochs
    assert long.optim == short.optim.replace(warmup_epochs=3)  # DINO's 10 of 100
    assert long.trainer == short.trainer.replace(time_budget_minutes=60, max_epochs=100)
    assert (short.task.knn_every, long.task.knn_every) == (None, 5)


def test_mae_imagefolder_takes_any_folder_without_labels() -> None:
    recipe = load_recipe(RECIPES / "mae_imagefolder.yaml")
    assert recipe.task.name == "mae" and recipe.data.name == "imagefolder" and not recipe.data.require_classes


def test_mae_fashion_mnists_finetuning_command_loads_with_the_encoders_tokenizer() -> None:
    mae = load_recipe(RECIPES / "mae_fashion_mnist.yaml")
    words = finetune_command(mae, Path("enc.safetensors"), depth=4).split()
    assert words[:3] == ["vitkit", "train", "fashion_mnist_fast"] and "model.patch_embed=linear" in words
    overrides = [word for word in words[3:] if not word.startswith("model.pretrained=")]
    finetuning = load_recipe(RECIPES / "fashion_mnist_fast.yaml", overrides).model.vit_overrides()
    encoder = mae.model.vit_overrides()
    assert {key: encoder[key] for key in finetuning} == finetuning  # no key contradicts the encoder's
    assert {"init", "pos_embed"} <= set(encoder) - set(finetuning)  # the weights give them
