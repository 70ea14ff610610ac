"""Token merging's edges that the comparisons with ToMe do not reach: the schedule refusals say
what is wrong, a matching with nothing to merge keeps every token, the matching protects no token
unless told and merges by the mean of the A token and its B token (worked out by hand), a block
that merges through its forward needs no ``attn`` attribute, and a bfloat16 model with RoPE
merges its tokens' positions in bfloat16 as a float32 one does."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import vitkit
from vitkit import VisionTransformer, ViTConfig
from vitkit.layers.token_merging import bipartite_soft_matching, check_mergeable, merge_schedule


@pytest.mark.parametrize(("r", "schedule", "sentence"), [
    (2, "linear", "schedule must be 'constant' or 'decreasing', got 'linear'."),
    ([1, 1], "decreasing", "a list of r gives every block's count: it takes no schedule."),
    (-1, "constant", "r must be >= 0 tokens per block, got -1."),
    ((1, -2), "constant", "r must be >= 0 tokens per block, got [1, -2]."),
])
def test_a_schedule_that_cannot_apply_is_refused_saying_why(r: int | tuple[int, ...], schedule: str, sentence: str) -> None:
    with pytest.raises(ValueError) as error:
        merge_schedule(r, 2, schedule)  # type: ignore[arg-type]
    assert str(error.value) == sentence


def test_a_decreasing_schedule_over_two_blocks_goes_from_2r_to_0() -> None:
    # ToMe's parse_r with r = (2, -1): from r (1 + 1) = 4 to r (1 - 1) = 0 in steps of (0 - 4) / (2 - 1)
    assert merge_schedule(2, 2, "decreasing") == [4, 0]


@pytest.mark.parametrize(("r", "protected"), [(0, 0), (3, 4)])  # nothing asked; one token unprotected of 5
def test_a_matching_with_nothing_to_merge_keeps_every_token_in_its_order(r: int, protected: int) -> None:
    x = torch.randn(2, 5, 4)
    merge = bipartite_soft_matching(x, r, protected)
    assert merge.r == 0
    for mode in ("sum", "mean", "amax"):
        assert torch.equal(merge(x, mode), x)


def test_unprotected_tokens_merge_by_the_mean_of_the_a_token_and_its_b_token() -> None:
    # A = tokens 0 and 2, B = tokens 1 and 3; token 0 has token 1's direction, token 2 is orthogonal to both B tokens
    x = torch.tensor([[[2.0, 0.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 1.0], [0.0, 1.0, 0.0]]])
    merge = bipartite_soft_matching(x, 1)  # no protected token by default: token 0 may merge
    assert merge.r == 1
    merged = merge(x)
    # ToMe's order: the unmerged A token (2), then the B tokens (1 holding 0, then 3); mean of tokens 0 and 1
    assert torch.equal(merged, torch.tensor([[[0.0, 0.0, 1.0], [1.5, 0.0, 0.0], [0.0, 1.0, 0.0]]]))
    assert torch.equal(merge(x, "sum")[0, 1], torch.tensor([3.0, 0.0, 0.0]))


class MergingWithoutAttn(nn.Module):
    """A block that merges between its two branches and names its token mixer otherwise."""

    def __init__(self) -> None:
        super().__init__()
        self.mixer = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, *, merge=None) -> torch.Tensor:  # noqa: ANN001
        x = x + self.mixer(x)
        return x if merge is None else merge(x, x)


def test_a_block_that_takes_merge_is_mergeable_whatever_its_attention_is_called() -> None:
    check_mergeable(MergingWithoutAttn())  # no attn attribute to ask for need_keys: it merges through its forward


def test_a_bfloat16_rope_model_merges_in_bfloat16_as_the_float32_model_does() -> None:
    torch.manual_seed(0)
    config = ViTConfig(img_size=16, patch_size=4, embed_dim=32, depth=3, num_heads=4, num_classes=5, mlp_ratio=2.0,
                       rope="axial")
    model = vitkit.merge_tokens(VisionTransformer(config).eval(), 4)
    images = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        reference = model(images)
        half = model.to(torch.bfloat16)(images.bfloat16())
    assert half.dtype == torch.bfloat16
    torch.testing.assert_close(half.float(), reference, atol=0.02, rtol=0.05)
