"""The maps of a distilled model (DeiT) explain what it predicts: the mean of the class and
distillation tokens' rows, as its prediction is the mean of the two heads' logits; the class
token alone stays available as ``pooling='token'``."""

from __future__ import annotations

import pytest
import torch

from vitkit.explain import explain, read_out
from vitkit.explain.maps import capture_attention, maps_from_capture
from vitkit.explain.rollout import per_head_maps
from vitkit.models import VisionTransformer, ViTConfig


def test_distilled_read_out_averages_the_class_and_distillation_rows_by_hand() -> None:
    # 2 prefix tokens (class, distillation) and 3 patches
    joint = torch.tensor([[
        [0.5, 0.1, 0.1, 0.2, 0.1],
        [0.1, 0.3, 0.0, 0.2, 0.4],
        [0.2, 0.2, 0.2, 0.2, 0.2],
        [0.2, 0.2, 0.2, 0.2, 0.2],
        [0.2, 0.2, 0.2, 0.2, 0.2],
    ]])
    # patch columns of the two rows: [0.1, 0.2, 0.1] and [0.0, 0.2, 0.4]; mean [0.05, 0.2, 0.25]; / max 0.25
    torch.testing.assert_close(read_out(joint, 2, "distilled"), torch.tensor([[0.2, 0.8, 1.0]]))
    torch.testing.assert_close(read_out(joint, 2, "token"), torch.tensor([[0.5, 1.0, 0.5]]))
    with pytest.raises(ValueError, match="distillation"):
        read_out(joint, 1, "distilled")


def test_per_head_maps_of_a_distilled_read_out_average_both_rows() -> None:
    attention = torch.rand(1, 2, 5, 5)
    maps = per_head_maps([attention], -1, num_prefix_tokens=2, pooling="distilled")
    torch.testing.assert_close(maps, (attention[:, :, 0, 2:] + attention[:, :, 1, 2:]) / 2)


def test_a_distilled_models_maps_read_both_tokens_by_default_and_the_class_token_by_name() -> None:
    torch.manual_seed(0)
    model = VisionTransformer(ViTConfig(img_size=(16, 16), patch_size=(4, 4), embed_dim=32, depth=2, num_heads=4,
                                        num_classes=3, distilled=True)).eval()
    images = torch.randn(2, 3, 16, 16)
    capture = capture_attention(model, images)
    assert capture.pooling == "distilled"
    both, token = maps_from_capture(capture, "heads"), maps_from_capture(capture, "heads", pooling="token")
    assert not torch.allclose(both, token)
    torch.testing.assert_close(explain(model, images, "heads", pooling="token"), token)
    torch.testing.assert_close(explain(model, images, "heads"), both)
