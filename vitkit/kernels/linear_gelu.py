"""The MLP's first projection and its exact GELU in one oneDNN call, for inference on the CPU.

``GELU(x @ W^T + b)`` as two operators writes the ``[B, N, hidden]`` projection to memory, reads it
back for the GELU and writes it again; oneDNN's matmul with a GELU post-op
(``torch.ops.mkldnn._linear_pointwise``, the kernel Inductor's CPU backend fuses into) applies the
GELU to each output tile while it is in cache. For ViT-S/16 at batch 32 on 2 cores the fused call
took 37 ms against 50 ms for the pair in float32, 8 against 18 ms in bfloat16, and the whole
forward ran 1.05-1.07x faster in float32 and up to 1.14x in bfloat16, with the same logits
(``docs/benchmarks.md``, inference against timm).

The operator has no backward, so it serves inference only: :func:`fusable` says when
:class:`~vitkit.layers.Mlp` may take it. Training, a tensor that needs gradients, a GPU, a hooked,
replaced (LoRA, quantised) or tanh-GELU layer, tracing, compiling and export keep the two
operators, which every tool understands; FLOP counters count the fused call as the linear it is.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from timm.layers.activations import GELU as TimmGELU
from torch import nn
from torch.utils.flop_counter import register_flop_formula

_enabled = True


@contextlib.contextmanager
def unfused() -> Iterator[None]:
    """Run the projection and the GELU as two operators inside the block (to compare, or to rule
    the fused call out)."""
    global _enabled
    before, _enabled = _enabled, False
    try:
        yield
    finally:
        _enabled = before


def available(dtype: torch.dtype = torch.float32) -> bool:
    """Whether this torch build runs the fused operator on the CPU in ``dtype`` (x86 builds with
    oneDNN do in float32; in bfloat16 only CPUs with bfloat16 instructions, AVX512-BF16 or AMX:
    elsewhere oneDNN has no such kernel and raises). Tried once per dtype on a tiny input."""
    return _probe(dtype)


@functools.cache
def _probe(dtype: torch.dtype) -> bool:
    if not torch.backends.mkldnn.is_available() or not hasattr(torch.ops.mkldnn, "_linear_pointwise"):
        return False
    # fixed values, not torch.randn: asked lazily from a caller's forward, the probe must not
    # draw from the global generator and shift a seeded script's random numbers
    x, weight = torch.linspace(-2.0, 2.0, 8).reshape(2, 4), torch.linspace(-1.0, 1.0, 12).reshape(3, 4)
    bias = torch.tensor([0.1, -0.2, 0.3])
    with torch.autocast("cpu", enabled=False), torch.no_grad():  # first asked from inside a caller's autocast, perhaps
        try:
            fused = torch.ops.mkldnn._linear_pointwise(x.to(dtype), weight.to(dtype), bias.to(dtype), "gelu", [], "none")
        except RuntimeError:
            return False
        expected = F.gelu(F.linear(*(t.to(dtype) for t in (x, weight, bias)))).float()
        return torch.allclose(fused.float(), expected, atol=1e-5 if dtype == torch.float32 else 2e-2)


def _exact_gelu(act: nn.Module) -> bool:
    return type(act) is TimmGELU or (type(act) is nn.GELU and act.approximate == "none")


def _hooked(module: nn.Module) -> bool:
    return bool(module._forward_hooks or module._forward_pre_hooks)


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype a linear layer would compute ``x`` in here: bfloat16 under CPU bf16 autocast,
    else ``x``'s own."""
    return torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else x.dtype


def fusable(x: torch.Tensor, fc: nn.Module, act: nn.Module) -> bool:
    """Whether ``act(fc(x))`` may run as one fused call: inference (no gradients wanted) on the
    CPU, a plain ``nn.Linear`` with a bias and an exact GELU, neither hooked, float32 or bfloat16
    (autocast's or the weights' own), and no tracing, compiling or ONNX export."""
    if not _enabled or torch.is_grad_enabled() or x.device.type != "cpu" or type(fc) is not nn.Linear or fc.bias is None:
        return False
    if not _exact_gelu(act) or _hooked(fc) or _hooked(act):
        return False
    if torch.compiler.is_compiling() or torch.jit.is_tracing() or torch.onnx.is_in_onnx_export():
        return False
    dtype = compute_dtype(x)
    weights_match = torch.is_autocast_enabled("cpu") or fc.weight.dtype == x.dtype
    return dtype in (torch.float32, torch.bfloat16) and weights_match and available(dtype)


def linear_gelu(x: torch.Tensor, fc: nn.Linear) -> torch.Tensor:
    """``GELU(fc(x))`` in one call: ``[..., in] -> [..., out]``, in :func:`compute_dtype` (check
    :func:`fusable` first)."""
    dtype = compute_dtype(x)
    return torch.ops.mkldnn._linear_pointwise(x.to(dtype), fc.weight.to(dtype), fc.bias.to(dtype), "gelu", [], "none")


def _linear_pointwise_flops(x_shape: torch.Size, w_shape: torch.Size, *args: object, **kwargs: object) -> int:
    """A linear layer's FLOPs, 2 per multiply-accumulate (the post-op is not counted, as a GELU
    after ``aten.addmm`` is not)."""
    rows = 1
    for size in x_shape[:-1]:
        rows *= size
    return 2 * rows * w_shape[1] * w_shape[0]


if hasattr(torch.ops.mkldnn, "_linear_pointwise"):  # builds without oneDNN have no such operator
    register_flop_formula(torch.ops.mkldnn._linear_pointwise)(_linear_pointwise_flops)
