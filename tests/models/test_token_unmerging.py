"""Merged tokens put back on the patches they hold (``vitkit.layers.token_merging``'s
``unmerge_tokens``, ``unmerge_attention`` and ``unmerge_gradient``), against values worked out by
hand for three patches of which the last two merged, in any dtype of the attention: the source
matrix, 0 or 1, comes in ToMe's float32 whatever the model's dtype."""

from __future__ import annotations

import pytest
import torch

from vitkit.layers.token_merging import unmerge_attention, unmerge_gradient, unmerge_tokens

#: ``[1, 2, 3]``: merged token 0 holds patch 0, merged token 1 holds patches 1 and 2.
SOURCE = torch.tensor([[[1.0, 0.0, 0.0], [0.0, 1.0, 1.0]]])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_each_patch_takes_its_holders_features(dtype: torch.dtype) -> None:
    tokens = torch.tensor([[[1.0, 2.0], [3.0, 5.0]]], dtype=dtype)
    back = unmerge_tokens(tokens, SOURCE)
    assert back.dtype == dtype
    torch.testing.assert_close(back, torch.tensor([[[1.0, 2.0], [3.0, 5.0], [3.0, 5.0]]], dtype=dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_keys_weight_is_shared_evenly_among_its_patches_and_each_row_is_its_holders(dtype: torch.dtype) -> None:
    # two heads over the two merged tokens, each row summing to 1
    attention = torch.tensor([[[[0.2, 0.8], [0.6, 0.4]], [[0.9, 0.1], [0.3, 0.7]]]], dtype=dtype)
    back = unmerge_attention(attention, SOURCE)
    expected = torch.tensor([[[[0.2, 0.4, 0.4], [0.6, 0.2, 0.2], [0.6, 0.2, 0.2]],
                              [[0.9, 0.05, 0.05], [0.3, 0.35, 0.35], [0.3, 0.35, 0.35]]]], dtype=dtype)
    assert back.dtype == dtype
    torch.testing.assert_close(back, expected)
    torch.testing.assert_close(back.sum(dim=-1), torch.ones(1, 2, 3, dtype=dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_gradient_entry_is_copied_to_every_pair_of_patches_it_joins(dtype: torch.dtype) -> None:
    gradient = torch.tensor([[[[1.0, -2.0], [3.0, 4.0]]]], dtype=dtype)
    back = unmerge_gradient(gradient, SOURCE)
    expected = torch.tensor([[[[1.0, -2.0, -2.0], [3.0, 4.0, 4.0], [3.0, 4.0, 4.0]]]], dtype=dtype)
    assert back.dtype == dtype
    torch.testing.assert_close(back, expected)
    # attention x gradient summed over the merged pair's patches is the holder's product on merged token 1:
    # 0.8 x -2 for patch 0, 0.4 x 4 for patches 1 and 2
    attention = torch.tensor([[[[0.2, 0.8], [0.6, 0.4]]]], dtype=dtype)
    product = unmerge_attention(attention, SOURCE) * back
    torch.testing.assert_close(product[..., 1:].sum(dim=-1), torch.tensor([[[-1.6, 1.6, 1.6]]], dtype=dtype))
