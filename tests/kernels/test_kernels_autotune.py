"""``attn_impl="auto"``: the kernel is chosen by measurement, per key, with a margin for SDPA.

Timings are injected, never measured: the kernels under test advance a fake clock by a fixed
number of seconds per call, so every choice here is deterministic.
"""

from __future__ import annotations

import json
import os
import stat
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import vitkit
import vitkit.kernels.attention as attention_kernels
import vitkit.kernels.autotune as autotune
import vitkit.layers.attention as attention_module
from vitkit.errors import VitkitError
from vitkit.kernels import (
    AutotuneKey,
    Autotuner,
    autotune_report,
    bucket,
    explicit_attention,
    format_autotune_report,
    sdpa_attention,
)
from vitkit.kernels.autotune import EXPLICIT_MARGIN
from vitkit.layers import MultiHeadSelfAttention, causal_mask

DIM, HEADS, BATCH, TOKENS = 32, 4, 2, 10
TOL = dict(rtol=1e-5, atol=1e-5)


class FakeClock:
    """A clock that only moves when a fake kernel runs."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class FakeKernels(dict):
    """The real kernels, each advancing ``clock`` by ``seconds[name]`` per call and counting its
    calls and the backward passes through its output."""

    def __init__(self, clock: FakeClock, seconds: dict[str, float]) -> None:
        real = {"sdpa": sdpa_attention, "explicit": explicit_attention}
        super().__init__({name: self._slowed(name, kernel) for name, kernel in real.items()})
        self.clock, self.seconds = clock, seconds
        self.calls: Counter = Counter()
        self.backwards: Counter = Counter()

    def _slowed(self, name: str, kernel: Callable) -> Callable:
        def call(q: torch.Tensor, *args: object):
            self.clock.now += self.seconds[name]
            self.calls[name] += 1
            result = kernel(q, *args)
            out = result[0] if isinstance(result, tuple) else result
            if out.requires_grad:
                out.register_hook(lambda grad: self.backwards.update([name]))
            return result

        return call


def fake_tuner(sdpa_s: float, explicit_s: float) -> tuple[Autotuner, FakeKernels]:
    clock = FakeClock()
    kernels = FakeKernels(clock, {"sdpa": sdpa_s, "explicit": explicit_s})
    return Autotuner(kernels, clock=clock), kernels


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(attention_kernels.IMPL_ENV, raising=False)
    monkeypatch.delenv(autotune.CACHE_ENV, raising=False)


@pytest.fixture
def use_tuner(monkeypatch: pytest.MonkeyPatch) -> Callable[[float, float], FakeKernels]:
    """Install a fake-clock autotuner as the process-wide one for the module under test."""

    def install(sdpa_s: float, explicit_s: float) -> FakeKernels:
        tuner, kernels = fake_tuner(sdpa_s, explicit_s)
        monkeypatch.setattr(attention_kernels, "AUTOTUNER", tuner)
        return kernels

    return install


@pytest.fixture
def module_calls(monkeypatch: pytest.MonkeyPatch) -> Counter:
    """Which kernel the module itself ran (the autotuner's measurement calls are not counted)."""
    calls: Counter = Counter()
    for name in ("sdpa", "explicit"):
        kernel = getattr(attention_module, f"{name}_attention")

        def counting(*args, name=name, kernel=kernel):
            calls[name] += 1
            return kernel(*args)

        monkeypatch.setattr(attention_module, f"{name}_attention", counting)
    return calls


def qk(
    tokens: int = TOKENS, dtype: torch.dtype = torch.float32, grad: bool = False, batch: int = BATCH
) -> tuple[torch.Tensor, torch.Tensor]:
    """Self-attention queries and keys ``[batch, HEADS, tokens, DIM / HEADS]``."""
    q = torch.randn(batch, HEADS, tokens, DIM // HEADS, dtype=dtype, requires_grad=grad)
    return q, q


# ------------------------------------------------------------------------------ the choice
@pytest.mark.parametrize(("sdpa_s", "explicit_s", "expected"), [(2e-3, 1e-3, "explicit"), (1e-3, 2e-3, "sdpa")])
def test_the_faster_kernel_is_chosen_when_the_other_is_slow(sdpa_s: float, explicit_s: float, expected: str) -> None:
    tuner, _ = fake_tuner(sdpa_s, explicit_s)
    assert tuner.choose(*qk(), masked=False, dropout_p=0.0, scale=0.5) == expected


@pytest.mark.parametrize(("advantage", "expected"), [(0.99, "sdpa"), (1.01, "explicit")])
def test_explicit_must_beat_sdpa_by_the_margin(advantage: float, expected: str) -> None:
    # explicit's time is sdpa's divided by (1 + margin) * advantage: just inside / outside the margin
    tuner, _ = fake_tuner(1e-3, 1e-3 / ((1.0 + EXPLICIT_MARGIN) * advantage))
    assert tuner.choose(*qk(), masked=False, dropout_p=0.0, scale=0.5) == expected


def test_measurement_is_interleaved_warmed_up_and_stops_at_the_budget() -> None:
    fast, _ = fake_tuner(1e-3, 1e-3)
    fast.choose(*qk(), masked=False, dropout_p=0.0, scale=0.5)
    assert fast.report()[0]["cost_ms"] == pytest.approx(2 * (1 + autotune.MEASURE_ROUNDS))  # 1 warm-up + 7 rounds
    slow, kernels = fake_tuner(0.2, 0.2)  # 0.4 s per round: over budget, so three rounds only
    slow.choose(*qk(), masked=False, dropout_p=0.0, scale=0.5)
    assert kernels.calls == Counter(sdpa=4, explicit=4)
    row = slow.report()[0]
    assert row["cost_ms"] == pytest.approx(1600) and row["sdpa_ms"] == pytest.approx(200)


def test_training_keys_time_forward_and_backward_inference_keys_forward_only() -> None:
    tuner, kernels = fake_tuner(1e-3, 1e-3)
    tuner.choose(*qk(grad=True), masked=False, dropout_p=0.0, scale=0.5)
    assert kernels.backwards == kernels.calls and kernels.calls["sdpa"] > 0
    kernels.calls.clear(), kernels.backwards.clear()
    with torch.no_grad():
        tuner.choose(*qk(grad=True), masked=False, dropout_p=0.0, scale=0.5)
    assert kernels.backwards == Counter() and kernels.calls["sdpa"] > 0
    assert [row["training"] for row in tuner.report()] == [True, False]


# ------------------------------------------------------------------------------ keys and the cache
def test_bucket_is_the_nearest_power_of_two() -> None:
    assert [bucket(n) for n in (1, 3, 17, 50, 65, 96, 197, 1024)] == [1, 4, 16, 64, 64, 128, 256, 1024]


def test_each_key_is_measured_once_and_nearby_shapes_share_a_key() -> None:
    tuner, kernels = fake_tuner(1e-3, 2e-3)
    measurements = lambda: kernels.calls["sdpa"]  # noqa: E731
    tuner.choose(*qk(60), masked=False, dropout_p=0.0, scale=0.5)
    once = measurements()
    tuner.choose(*qk(60), masked=False, dropout_p=0.0, scale=0.5)
    tuner.choose(*qk(70), masked=False, dropout_p=0.0, scale=0.5)  # 60 and 70 both bucket to 64
    assert measurements() == once
    for q, k, masked, dropout in [
        (*qk(60, batch=3), False, 0.0),  # 12 and 16 batch x heads: one new key (16)
        (*qk(60, batch=4), False, 0.0),
        (*qk(100), False, 0.0),  # 128 tokens
        (*qk(60, dtype=torch.bfloat16), False, 0.0),
        (*qk(60, grad=True), False, 0.0),
        (*qk(60), True, 0.0),
        (*qk(60), False, 0.1),
    ]:
        tuner.choose(q, k, masked=masked, dropout_p=dropout, scale=0.5)
    assert measurements() == 7 * once
    assert len(tuner.report()) == 7


def test_choices_round_trip_through_the_cache_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "autotune.json"
    first, _ = fake_tuner(2e-3, 1e-3)
    first.set_cache_path(path)
    assert first.choose(*qk(), masked=False, dropout_p=0.0, scale=0.5) == "explicit"

    monkeypatch.setenv(autotune.CACHE_ENV, str(path))
    second, kernels = fake_tuner(1e-3, 2e-3)  # would measure "sdpa"
    assert second.choose(*qk(), masked=False, dropout_p=0.0, scale=0.5) == "explicit"
    assert kernels.calls == Counter()
    assert second.report()[0]["source"] == "cache"

    monkeypatch.setattr(torch, "__version__", "0.0.0-other")  # another torch measures again
    third, kernels = fake_tuner(1e-3, 2e-3)
    third.set_cache_path(path)
    assert third.choose(*qk(), masked=False, dropout_p=0.0, scale=0.5) == "sdpa"
    entries = json.loads(path.read_text())["entries"]
    assert len(entries) == 2 and sum(text.startswith("torch 0.0.0-other") for text in entries) == 1


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_a_fifo_as_cache_file_is_refused_without_blocking_and_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "autotune.fifo"
    os.mkfifo(path)
    tuner, kernels = fake_tuner(2e-3, 1e-3)
    tuner.set_cache_path(path)
    with pytest.warns(UserWarning, match="is not a regular file"):  # reading a FIFO would block forever
        assert tuner.choose(*qk(), masked=False, dropout_p=0.0, scale=0.5) == "explicit"
    assert kernels.calls["explicit"] > 0
    assert stat.S_ISFIFO(os.stat(path).st_mode)  # not replaced by the measured choices


def test_a_corrupt_cache_file_is_ignored_with_a_warning_and_kept(tmp_path: Path) -> None:
    path = tmp_path / "autotune.json"
    path.write_text("{not json")
    tuner, kernels = fake_tuner(2e-3, 1e-3)
    tuner.set_cache_path(path)
    with pytest.warns(UserWarning, match="autotune cache .* is unreadable"):
        assert tuner.choose(*qk(), masked=False, dropout_p=0.0, scale=0.5) == "explicit"
    assert kernels.calls["explicit"] > 0
    assert path.read_text() == "{not json"


def test_report_lists_the_chosen_kernel_per_key_with_timings(use_tuner) -> None:
    use_tuner(2e-3, 1e-3)
    MultiHeadSelfAttention(DIM, HEADS)(torch.randn(BATCH, TOKENS, DIM))
    (row,) = autotune_report()
    assert row["kernel"] == "explicit" and row["sdpa_ms"] == pytest.approx(2.0) and row["speedup"] == pytest.approx(2.0)
    assert (row["head_dim"], row["queries"], row["batch_heads"], row["dtype"]) == (DIM // HEADS, 8, 8, "float32")
    assert "| explicit | 2.000 | 1.000 | 2.00 |" in format_autotune_report([row])


# ------------------------------------------------------------------------------ the module
@pytest.mark.parametrize(("sdpa_s", "explicit_s", "expected"), [(2e-3, 1e-3, "explicit"), (1e-3, 2e-3, "sdpa")])
def test_auto_module_runs_the_measured_kernel(use_tuner, module_calls: Counter, sdpa_s: float, explicit_s: float, expected: str) -> None:
    use_tuner(sdpa_s, explicit_s)
    msa = MultiHeadSelfAttention(DIM, HEADS)
    msa(torch.randn(BATCH, TOKENS, DIM))
    msa(torch.randn(BATCH, TOKENS, DIM))
    assert module_calls == Counter({expected: 2})


@pytest.mark.parametrize("pinned", ["sdpa", "explicit"])
def test_pinned_kernel_and_environment_variable_bypass_measurement(
    use_tuner, module_calls: Counter, monkeypatch: pytest.MonkeyPatch, pinned: str
) -> None:
    kernels = use_tuner(1.0, 1.0)
    x = torch.randn(BATCH, TOKENS, DIM)
    MultiHeadSelfAttention(DIM, HEADS, attn_impl=pinned)(x)
    monkeypatch.setenv(attention_kernels.IMPL_ENV, pinned)
    MultiHeadSelfAttention(DIM, HEADS)(x)
    assert module_calls == Counter({pinned: 2})
    assert kernels.calls == Counter() and autotune_report() == []


def test_an_unknown_kernel_in_the_environment_is_a_clear_error_at_construction(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(attention_kernels.IMPL_ENV, "flash")
    with pytest.raises(VitkitError, match="VITKIT_ATTN_IMPL='flash' is not an attention kernel; use one of auto"):
        MultiHeadSelfAttention(DIM, HEADS)


def test_the_environment_pin_is_read_once_when_the_module_is_built(
    use_tuner, module_calls: Counter, monkeypatch: pytest.MonkeyPatch
) -> None:
    kernels = use_tuner(2e-3, 1e-3)  # the autotuner would choose explicit
    monkeypatch.setenv(attention_kernels.IMPL_ENV, "sdpa")
    msa = MultiHeadSelfAttention(DIM, HEADS)
    monkeypatch.setattr(attention_kernels.os, "environ", {})  # reading the environment now would see no pin
    msa(torch.randn(BATCH, TOKENS, DIM))
    assert msa.attn_impl == "sdpa" and module_calls == Counter(sdpa=1) and kernels.calls == Counter()


def test_keys_asked_inside_a_recording_are_collected(use_tuner) -> None:
    use_tuner(2e-3, 1e-3)
    msa = MultiHeadSelfAttention(DIM, HEADS)
    msa(torch.randn(BATCH, TOKENS, DIM))  # outside: not recorded
    with attention_kernels.AUTOTUNER.recording() as asked:
        msa(torch.randn(BATCH, TOKENS, DIM))
        msa(torch.randn(BATCH, 3 * TOKENS, DIM))
    assert sorted(key.queries for key in asked) == [8, 32]


@pytest.mark.parametrize("faster", ["sdpa", "explicit"])
@pytest.mark.parametrize("mask", [{}, {"attn_bias": causal_mask(TOKENS, TOKENS)}])
def test_auto_matches_each_kernel_in_output_and_gradients(use_tuner, faster: str, mask: dict) -> None:
    use_tuner(*((1e-3, 2e-3) if faster == "sdpa" else (2e-3, 1e-3)))
    auto = MultiHeadSelfAttention(DIM, HEADS, qk_norm=True).train()
    x = torch.randn(BATCH, TOKENS, DIM, requires_grad=True)
    out = auto(x, **mask)
    (grad,) = torch.autograd.grad(out.square().sum(), x)
    for kernel in ("sdpa", "explicit"):
        pinned = MultiHeadSelfAttention(DIM, HEADS, qk_norm=True, attn_impl=kernel).train()
        pinned.load_state_dict(auto.state_dict())
        pinned_out = pinned(x, **mask)
        (pinned_grad,) = torch.autograd.grad(pinned_out.square().sum(), x)
        torch.testing.assert_close(out, pinned_out, **TOL)
        torch.testing.assert_close(grad, pinned_grad, **TOL)
    assert autotune_report()[0]["masked"] == bool(mask)


def test_measurement_leaves_the_random_stream_alone(use_tuner) -> None:
    use_tuner(1e-3, 2e-3)
    msa = MultiHeadSelfAttention(DIM, HEADS, attn_drop=0.5).train()
    x = torch.randn(BATCH, TOKENS, DIM)
    torch.manual_seed(1)
    measured = msa(x)  # measures (with dropout) first
    torch.manual_seed(1)
    cached = msa(x)
    assert autotune_report()[0]["dropout"] is True
    torch.testing.assert_close(measured, cached, rtol=0, atol=0)


def test_key_dtype_is_the_autocast_compute_dtype(use_tuner) -> None:
    use_tuner(1e-3, 2e-3)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        MultiHeadSelfAttention(DIM, HEADS)(torch.randn(BATCH, TOKENS, DIM))
    assert autotune_report()[0]["dtype"] == "bfloat16"


def test_nothing_is_measured_while_compiling_or_counting_flops(use_tuner, module_calls: Counter) -> None:
    kernels = use_tuner(2e-3, 1e-3)
    msa = MultiHeadSelfAttention(DIM, HEADS).eval()
    x = torch.randn(BATCH, TOKENS, DIM)
    torch.compile(msa, backend="eager", fullgraph=True)(x)
    with FlopCounterMode(display=False):
        msa(x)
    assert kernels.calls == Counter() and autotune_report() == []
    assert module_calls == Counter(sdpa=2)


def test_measuring_inside_an_activation_checkpoint_gives_the_plain_gradients(use_tuner) -> None:
    use_tuner(2e-3, 1e-3)
    torch.manual_seed(0)
    model = vitkit.create_model("vit_cifar_tiny", attn_impl="explicit")
    images = torch.randn(2, 3, 32, 32)
    model(images).square().sum().backward()
    expected = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    for block in model.blocks:
        block.attn.attn_impl = "auto"
    model.set_grad_checkpointing(True)
    model(images).square().sum().backward()
    assert autotune_report()[0]["training"] is True
    for grad, reference in zip((p.grad for p in model.parameters()), expected):
        torch.testing.assert_close(grad, reference, **TOL)


def test_autotune_key_names_the_device_and_torch_version() -> None:
    key = AutotuneKey.of(*qk(), masked=False, dropout_p=0.0)
    assert key.device.startswith(autotune.cpu_model()) and f"({torch.get_num_threads()} threads)" in key.device
    assert key.to_text().startswith(f"torch {torch.__version__} | device=")
