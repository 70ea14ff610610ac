"""Attention layers: kernels, masks and biases, cross-attention, KV cache, head gating and pruning, init.

Every documented MSA behaviour that a unit test can check is proved here. A hand-written reference
(``reference_heads``) recomputes ``softmax(Q K^T / sqrt(d)) V`` per head from the module's fused qkv
weight slices, so the module is checked against the formula.
"""

from __future__ import annotations

import math
import re
from collections import Counter

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import vitkit.layers.attention as attention_module
from vitkit.kernels import explicit_attention
from vitkit.layers import (
    CausalSelfAttention,
    CrossAttention,
    EncoderBlock,
    KVCache,
    MultiHeadSelfAttention,
    causal_mask,
    choose_attn_impl,
    padding_mask,
)

DIM, HEADS, BATCH, TOKENS = 32, 4, 2, 7
TOL = dict(rtol=1e-5, atol=1e-5)


def make_msa(dim: int = DIM, heads: int = HEADS, **kwargs) -> MultiHeadSelfAttention:
    """An MSA with random (non-zero) biases, so that bias handling is exercised too."""
    msa = MultiHeadSelfAttention(dim, heads, **kwargs)
    with torch.no_grad():
        msa.qkv.bias.normal_(std=0.1)
        msa.proj.bias.normal_(std=0.1)
    return msa


def twin(msa: MultiHeadSelfAttention, attn_impl: str) -> MultiHeadSelfAttention:
    """A copy of ``msa`` with the same weights and a different kernel."""
    other = MultiHeadSelfAttention(
        msa.dim, msa.num_heads, attn_impl=attn_impl, qk_norm=not isinstance(msa.q_norm, nn.Identity)
    )
    other.load_state_dict(msa.state_dict())
    return other.train(msa.training)


def project_heads(msa: MultiHeadSelfAttention, tokens: torch.Tensor, part: int) -> torch.Tensor:
    """Queries (``part`` 0), keys (1) or values (2) ``[B, H, n, d]`` of ``tokens`` ``[B, n, D]``,
    computed by hand from that slice of the fused qkv weight."""
    inner = msa.num_heads * msa.head_dim
    rows = slice(part * inner, (part + 1) * inner)
    out = tokens @ msa.qkv.weight[rows].T + msa.qkv.bias[rows]
    return out.view(tokens.shape[0], tokens.shape[1], msa.num_heads, msa.head_dim).transpose(1, 2)


def reference_heads(
    msa: MultiHeadSelfAttention,
    x: torch.Tensor,
    context: torch.Tensor | None = None,
    allowed: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-head outputs ``[B, H, N, d]`` and weights ``[B, H, N, M]`` of
    ``softmax(Q K^T / sqrt(d)) V`` computed by hand (no qk norm, no dropout)."""
    context = x if context is None else context
    q, k, v = project_heads(msa, x, 0), project_heads(msa, context, 1), project_heads(msa, context, 2)
    scores = q @ k.transpose(-2, -1) / math.sqrt(msa.head_dim)
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    weights = scores.softmax(dim=-1)
    return weights @ v, weights


def as_layer(cls: type, msa: MultiHeadSelfAttention) -> torch.nn.Module:
    """A ``cls`` attention layer (cross-attention, causal decoding) with ``msa``'s options and weights."""
    layer = cls(msa.dim, msa.num_heads, head_dim=msa.head_dim, attn_impl=msa.attn_impl, locality=msa.locality,
                qk_norm=not isinstance(msa.q_norm, nn.Identity))
    layer.load_state_dict(msa.state_dict())
    return layer.train(msa.training)


def merge_and_project(msa: MultiHeadSelfAttention, heads_out: torch.Tensor) -> torch.Tensor:
    """``[B, H, N, d]`` per-head outputs -> ``W_o`` applied to the concatenated heads ``[B, N, D]``."""
    batch, heads, tokens, d = heads_out.shape
    return msa.proj(heads_out.transpose(1, 2).reshape(batch, tokens, heads * d))


@pytest.fixture
def kernel_calls(monkeypatch: pytest.MonkeyPatch) -> Counter:
    """Counts which attention kernel the module actually ran."""
    calls: Counter = Counter()
    sdpa, explicit = attention_module.sdpa_attention, attention_module.explicit_attention

    def counting_sdpa(*args, **kwargs):
        calls["sdpa"] += 1
        return sdpa(*args, **kwargs)

    def counting_explicit(*args, **kwargs):
        calls["explicit"] += 1
        return explicit(*args, **kwargs)

    monkeypatch.setattr(attention_module, "sdpa_attention", counting_sdpa)
    monkeypatch.setattr(attention_module, "explicit_attention", counting_explicit)
    return calls


def _masks(kind: str) -> dict:
    """Mask keyword arguments for the parametrised kernel-equality tests (N = M = TOKENS)."""
    generator = torch.Generator().manual_seed(1)
    random_allowed = torch.rand(TOKENS, TOKENS, generator=generator) > 0.4
    random_allowed |= torch.eye(TOKENS, dtype=torch.bool)  # every row keeps one key
    padding = torch.zeros(BATCH, TOKENS, dtype=torch.bool)
    padding[0, -3:] = True
    return {
        "none": {},
        "attn_mask_2d": {"attn_bias": random_allowed},
        "attn_mask_4d": {"attn_bias": torch.rand(BATCH, HEADS, TOKENS, TOKENS, generator=generator) > 0.3},
        "key_padding": {"attn_bias": padding_mask(padding)},
        "causal": {"attn_bias": causal_mask(TOKENS, TOKENS)},
        "all_three": {"attn_bias": random_allowed & padding_mask(padding) & causal_mask(TOKENS, TOKENS)},
        "float_bias": {"attn_bias": torch.randn(BATCH, 1, TOKENS, TOKENS, generator=generator).masked_fill(~random_allowed, float("-inf"))},
    }[kind]


# ----------------------------------------------------------------------------------- kernels
@pytest.mark.parametrize("qk_norm", [False, True])
@pytest.mark.parametrize(
    "mask_kind", ["none", "attn_mask_2d", "attn_mask_4d", "key_padding", "causal", "all_three", "float_bias"]
)
def test_fused_and_explicit_kernels_agree_in_train_mode_without_dropout(kernel_calls: Counter, mask_kind: str, qk_norm: bool) -> None:
    fused = make_msa(attn_impl="sdpa", qk_norm=qk_norm).train()
    explicit = twin(fused, "explicit")
    x = torch.randn(BATCH, TOKENS, DIM, requires_grad=True)
    masks = _masks(mask_kind)

    out_fused = fused(x, **masks)
    (grad_fused,) = torch.autograd.grad(out_fused.square().sum(), x)
    out_explicit = explicit(x, **masks)
    (grad_explicit,) = torch.autograd.grad(out_explicit.square().sum(), x)

    assert kernel_calls == Counter(sdpa=1, explicit=1)
    torch.testing.assert_close(out_fused, out_explicit, **TOL)
    torch.testing.assert_close(grad_fused, grad_explicit, **TOL)


def test_module_matches_softmax_qk_over_sqrt_d_times_v_by_hand() -> None:
    msa = make_msa(attn_impl="explicit")
    x = torch.randn(BATCH, TOKENS, DIM)
    heads_out, weights = reference_heads(msa, x)
    out, module_weights = msa(x, need_weights=True)
    assert msa.scale == pytest.approx(1 / math.sqrt(DIM // HEADS))
    torch.testing.assert_close(module_weights, weights, **TOL)
    torch.testing.assert_close(out, merge_and_project(msa, heads_out), **TOL)


def test_project_qkv_splits_the_fused_projection_by_hand_and_its_backward_copies_once() -> None:
    msa = make_msa()
    x = torch.randn(BATCH, TOKENS, DIM, requires_grad=True)
    q, k, v = msa.project_qkv(x)
    d = DIM // HEADS
    projected = F.linear(x, msa.qkv.weight, msa.qkv.bias)  # rows: all q heads, then all k, then all v
    for i, part in enumerate((q, k, v)):
        by_hand = projected[..., i * DIM:(i + 1) * DIM].reshape(BATCH, TOKENS, HEADS, d).transpose(1, 2)
        torch.testing.assert_close(part, by_hand, **TOL)
    copies: Counter[str] = Counter()

    class CountCopies(torch.utils._python_dispatch.TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            if func.overloadpacket.__name__ in {"clone", "copy_", "stack", "cat", "contiguous", "_to_copy"}:
                copies[func.overloadpacket.__name__] += 1
            return func(*args, **(kwargs or {}))

    weights = [torch.randn_like(t) for t in (q, k, v)]
    loss = sum((t * w).sum() for t, w in zip((q, k, v), weights))
    with CountCopies():
        loss.backward()
    assert copies == {"stack": 1}  # the three gradients straight into [B, N, 3, H, d]; no clone after
    grad = torch.cat([w.transpose(1, 2).reshape(BATCH, TOKENS, DIM) for w in weights], dim=-1)
    torch.testing.assert_close(x.grad, grad @ msa.qkv.weight, **TOL)


@pytest.mark.parametrize("attn_impl", ["sdpa", "explicit"])
def test_masked_output_equals_hand_computation(attn_impl: str) -> None:
    msa = make_msa(attn_impl=attn_impl)
    x = torch.randn(BATCH, TOKENS, DIM)
    masks = _masks("all_three")
    generator = torch.Generator().manual_seed(1)
    random_allowed = (torch.rand(TOKENS, TOKENS, generator=generator) > 0.4) | torch.eye(TOKENS, dtype=torch.bool)
    causal = torch.ones(TOKENS, TOKENS, dtype=torch.bool).tril()
    not_padded = torch.ones(BATCH, 1, 1, TOKENS, dtype=torch.bool)
    not_padded[0, ..., -3:] = False
    allowed = random_allowed & not_padded & causal
    heads_out, _ = reference_heads(msa, x, allowed=allowed)
    torch.testing.assert_close(msa(x, **masks), merge_and_project(msa, heads_out), **TOL)


def test_requesting_weights_forces_explicit_and_pinned_kernels_are_kept() -> None:
    q32 = torch.randn(1, 2, 64, 8)
    assert choose_attn_impl("auto", q32, need_weights=True) == "explicit"
    assert choose_attn_impl("sdpa", q32, need_weights=True) == "explicit"  # only it has weights
    assert choose_attn_impl("sdpa", q32.bfloat16(), need_weights=False) == "sdpa"
    assert choose_attn_impl("explicit", q32, need_weights=False) == "explicit"


def test_auto_module_returns_weights_from_explicit_kernel(kernel_calls: Counter, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VITKIT_ATTN_IMPL", "sdpa")  # "auto" pinned to SDPA: only the weights need explicit
    msa = make_msa(attn_impl="auto")
    x = torch.randn(BATCH, 200, DIM, requires_grad=True)
    msa(x)
    _, weights = msa(x, need_weights=True)
    assert kernel_calls == Counter(sdpa=1, explicit=1)
    assert weights.shape == (BATCH, HEADS, 200, 200)


def test_seed_worked_example_scores_halved_and_softmax_row() -> None:
    x = torch.tensor([[1.0, 0, 1, 0], [0, 1, 0, 1], [1, 1, 0, 0]])
    q = k = v = x[None, None]  # [B=1, H=1, N=3, d=4], no projections
    out, weights = explicit_attention(q, k, v, allowed=None, dropout_p=0.0, scale=0.5)
    scores = x @ x.T
    torch.testing.assert_close(scores, torch.tensor([[2.0, 0, 1], [0, 2, 1], [1, 1, 2]]))
    torch.testing.assert_close(weights[0, 0], (scores / 2).softmax(dim=-1))
    torch.testing.assert_close(weights[0, 0, 0], torch.tensor([0.506, 0.186, 0.307]), atol=1e-3, rtol=0)
    torch.testing.assert_close(out[0, 0], weights[0, 0] @ x)


# ------------------------------------------------------------------------------------- masks
@pytest.mark.parametrize("attn_impl", ["sdpa", "explicit"])
def test_fully_masked_row_gives_zeros_not_nan(attn_impl: str) -> None:
    msa = MultiHeadSelfAttention(DIM, HEADS, attn_impl=attn_impl).train()  # default init: zero biases
    x = torch.randn(BATCH, TOKENS, DIM, requires_grad=True)
    allowed = torch.ones(TOKENS, TOKENS, dtype=torch.bool)
    allowed[2] = False  # query 2 may attend to nothing

    out = msa(x, attn_bias=allowed)
    out.square().sum().backward()

    assert torch.isfinite(out).all()
    assert torch.equal(out[:, 2], torch.zeros(BATCH, DIM))
    assert out[:, [0, 1, 3]].abs().sum() > 0
    assert torch.isfinite(x.grad).all()
    assert all(torch.isfinite(p.grad).all() for p in msa.parameters())
    if attn_impl == "explicit":
        _, weights = msa(x, attn_bias=allowed, need_weights=True)
        assert torch.equal(weights[:, :, 2], torch.zeros(BATCH, HEADS, TOKENS))
        torch.testing.assert_close(weights[:, :, 3].sum(-1), torch.ones(BATCH, HEADS))


@pytest.mark.parametrize("attn_impl", ["sdpa", "explicit"])
def test_fully_padded_sample_gives_only_the_output_bias_and_finite_grads(attn_impl: str) -> None:
    msa = make_msa(attn_impl=attn_impl)
    x = torch.randn(BATCH, TOKENS, DIM, requires_grad=True)
    padding = torch.zeros(BATCH, TOKENS, dtype=torch.bool)
    padding[1] = True  # sample 1 has no key at all
    out = msa(x, attn_bias=padding_mask(padding))
    out.sum().backward()
    torch.testing.assert_close(out[1], msa.proj.bias.expand(TOKENS, DIM))  # attention adds nothing
    assert torch.isfinite(x.grad).all() and torch.equal(x.grad[1], torch.zeros(TOKENS, DIM))


@pytest.mark.parametrize("attn_impl", ["sdpa", "explicit"])
def test_padded_keys_get_zero_weight_and_do_not_change_the_output(attn_impl: str) -> None:
    msa = make_msa(attn_impl=attn_impl).eval()
    real = 4
    x = torch.randn(1, TOKENS, DIM)
    padding = torch.zeros(1, TOKENS, dtype=torch.bool)
    padding[0, real:] = True

    out = msa(x, attn_bias=padding_mask(padding))
    unpadded = msa(x[:, :real])
    torch.testing.assert_close(out[:, :real], unpadded, **TOL)

    _, weights = msa(x, attn_bias=padding_mask(padding), need_weights=True)
    assert torch.equal(weights[..., real:], torch.zeros_like(weights[..., real:]))
    torch.testing.assert_close(weights.sum(-1), torch.ones(1, HEADS, TOKENS))


@pytest.mark.parametrize("attn_impl", ["sdpa", "explicit"])
def test_causal_weights_are_lower_triangular_and_prefix_independent_of_future(attn_impl: str) -> None:
    msa = make_msa(attn_impl=attn_impl)
    x = torch.randn(BATCH, TOKENS, DIM)
    _, weights = msa(x, attn_bias=causal_mask(TOKENS, TOKENS), need_weights=True)
    upper = torch.triu(torch.ones(TOKENS, TOKENS, dtype=torch.bool), diagonal=1)
    assert torch.equal(weights[..., upper], torch.zeros_like(weights[..., upper]))
    assert (weights[..., ~upper] > 0).all()

    out = msa(x, attn_bias=causal_mask(TOKENS, TOKENS))
    x_changed_future = x.clone()
    x_changed_future[:, 4:] = torch.randn(BATCH, TOKENS - 4, DIM)
    torch.testing.assert_close(msa(x_changed_future, attn_bias=causal_mask(TOKENS, TOKENS))[:, :4], out[:, :4], **TOL)


def test_attn_mask_that_does_not_broadcast_raises_naming_both_shapes() -> None:
    msa = make_msa()
    x = torch.randn(BATCH, TOKENS, DIM)
    with pytest.raises(ValueError, match=r"\(3, 5\).*\[2, 4, 7, 7\]"):
        msa(x, attn_bias=torch.ones(3, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"\(2, 7, 7\)"):  # [B, N, M] aligns B with H: rejected
        msa(x, attn_bias=torch.ones(BATCH, TOKENS, TOKENS, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"\(1, 2, 1, 7, 7\)"):  # more axes than the attention's four
        msa(x, attn_bias=torch.ones(1, BATCH, 1, TOKENS, TOKENS, dtype=torch.bool))


def test_key_padding_mask_of_wrong_shape_or_dtype_raises() -> None:
    msa = make_msa()
    x = torch.randn(BATCH, TOKENS, DIM)
    with pytest.raises(ValueError, match=r"\(2, 1, 1, 6\).*\[2, 4, 7, 7\]"):
        msa(x, attn_bias=padding_mask(torch.zeros(BATCH, TOKENS - 1, dtype=torch.bool)))
    with pytest.raises(ValueError, match="boolean"):
        padding_mask(torch.zeros(BATCH, TOKENS))


def test_integer_bias_and_nan_or_positive_infinite_biases_are_refused() -> None:
    msa = make_msa()
    x = torch.randn(1, TOKENS, DIM)
    with pytest.raises(ValueError, match="boolean .* or a float bias"):
        msa(x, attn_bias=torch.zeros(TOKENS, TOKENS, dtype=torch.long))
    for bad in (float("nan"), float("inf")):  # checked on the device, without a host read: torch's assertion error
        for others in (0.0, float("-inf")):  # among forbidden keys too: not taken for an empty row
            bias = torch.zeros(TOKENS, TOKENS)
            bias[2] = others
            bias[2, 3] = bad
            with pytest.raises(RuntimeError, match="NaN or \\+inf"):
                msa(x, attn_bias=bias)


@pytest.mark.parametrize("attn_impl", ["sdpa", "explicit"])
def test_additive_bias_equals_hand_computation_and_minus_infinity_equals_the_boolean_mask(attn_impl: str) -> None:
    msa = make_msa(attn_impl=attn_impl)
    x = torch.randn(BATCH, TOKENS, DIM)
    bias = torch.randn(BATCH, HEADS, TOKENS, TOKENS)  # e.g. token merging's log-size term, per head
    q, k, v = (project_heads(msa, x, part) for part in range(3))
    weights = (q @ k.transpose(-2, -1) / math.sqrt(msa.head_dim) + bias).softmax(dim=-1)
    torch.testing.assert_close(msa(x, attn_bias=bias), merge_and_project(msa, weights @ v), **TOL)

    allowed = causal_mask(TOKENS, TOKENS)
    as_bias = torch.zeros(TOKENS, TOKENS).masked_fill(~allowed, float("-inf"))
    torch.testing.assert_close(msa(x, attn_bias=as_bias), msa(x, attn_bias=allowed), **TOL)


@pytest.mark.parametrize("attn_impl", ["sdpa", "explicit"])
def test_a_float64_bias_on_a_float32_layer_is_cast_to_the_queries_dtype(attn_impl: str) -> None:
    msa = make_msa(attn_impl=attn_impl)
    x = torch.randn(BATCH, TOKENS, DIM)
    bias = torch.randn(BATCH, HEADS, TOKENS, TOKENS)
    out = msa(x, attn_bias=bias.double())
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, msa(x, attn_bias=bias), **TOL)


@pytest.mark.parametrize("attn_impl", ["sdpa", "explicit"])
def test_a_row_whose_bias_is_all_minus_infinity_gives_zeros_not_nan(attn_impl: str) -> None:
    msa = make_msa(attn_impl=attn_impl)
    x = torch.randn(1, TOKENS, DIM, requires_grad=True)
    bias = torch.zeros(TOKENS, TOKENS)
    bias[3] = float("-inf")
    out = msa(x, attn_bias=bias)
    out.sum().backward()
    torch.testing.assert_close(out[0, 3], msa.proj.bias)
    assert torch.isfinite(x.grad).all()


@pytest.mark.parametrize("shape", [(BATCH, DIM), (BATCH, 1, TOKENS, DIM), (BATCH, TOKENS, DIM + 1)])
def test_input_of_wrong_rank_or_width_raises(shape: tuple[int, ...]) -> None:
    with pytest.raises(ValueError, match=rf"\[B, N, D\] with D = {DIM}, got {re.escape(str(shape))}"):
        make_msa()(torch.randn(*shape))


def test_dim_not_divisible_by_heads_raises_naming_both_numbers() -> None:
    with pytest.raises(ValueError, match=r"dim \(100\).*num_heads \(8\)"):
        MultiHeadSelfAttention(100, 8)


def test_invalid_attn_impl_and_dropout_rates_raise() -> None:
    with pytest.raises(ValueError, match="flash"):
        MultiHeadSelfAttention(DIM, HEADS, attn_impl="flash")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="attn_drop=1.0"):
        MultiHeadSelfAttention(DIM, HEADS, attn_drop=1.0)


# ------------------------------------------------------------------------------- cross-attention
@pytest.mark.parametrize("attn_impl", ["sdpa", "explicit"])
def test_cross_attention_shapes_and_hand_computation_with_fused_weight_slices(attn_impl: str) -> None:
    msa = make_msa(attn_impl=attn_impl)
    cross = as_layer(CrossAttention, msa)
    x, context = torch.randn(BATCH, TOKENS, DIM), torch.randn(BATCH, 11, DIM)
    heads_out, weights = reference_heads(msa, x, context)

    out = cross(x, context)
    out_with_weights, module_weights = cross(x, context, need_weights=True)

    assert out.shape == (BATCH, TOKENS, DIM)
    assert module_weights.shape == (BATCH, HEADS, TOKENS, 11)
    torch.testing.assert_close(out, merge_and_project(msa, heads_out), **TOL)
    torch.testing.assert_close(out_with_weights, out, **TOL)
    torch.testing.assert_close(module_weights, weights, **TOL)


def test_cross_attention_with_context_equal_to_x_is_self_attention() -> None:
    msa = make_msa()
    x = torch.randn(BATCH, TOKENS, DIM)
    torch.testing.assert_close(as_layer(CrossAttention, msa)(x, x), msa(x), **TOL)


def test_cross_attention_respects_key_padding_of_the_context() -> None:
    cross = as_layer(CrossAttention, make_msa(attn_impl="explicit"))
    x, context = torch.randn(BATCH, TOKENS, DIM), torch.randn(BATCH, 5, DIM)
    padding = torch.tensor([[False, False, False, True, True]] * BATCH)
    out, weights = cross(x, context, attn_bias=padding_mask(padding), need_weights=True)
    assert torch.equal(weights[..., 3:], torch.zeros_like(weights[..., 3:]))
    torch.testing.assert_close(out, cross(x, context[:, :3]), **TOL)


# ------------------------------------------------------------------------------------ KV cache
@pytest.mark.parametrize("attn_impl", ["sdpa", "explicit"])
def test_kv_cache_token_by_token_decoding_equals_full_causal_pass(attn_impl: str) -> None:
    msa = make_msa(attn_impl=attn_impl).eval()
    causal = as_layer(CausalSelfAttention, msa)
    x = torch.randn(BATCH, TOKENS, DIM)
    full = msa(x, attn_bias=causal_mask(TOKENS, TOKENS))
    torch.testing.assert_close(causal(x), full, **TOL)

    cache = KVCache()
    steps = [causal(x[:, t : t + 1], kv_cache=cache) for t in range(TOKENS)]

    torch.testing.assert_close(torch.cat(steps, dim=1), full, **TOL)
    assert len(cache) == TOKENS
    assert cache.k.shape == (BATCH, HEADS, TOKENS, DIM // HEADS)


@pytest.mark.parametrize("attn_impl", ["sdpa", "explicit"])
def test_causal_attention_with_a_float_bias_keeps_its_causal_mask(attn_impl: str) -> None:
    causal = as_layer(CausalSelfAttention, make_msa(attn_impl=attn_impl).eval())
    x = torch.randn(BATCH, TOKENS, DIM)
    bias = torch.randn(TOKENS, TOKENS)
    changed = x.clone()
    changed[:, 1:] = torch.randn(BATCH, TOKENS - 1, DIM)
    torch.testing.assert_close(causal(changed, attn_bias=bias)[:, 0], causal(x, attn_bias=bias)[:, 0], **TOL)
    _, weights = causal(x, attn_bias=bias, need_weights=True)
    upper = ~causal_mask(TOKENS, TOKENS)
    assert torch.equal(weights[..., upper], torch.zeros_like(weights[..., upper]))


def test_lsa_decoding_with_a_kv_cache_masks_each_tokens_own_key_as_the_full_causal_pass() -> None:
    causal = as_layer(CausalSelfAttention, make_msa(attn_impl="explicit", locality=True).eval())
    x = torch.randn(BATCH, TOKENS, DIM)
    full, weights = causal(x, need_weights=True)
    assert torch.equal(weights.diagonal(dim1=-2, dim2=-1), torch.zeros(BATCH, HEADS, TOKENS))  # none sees itself
    cache = KVCache()
    chunks = [causal(x[:, a:b], kv_cache=cache) for a, b in [(0, 1), (1, 4), (4, 5), (5, 7)]]
    torch.testing.assert_close(torch.cat(chunks, dim=1), full, **TOL)


def test_kv_cache_chunked_prefill_then_decoding_equals_full_causal_pass() -> None:
    causal = as_layer(CausalSelfAttention, make_msa(attn_impl="explicit").eval())
    x = torch.randn(BATCH, TOKENS, DIM)
    cache = KVCache()
    chunks = [causal(x[:, a:b], kv_cache=cache) for a, b in [(0, 3), (3, 4), (4, 7)]]
    torch.testing.assert_close(torch.cat(chunks, dim=1), causal(x), **TOL)


# --------------------------------------------------------------------------- head gating, pruning
def test_head_gates_per_head_equals_hand_gated_heads() -> None:
    msa = make_msa()
    x = torch.randn(BATCH, TOKENS, DIM)
    gates = torch.tensor([1.0, 0.0, 0.5, 2.0])
    heads_out, _ = reference_heads(msa, x)
    expected = merge_and_project(msa, heads_out * gates[None, :, None, None])
    torch.testing.assert_close(msa(x, head_gates=gates), expected, **TOL)


def test_head_gates_per_sample_gates_each_sample_separately() -> None:
    msa = make_msa()
    x = torch.randn(BATCH, TOKENS, DIM)
    gates = torch.tensor([[1.0, 0.0, 1.0, 1.0], [0.0, 0.0, 0.3, 1.0]])
    out = msa(x, head_gates=gates)
    for sample in range(BATCH):
        alone = msa(x[sample : sample + 1], head_gates=gates[sample])
        torch.testing.assert_close(out[sample : sample + 1], alone, **TOL)
    heads_out, _ = reference_heads(msa, x)
    torch.testing.assert_close(out, merge_and_project(msa, heads_out * gates[:, :, None, None]), **TOL)


def test_zero_gated_head_contributes_nothing() -> None:
    msa = make_msa()
    x = torch.randn(BATCH, TOKENS, DIM)
    gates = torch.tensor([1.0, 0.0, 1.0, 1.0])
    before = msa(x, head_gates=gates)
    d = msa.head_dim
    with torch.no_grad():  # scramble q, k and v of head 1 only
        for part in range(3):
            rows = slice(part * DIM + d, part * DIM + 2 * d)
            msa.qkv.weight[rows] = torch.randn_like(msa.qkv.weight[rows])
    torch.testing.assert_close(msa(x, head_gates=gates), before, **TOL)
    assert not torch.allclose(msa(x), before, atol=1e-3)


@pytest.mark.parametrize("shape", [(HEADS + 1,), (3, HEADS), (BATCH, HEADS, 1)])
def test_head_gates_of_wrong_shape_raises(shape: tuple[int, ...]) -> None:
    with pytest.raises(ValueError, match="head_gates must have shape"):
        make_msa()(torch.randn(BATCH, TOKENS, DIM), head_gates=torch.ones(*shape))


def test_prune_heads_equals_zero_gating_and_shrinks_parameters() -> None:
    msa = make_msa()
    x = torch.randn(BATCH, TOKENS, DIM)
    gated = msa(x, head_gates=torch.tensor([1.0, 0.0, 1.0, 0.0]))
    before = sum(p.numel() for p in msa.parameters())

    msa.prune_heads([3, 1])

    d = DIM // HEADS
    per_head = 3 * d * DIM + 3 * d + DIM * d  # qkv rows + qkv bias + W_o columns
    assert sum(p.numel() for p in msa.parameters()) == before - 2 * per_head
    assert (msa.num_heads, msa.head_dim) == (2, d)
    assert msa.qkv.weight.shape == (3 * 2 * d, DIM) and msa.proj.weight.shape == (DIM, 2 * d)
    torch.testing.assert_close(msa(x), gated, **TOL)
    _, weights = msa(x, need_weights=True)
    assert weights.shape == (BATCH, 2, TOKENS, TOKENS)


def test_prune_heads_equals_gating_with_qk_norm_and_without_qkv_bias() -> None:
    msa = MultiHeadSelfAttention(DIM, HEADS, qk_norm=True, qkv_bias=False)
    with torch.no_grad():
        msa.q_norm.weight.normal_()
        msa.k_norm.bias.normal_()
    x = torch.randn(BATCH, TOKENS, DIM)
    gated = msa(x, head_gates=torch.tensor([0.0, 1.0, 1.0, 0.0]))
    msa.prune_heads([0, 3])
    assert msa.qkv.bias is None
    torch.testing.assert_close(msa(x), gated, **TOL)


def test_pruning_twice_indexes_the_remaining_heads() -> None:
    msa = make_msa()
    x = torch.randn(BATCH, TOKENS, DIM)
    gated = msa(x, head_gates=torch.tensor([0.0, 1.0, 0.0, 1.0]))
    msa.prune_heads([0])  # heads left: 1, 2, 3
    msa.prune_heads([1])  # removes original head 2
    torch.testing.assert_close(msa(x), gated, **TOL)


def test_pruning_every_head_gives_zero_output_and_a_valid_module() -> None:
    msa = make_msa()
    x = torch.randn(BATCH, TOKENS, DIM, requires_grad=True)
    msa.prune_heads(range(HEADS))

    out, weights = msa(x, need_weights=True)
    assert msa.num_heads == 0
    assert torch.equal(out, torch.zeros(BATCH, TOKENS, DIM))
    assert weights.shape == (BATCH, 0, TOKENS, TOKENS)
    cross = as_layer(CrossAttention, msa)
    assert cross(x, torch.randn(BATCH, 3, DIM)).shape == (BATCH, TOKENS, DIM)
    rebuilt = MultiHeadSelfAttention(DIM, 0, head_dim=DIM // HEADS)
    rebuilt.load_state_dict(msa.state_dict())  # the pruned shapes are reproducible


def test_block_with_every_head_pruned_is_its_mlp_branch_and_still_trains() -> None:
    block = EncoderBlock(DIM, HEADS)
    block.attn.prune_heads(range(HEADS))
    x = torch.randn(BATCH, TOKENS, DIM, requires_grad=True)
    out = block(x)
    torch.testing.assert_close(out, x + block.mlp(block.norm2(x)), **TOL)
    out.square().sum().backward()
    assert torch.isfinite(x.grad).all() and block.mlp.fc1.weight.grad.abs().sum() > 0


def test_prune_heads_rejects_out_of_range_indices() -> None:
    with pytest.raises(ValueError, match=r"\[0, 4\)"):
        make_msa().prune_heads([4])


# -------------------------------------------------------------------------------- init, params
def test_init_is_xavier_uniform_per_projection_with_zero_biases_and_scaled_output() -> None:
    dim, scale = 512, 0.5
    msa = MultiHeadSelfAttention(dim, 8, out_init_scale=scale)
    bound, std = math.sqrt(6 / (dim + dim)), math.sqrt(2 / (dim + dim))
    for part in msa.qkv.weight.detach().split(dim, dim=0):  # W_q, W_k, W_v, each [D, D]
        assert part.abs().max() <= bound
        assert part.abs().max() > 0.99 * bound  # uniform, filling its range
        assert part.std().item() == pytest.approx(std, rel=0.02)
    assert torch.equal(msa.qkv.bias, torch.zeros_like(msa.qkv.bias))
    assert torch.equal(msa.proj.bias, torch.zeros_like(msa.proj.bias))
    assert msa.proj.weight.std().item() == pytest.approx(scale * std, rel=0.02)
    assert msa.proj.weight.abs().max() <= scale * bound


def test_output_init_scale_is_configurable() -> None:
    dim = 512
    weak = MultiHeadSelfAttention(dim, 8, out_init_scale=0.1).proj.weight.std().item()
    assert weak == pytest.approx(0.1 * math.sqrt(2 / (2 * dim)), rel=0.02)


@pytest.mark.parametrize("heads", [1, 2, 4, 8, 16])
def test_parameter_count_is_independent_of_head_count(heads: int) -> None:
    d_model = 128
    msa = MultiHeadSelfAttention(d_model, heads)
    assert sum(p.numel() for p in msa.parameters()) == 4 * d_model**2 + 4 * d_model


# ------------------------------------------------------------------------------------ dropout
def test_returned_weights_are_taken_before_dropout() -> None:
    msa = make_msa(attn_drop=0.5, attn_impl="explicit").train()
    _, weights = msa(torch.randn(BATCH, TOKENS, DIM), need_weights=True)
    torch.testing.assert_close(weights.sum(-1), torch.ones(BATCH, HEADS, TOKENS))


def test_attention_dropout_is_applied_to_the_weights_that_multiply_v() -> None:
    msa = make_msa(attn_drop=0.5, attn_impl="explicit").train()
    x = torch.randn(BATCH, TOKENS, DIM)
    torch.manual_seed(123)
    out, weights = msa(x, need_weights=True)
    _, ref_weights = reference_heads(msa, x)
    torch.manual_seed(123)  # replay the same dropout mask on the hand-computed weights
    dropped = F.dropout(ref_weights, p=0.5)
    torch.testing.assert_close(weights, ref_weights, **TOL)
    torch.testing.assert_close(out, merge_and_project(msa, dropped @ project_heads(msa, x, 2)), **TOL)


@pytest.mark.parametrize("attn_impl", ["sdpa", "explicit"])
def test_attention_dropout_is_random_in_training_and_off_in_eval(attn_impl: str) -> None:
    msa = make_msa(attn_drop=0.5, attn_impl=attn_impl)
    x = torch.randn(BATCH, TOKENS, DIM)
    msa.train()
    assert not torch.allclose(msa(x), msa(x))
    msa.eval()
    assert torch.equal(msa(x), msa(x))
    heads_out, _ = reference_heads(msa, x)
    torch.testing.assert_close(msa(x), merge_and_project(msa, heads_out), **TOL)


# --------------------------------------------------------------- locality self-attention (LSA)
def lsa_reference(msa: MultiHeadSelfAttention, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Lee et al.'s LSA as their code writes it (aanna0701/SPT_LSA_ViT, models/vit.py): the dots
    ``q k^T`` times each head's temperature ``[H]``, the diagonal set to -987654321, softmax, ``v``."""
    b, n, h = x.shape[0], x.shape[1], msa.num_heads
    q, k, v = msa.qkv(x).reshape(b, n, 3, h, msa.head_dim).permute(2, 0, 3, 1, 4)
    dots = torch.einsum("bhid,bhjd->bhij", q, k) * msa.temperature.unsqueeze(0).unsqueeze(-1).unsqueeze(-1)
    eye = torch.nonzero(torch.eye(n) == 1)
    dots[:, :, eye[:, 0], eye[:, 1]] = -987654321
    weights = dots.softmax(-1)
    out = torch.einsum("bhij,bhjd->bhid", weights, v).transpose(1, 2).reshape(b, n, -1)
    return msa.proj(out), weights


@pytest.mark.parametrize("impl", ["sdpa", "explicit"])
def test_locality_masks_the_diagonal_and_uses_one_temperature_per_head(impl: str) -> None:
    msa = MultiHeadSelfAttention(32, 4, locality=True, attn_impl=impl)
    assert torch.equal(msa.temperature, torch.full((4,), 8**-0.5))  # each head starts at 1/sqrt(d)
    with torch.no_grad():
        msa.temperature.copy_(torch.tensor([0.15, 0.3, 0.45, 0.6]))  # distinct heads, none the standard scale
    x = torch.randn(2, 6, 32)
    expected_out, expected_weights = lsa_reference(msa, x)
    torch.testing.assert_close(msa(x), expected_out, atol=1e-5, rtol=1e-5)
    out, weights = msa(x, need_weights=True)
    torch.testing.assert_close(weights, expected_weights, atol=1e-6, rtol=1e-5)
    assert weights.diagonal(dim1=-2, dim2=-1).abs().max() == 0
    # one shared temperature (the mean) gives another function: the heads really are separate
    with torch.no_grad():
        msa.temperature.fill_(0.375)
    assert (msa(x) - expected_out).abs().max() > 1e-3


def test_locality_temperature_is_learned_per_head() -> None:
    msa = MultiHeadSelfAttention(16, 2, locality=True)
    msa(torch.randn(2, 5, 16)).square().sum().backward()
    assert msa.temperature.grad is not None and msa.temperature.grad.shape == (2,)
    assert (msa.temperature.grad.abs() > 0).all()
    plain = MultiHeadSelfAttention(16, 2)
    assert plain.temperature is None and "temperature" not in dict(plain.named_parameters())


def test_pruning_heads_prunes_their_temperatures() -> None:
    msa = MultiHeadSelfAttention(32, 4, locality=True, attn_impl="explicit")
    with torch.no_grad():
        msa.temperature.copy_(torch.tensor([0.15, 0.3, 0.45, 0.6]))
    x = torch.randn(2, 6, 32)
    gated = msa(x, head_gates=torch.tensor([1.0, 0.0, 1.0, 0.0]))
    msa.prune_heads([1, 3])
    assert torch.equal(msa.temperature.detach(), torch.tensor([0.15, 0.45]))
    assert isinstance(msa.temperature, nn.Parameter) and msa.temperature.requires_grad
    torch.testing.assert_close(msa(x), gated, atol=1e-6, rtol=1e-5)


def test_locality_keeps_the_diagonal_for_cross_attention_and_combines_with_masks() -> None:
    msa = MultiHeadSelfAttention(16, 2, locality=True)
    x, context = torch.randn(1, 3, 16), torch.randn(1, 3, 16)
    _, cross = as_layer(CrossAttention, msa)(x, context, need_weights=True)
    assert cross.diagonal(dim1=-2, dim2=-1).min() > 0  # a query may attend to the same position elsewhere
    _, causal = msa(torch.randn(1, 4, 16), attn_bias=causal_mask(4, 4), need_weights=True)
    # Causal without the diagonal: query 0 has no key left (zeros, not NaN); query i sees 0..i-1.
    assert causal[0, :, 0].abs().max() == 0 and torch.isfinite(causal).all()
    torch.testing.assert_close(causal[0, :, 1, 0], torch.ones(2))
