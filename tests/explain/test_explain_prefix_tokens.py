"""Attention maps and head diagnostics with register and distillation tokens: every read-out is
over the patch grid, and the sink check reports the class token and the registers apart."""

from __future__ import annotations

import math

import pytest
import torch

from vitkit import create_model
from vitkit.explain import explain
from vitkit.explain.head_stats import attention_statistics, model_head_stats
from vitkit.explain.maps import capture_attention, maps_from_capture
from vitkit.explain.rollout import read_out


def test_read_out_skips_registers_and_reads_the_patch_columns() -> None:
    # class token, two registers, four patches; the class token's row puts most mass on a register
    joint = torch.zeros(1, 7, 7)
    joint[0, 0] = torch.tensor([0.0, 0.6, 0.2, 0.1, 0.05, 0.05, 0.0])
    maps = read_out(joint, num_prefix_tokens=3, pooling="token")
    torch.testing.assert_close(maps, torch.tensor([[1.0, 0.5, 0.5, 0.0]]))


def test_head_stats_report_class_and_register_shares_apart() -> None:
    uniform = torch.full((2, 3, 7, 7), 1 / 7)  # class token, two registers, four patches
    stats = attention_statistics([uniform, uniform], num_prefix_tokens=3, reg_tokens=2)
    torch.testing.assert_close(stats.cls_share, torch.full((2, 3), 1 / 7))
    torch.testing.assert_close(stats.reg_share, torch.full((2, 3), 2 / 7))
    to_cls, to_reg = stats.sink_shares()
    torch.testing.assert_close(to_reg, torch.full((2,), 2 / 7))
    assert stats.rows()[0]["reg_share"] == pytest.approx(2 / 7)

    sink = torch.zeros(1, 1, 6, 6)
    sink[..., 1] = 1.0  # every query attends to the second register only
    no_class = attention_statistics([sink], num_prefix_tokens=2, reg_tokens=2)
    assert no_class.cls_share.isnan().all()
    torch.testing.assert_close(no_class.reg_share, torch.ones(1, 1))
    assert attention_statistics([uniform], num_prefix_tokens=1).reg_share.isnan().all()


def test_model_head_stats_find_the_registers_of_the_model() -> None:
    model = create_model("vit_cifar_tiny", depth=2, reg_tokens=4).eval()
    stats = model_head_stats(model, [torch.randn(2, 3, 32, 32)])
    run = model.forward_intermediates(torch.randn(2, 3, 32, 32), return_attention=True)
    assert run.attentions[0].shape[-1] == 5 + 64
    assert stats.reg_share.shape == (2, 3) and torch.isfinite(stats.reg_share).all()
    assert (stats.reg_share > 0).all() and (stats.reg_share < 1).all()


@pytest.mark.parametrize(
    "options",
    [dict(reg_tokens=4), dict(reg_tokens=2, class_token=False, global_pool="map"), dict(distilled=True)],
    ids=["registers", "registers_map", "distilled"],
)
@pytest.mark.parametrize("method", ["rollout", "grad_rollout", "chefer", "heads"])
def test_every_map_is_over_the_patch_grid_whatever_the_prefix_tokens(options: dict, method: str) -> None:
    torch.manual_seed(0)
    model = create_model("vit_cifar_tiny", depth=2, **options).eval()
    maps = explain(model, torch.randn(2, 3, 32, 32), method)
    assert maps.shape[-2:] == (32, 32) and torch.isfinite(maps).all()


def test_head_maps_of_a_register_model_are_the_patch_columns_of_the_attention() -> None:
    torch.manual_seed(0)
    model = create_model("vit_cifar_tiny", depth=2, patch_size=8, reg_tokens=4).eval()
    capture = capture_attention(model, torch.randn(1, 3, 32, 32))
    assert capture.num_prefix_tokens == 5 and capture.grid == (4, 4)
    last = capture.attentions[-1]
    expected = last[:, :, 0, 5:].reshape(1, 3, 1, 4, 4)  # class token's row, patch columns only
    upsampled = torch.nn.functional.interpolate(expected[:, :, 0], size=(32, 32), mode="bilinear", align_corners=False)
    torch.testing.assert_close(maps_from_capture(capture, "heads"), upsampled)
    assert not math.isclose(last[:, :, 0, 1:5].sum().item(), 0.0)  # the registers did draw attention
