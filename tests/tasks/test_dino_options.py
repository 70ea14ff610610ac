"""DINO's recipe section (``vitkit.tasks.dino_options``): the scale ranges, the crop sizes a model
takes and the parameter limit, each refusal's key and sentence checked word for word, and each
limit at its boundary with the weights counted here from DINO's head (Caron et al. 2021, arXiv
2104.14294: an MLP in -> hidden -> ... -> bottleneck, then a weight-normalised bottleneck -> out)."""

from __future__ import annotations

import pytest

from vitkit.models import ViTConfig
from vitkit.models.config import MAX_PARAMETERS
from vitkit.schema import FieldError
from vitkit.tasks.dino_options import DinoOptions


def model(**changes: object) -> ViTConfig:
    fields = dict(img_size=8, patch_size=2, in_chans=1, num_classes=0, embed_dim=16, depth=1, num_heads=2)
    return ViTConfig(**{**fields, **changes})


def refusal(options: DinoOptions, config: ViTConfig) -> str:
    with pytest.raises(FieldError) as caught:
        options.check_model(config)
    return str(caught.value)


def test_a_scale_range_may_be_one_value_but_not_reversed() -> None:
    assert DinoOptions(global_scale=(0.5, 0.5)).global_scale == (0.5, 0.5)
    with pytest.raises(FieldError) as caught:
        DinoOptions(local_scale=(0.3, 0.2))
    assert str(caught.value) == "local_scale must be a range (low, high) with low <= high, got (0.3, 0.2)."


def test_the_global_crop_defaults_to_the_images_height_and_local_crops_count_only_when_asked() -> None:
    wide = model(img_size=(8, 16), dynamic_img_size=True)
    assert DinoOptions(local_crops=0).crop_sizes(wide) == {"global_size": 8}
    assert DinoOptions(local_crops=2, local_size=4).crop_sizes(wide) == {"global_size": 8, "local_size": 4}
    DinoOptions(local_crops=0, local_size=3).check_model(model())  # a local size never used is not checked


def test_crop_refusals_name_the_key_and_the_fix() -> None:
    assert refusal(DinoOptions(local_crops=2, local_size=5), model(dynamic_img_size=True)) == (
        "task.dino.local_size is 5, not a multiple of the model's patch size 2.")
    assert refusal(DinoOptions(local_crops=0, global_size=16), model()) == (
        "task.dino.global_size is 16, not the model's img_size 8: set model.dynamic_img_size=true (the position "
        "embedding is resampled to each crop's grid).")
    DinoOptions(local_crops=0, global_size=8).check_model(model())  # its own size needs no dynamic_img_size


def test_crop_refusals_name_a_non_square_patch_or_image_by_both_sides() -> None:
    """6 is a multiple of a 2 x 4 patch's height, not of its width; 8 is the height of an 8 x 16
    image, not its size: a refusal naming one side would contradict itself."""
    assert refusal(DinoOptions(local_crops=2, local_size=6), model(patch_size=(2, 4), dynamic_img_size=True)) == (
        "task.dino.local_size is 6, not a multiple of the model's patch size 2x4.")
    assert refusal(DinoOptions(local_crops=0, global_size=8), model(img_size=(8, 16))).startswith(
        "task.dino.global_size is 8, not the model's img_size 8x16: set model.dynamic_img_size=true")


def test_the_token_limit_counts_both_sides_of_a_non_square_patch() -> None:
    """A 728-pixel crop in 2 x 4 patches is 364 * 182 = 66,248 patches, past 65,536; 720 is 64,800."""
    tall = model(patch_size=(2, 4), dynamic_img_size=True)
    assert refusal(DinoOptions(local_crops=0, global_size=728), tall).startswith(
        "task.dino.global_size is 728: 66,248 patches of 2x4 pixels, more than the limit of 65,536")
    DinoOptions(local_crops=0, global_size=720).check_model(tall)


def head_weights_by_hand(in_dim: int, hidden: int, bottleneck: int, out: int, layers: int) -> int:
    widths = [in_dim] + [hidden] * (layers - 1) + [bottleneck]
    return sum((a + 1) * b for a, b in zip(widths, widths[1:])) + (bottleneck + 1) * out


def test_the_parameter_limit_holds_at_twice_the_head_and_backbone_and_names_the_bigger_option() -> None:
    config = model(dynamic_img_size=True)
    backbone = config.num_weights()  # the backbone as the limit counts it (matrices and embeddings)
    # one layer, bottleneck b: head = 17 b + (b + 1) out; out chosen so student + teacher weigh exactly the limit
    bottleneck = next(b for b in range(1907, 6976) if (MAX_PARAMETERS // 2 - backbone - 17 * b) % (b + 1) == 0)
    out = (MAX_PARAMETERS // 2 - backbone - 17 * bottleneck) // (bottleneck + 1)
    at_limit = dict(local_crops=0, head_layers=1, hidden_dim=1, bottleneck_dim=bottleneck)
    assert 2 * (head_weights_by_hand(16, 1, bottleneck, out, 1) + backbone) == MAX_PARAMETERS
    DinoOptions(out_dim=out, **at_limit).check_model(config)
    assert refusal(DinoOptions(out_dim=out + 1, **at_limit), config).startswith(f"task.dino.out_dim is {out + 1} ")
    # two layers, hidden 65536, bottleneck 25574, out 65578: the last layer's weights are exactly half
    # the head's, so hidden_dim is named; one more output and out_dim is
    hidden, bottleneck, out = 65536, 25574, 65578
    last = (bottleneck + 1) * out
    assert 2 * last == head_weights_by_hand(16, hidden, bottleneck, out, 2)
    big = dict(local_crops=0, head_layers=2, hidden_dim=hidden, bottleneck_dim=bottleneck)
    message = refusal(DinoOptions(out_dim=out, **big), config)
    assert message.startswith(f"task.dino.hidden_dim is {hidden} (out_dim {out}, hidden_dim {hidden}, bottleneck_dim "
                              f"{bottleneck}, head_layers 2): a head of about ")
    assert message.endswith("shrink the head (DINO's is 2048 hidden, 256 bottleneck, 3 layers).")
    assert refusal(DinoOptions(out_dim=out + 1, **big), config).startswith(f"task.dino.out_dim is {out + 1} ")
