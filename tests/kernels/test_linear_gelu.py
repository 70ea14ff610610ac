"""The MLP's projection and exact GELU fused into one oneDNN call for CPU inference: the same
values as the two operators, taken only where nothing can tell (inference, a plain hook-free
``nn.Linear`` and an exact GELU, no tracing), and counted as the linear it is."""

from __future__ import annotations

import collections
import contextlib
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from vitkit.kernels import linear_gelu
from vitkit.layers import Mlp

pytestmark = pytest.mark.skipif(not linear_gelu.available(), reason="this torch build has no oneDNN linear with a GELU post-op")
#: bfloat16's fused call needs bfloat16 instructions (AVX512-BF16 or AMX); asked here, before any Ops() counts the probe
needs_bf16 = pytest.mark.skipif(not linear_gelu.available(torch.bfloat16), reason="this CPU has no bfloat16 oneDNN kernel")


class Ops(TorchDispatchMode):
    """The operators a call dispatched, by name."""

    def __init__(self) -> None:
        super().__init__()
        self.names: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        self.names[str(func.overloadpacket).split(".")[-1]] += 1
        return func(*args, **(kwargs or {}))


def mlp(**kwargs: object) -> Mlp:
    torch.manual_seed(0)
    return Mlp(24, 96, **kwargs).eval()


def run(module: nn.Module, x: torch.Tensor, bf16: bool = False) -> tuple[torch.Tensor, collections.Counter[str]]:
    with Ops() as ops, torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        out = module(x)
    return out, ops.names


@pytest.mark.parametrize("bf16", [False, pytest.param(True, marks=needs_bf16)])
def test_inference_takes_the_fused_call_and_gives_the_two_operators_values(bf16: bool) -> None:
    layer, x = mlp(), torch.randn(3, 17, 24)
    with torch.inference_mode():
        fused, ops = run(layer, x, bf16)
        with linear_gelu.unfused():
            reference, reference_ops = run(layer, x, bf16)
    assert ops["_linear_pointwise"] == 1 and ops["gelu"] == 0
    assert reference_ops["_linear_pointwise"] == 0 and reference_ops["gelu"] == 1
    assert fused.dtype == reference.dtype == (torch.bfloat16 if bf16 else torch.float32)
    # float32: the same values; bfloat16: the fused call rounds once where the pair rounds twice
    torch.testing.assert_close(fused, reference, **({"atol": 2e-2, "rtol": 2e-2} if bf16 else {"atol": 1e-6, "rtol": 1e-6}))
    hand = F.linear(F.gelu(F.linear(x, layer.fc1.weight, layer.fc1.bias)), layer.fc2.weight, layer.fc2.bias)
    if not bf16:
        torch.testing.assert_close(fused, hand, atol=1e-6, rtol=1e-6)


def test_the_first_question_may_come_from_inside_autocast() -> None:
    linear_gelu._probe.cache_clear()
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):  # the probe raised here once
        out = mlp()(torch.randn(2, 5, 24))
    assert linear_gelu.available() and out.dtype == torch.bfloat16


def test_asking_whether_the_call_is_available_draws_no_random_numbers() -> None:
    linear_gelu._probe.cache_clear()
    torch.manual_seed(0)
    assert linear_gelu.available()
    after_asking = torch.rand(3)
    torch.manual_seed(0)
    assert torch.equal(after_asking, torch.rand(3))


@needs_bf16
def test_a_bfloat16_model_fuses_in_its_own_dtype() -> None:
    layer, x = mlp().to(torch.bfloat16), torch.randn(2, 5, 24, dtype=torch.bfloat16)
    with torch.no_grad():
        out, ops = run(layer, x)
    assert ops["_linear_pointwise"] == 1 and out.dtype == torch.bfloat16


class CountingLinear(nn.Linear):
    """A layer that replaces ``nn.Linear`` (as LoRA or quantisation do)."""


def _hooked(layer: Mlp) -> Mlp:
    layer.fc1.register_forward_hook(lambda module, args, output: None)
    return layer


@pytest.mark.parametrize(("why", "make", "grad", "unfused"), [
    ("gradients wanted", mlp, True, False),
    ("fc1 hooked", lambda: _hooked(mlp()), False, False),
    ("GELU's tanh approximation", lambda: mlp(act_layer="gelu_tanh"), False, False),
    ("unfused() asked for", mlp, False, True),
])
def test_the_two_operators_run_where_the_fused_call_would_show(why: str, make: object, grad: bool, unfused: bool) -> None:
    layer, x = make(), torch.randn(2, 5, 24)
    with torch.set_grad_enabled(grad), linear_gelu.unfused() if unfused else contextlib.nullcontext():
        _, ops = run(layer, x)
    assert ops["_linear_pointwise"] == 0 and ops["gelu"] == 1, why


def test_a_layer_that_replaces_fc1_keeps_its_own_forward() -> None:
    layer = mlp()
    replaced = CountingLinear(24, 96)
    replaced.load_state_dict(layer.fc1.state_dict())
    layer.fc1 = replaced
    with torch.no_grad():
        _, ops = run(layer, torch.randn(2, 5, 24))
    assert ops["_linear_pointwise"] == 0


@pytest.mark.parametrize("tool", ["torch.export", "torch.jit.trace"])
def test_an_exported_or_traced_model_records_the_two_operators(tool: str) -> None:
    layer, x = mlp(), torch.randn(2, 5, 24)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch.jit.trace's deprecation
        if tool == "torch.export":
            names = {str(node.target) for node in torch.export.export(layer, (x,)).graph.nodes}
        else:
            names = {node.kind() for node in torch.jit.trace(layer, x).inlined_graph.nodes()}
    assert any("gelu" in name for name in names) and not any("mkldnn" in name for name in names)


def test_flop_counters_count_the_fused_call_as_the_linear_it_is() -> None:
    layer, x = mlp(), torch.randn(2, 5, 24)
    counts = []
    for unfused in (False, True):
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            if unfused:
                with linear_gelu.unfused():
                    layer(x)
            else:
                layer(x)
        counts.append(counter.get_total_flops())
    assert counts[0] == counts[1] == 2 * 2 * 2 * 5 * 24 * 96  # two linears, 2 FLOPs per multiply-accumulate


def test_a_dtype_the_cpu_cannot_fuse_keeps_the_two_operators(monkeypatch: pytest.MonkeyPatch) -> None:
    # a CPU without bfloat16 instructions: oneDNN has no fused bfloat16 kernel and raised mid-evaluation
    monkeypatch.setattr(linear_gelu, "_probe", lambda dtype: dtype == torch.float32)
    layer, x = mlp(), torch.randn(3, 17, 24)
    with torch.inference_mode():
        out, ops = run(layer, x, bf16=True)
        plain, plain_ops = run(layer, x, bf16=False)
    assert ops["_linear_pointwise"] == 0 and ops["gelu"] == 1 and out.dtype == torch.bfloat16
    assert plain_ops["_linear_pointwise"] == 1 and plain.dtype == torch.float32
