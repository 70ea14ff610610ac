"""A training run chooses its attention kernel on its own steps (A/B pairs of whole steps).

Step times are injected, never measured: the decision logic gets fake seconds, and the callback
a fake clock that advances by the time the kernel set on the model "costs", so every choice here
is deterministic.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

import vitkit
from vitkit.layers import MultiHeadSelfAttention
from vitkit.train.kernel_trial import (
    DRIFT_WINDOW,
    MIN_PAIRS,
    RECHECK_AFTER_STEPS,
    STEPS_TO_CHOOSE,
    KernelTrial,
    TrainingKernelChooser,
)

KEY = "32x3x8x8"


def run_trial(seconds: Callable[[int, str], float], steps: int) -> tuple[KernelTrial, list[str]]:
    """Drive a trial for ``steps`` steps of one key; ``seconds(step, kernel)`` is a step's time."""
    trial, ran = KernelTrial(), []
    for step in range(steps):
        kernel = trial.kernel_for(KEY, step)
        trial.record(KEY, kernel, seconds(step, kernel), step)
        ran.append(kernel)
    return trial, ran


def explicit_twice_as_fast(step: int, kernel: str) -> float:
    return {"sdpa": 0.040, "explicit": 0.020}[kernel]


# ------------------------------------------------------------------------------ the decision
@pytest.mark.parametrize(("times", "expected"), [({"sdpa": 0.024, "explicit": 0.020}, "explicit"),
                                                 ({"sdpa": 0.020, "explicit": 0.024}, "sdpa")])
def test_a_faster_kernel_wins_within_the_stated_number_of_steps(times: dict[str, float], expected: str) -> None:
    trial, ran = run_trial(lambda step, kernel: times[kernel], STEPS_TO_CHOOSE + 20)
    assert STEPS_TO_CHOOSE == 12
    assert ran[STEPS_TO_CHOOSE:] == [expected] * 20  # chosen after 2 warm-up steps and 5 pairs, kept
    # warm-up one each, then pairs in alternating order: AB, BA, AB, ...
    assert ran[:6] == ["sdpa", "explicit", "sdpa", "explicit", "explicit", "sdpa"]
    (row,) = trial.report()
    assert row["final_kernel"] == expected and row["pairs"] == MIN_PAIRS and row["remeasured"] == []
    (first,) = row["rounds"]
    assert first["median_ratio_sdpa_over_explicit"] == pytest.approx(times["sdpa"] / times["explicit"], rel=1e-3)
    assert first["spread"] == 0.0 and first["median_s"] == pytest.approx(times)
    # the slower kernel's extra time: 5 pairs x 4 ms; 6 of the 32 steps ran the slower kernel
    assert row["ab_extra_s"] == pytest.approx(5 * 0.004)
    assert row["steps"] == {expected: 26, ({"sdpa", "explicit"} - {expected}).pop(): 6}


@pytest.mark.parametrize("seed", range(10))
def test_equal_kernels_keep_sdpa(seed: int) -> None:
    noise = random.Random(seed)
    trial, ran = run_trial(lambda step, kernel: 0.030 * noise.uniform(0.98, 1.02), 200)
    (row,) = trial.report()
    assert row["final_kernel"] == "sdpa" and ran[-50:] == ["sdpa"] * 50


def test_a_load_spike_on_the_faster_kernels_first_pairs_still_ends_with_it() -> None:
    def spiked(step: int, kernel: str) -> float:
        # the first three pairs' explicit steps (steps 2-7) run during a spike: 5x slower
        return 0.100 if kernel == "explicit" and 2 <= step < 8 else explicit_twice_as_fast(step, kernel)

    trial, ran = run_trial(spiked, 200)
    (row,) = trial.report()
    first, second = row["rounds"][:2]
    assert first["kernel"] == "sdpa" and first["spread"] > 0.25  # fooled, but the evidence is weak
    assert second["reason"].startswith("weak evidence") and second["step"] == STEPS_TO_CHOOSE - 1 + RECHECK_AFTER_STEPS
    assert row["final_kernel"] == "explicit" and ran[-50:] == ["explicit"] * 50


def test_a_startup_load_that_favours_the_slower_kernel_is_measured_again_when_it_ends() -> None:
    def loaded(step: int, kernel: str) -> float:
        # the first 40 steps share the cores with other jobs, and the load hurts explicit more:
        # it measures 0.67x of SDPA, with narrow spread, so the first choice is SDPA
        if step < 40:
            return {"sdpa": 0.060, "explicit": 0.090}[kernel]
        return explicit_twice_as_fast(step, kernel)

    trial, ran = run_trial(loaded, 200)
    (row,) = trial.report()
    first, second = row["rounds"][:2]
    assert first["kernel"] == "sdpa" and first["spread"] == 0.0
    assert second["reason"].startswith("drift: sdpa steps took 40.0 ms, 60.0 ms at the choice")
    assert 40 < second["step"] <= 40 + DRIFT_WINDOW  # once most of the drift window ran on the idle machine
    assert row["final_kernel"] == "explicit" and ran[-50:] == ["explicit"] * 50


def test_remeasurement_rounds_are_bounded() -> None:
    def alternating_load(step: int, kernel: str) -> float:  # the step time keeps jumping: drift forever
        return explicit_twice_as_fast(step, kernel) * (3.0 if (step // 30) % 2 else 1.0)

    trial, _ = run_trial(alternating_load, 1000)
    assert len(trial.report()[0]["rounds"]) == 4


def test_each_batch_shape_is_its_own_key() -> None:
    trial = KernelTrial()
    trial.record("a", trial.kernel_for("a", 0), 0.01, 0)
    assert trial.kernel_for("b", 1) == "sdpa"  # "b" starts its own warm-up
    assert [row["key"] for row in trial.report()] == ["a", "b"]


# ------------------------------------------------------------------------------ the callback
def tiny_model(**overrides: float) -> torch.nn.Module:
    torch.manual_seed(0)
    return vitkit.create_model("vit_cifar_tiny", img_size=8, patch_size=4, embed_dim=32, depth=2, num_heads=2,
                               num_classes=5, **overrides)


class StepClock:
    """A fake clock read twice per step (start, end): the end reads ``seconds[kernel]`` later,
    the kernel being the one set on ``model``'s attention when the step ends."""

    def __init__(self, model: torch.nn.Module, seconds: dict[str, float]) -> None:
        self.model, self.seconds, self.now, self.reads = model, seconds, 0.0, 0

    def __call__(self) -> float:
        self.reads += 1
        if self.reads % 2 == 0:
            self.now += self.seconds[self.model.blocks[0].attn.kernel_policy]
        return self.now


def train_step(model: torch.nn.Module, images: torch.Tensor, labels: torch.Tensor) -> list[torch.Tensor]:
    model.zero_grad(set_to_none=True)
    F.cross_entropy(model(images), labels).backward()
    return [p.grad.clone() for p in model.parameters() if p.grad is not None]


def test_the_callback_sets_the_kernel_on_every_auto_module_and_restores_auto_after_the_step() -> None:
    model = tiny_model().train()
    pinned = MultiHeadSelfAttention(32, 2, attn_impl="sdpa")
    model.add_module("extra", pinned)  # a pinned module is never changed
    chooser = TrainingKernelChooser(clock=StepClock(model, {"sdpa": 0.03, "explicit": 0.02}))
    chooser.setup(None, model, "fit")
    batch = (torch.randn(4, 3, 8, 8), torch.randint(0, 5, (4,)))
    seen = []
    for step in range(STEPS_TO_CHOOSE + 3):
        chooser.on_train_batch_start(SimpleNamespace(global_step=step), model, batch, step)
        seen.append({block.attn.kernel_policy for block in model.blocks})
        train_step(model, *batch)
        chooser.on_train_batch_end(SimpleNamespace(global_step=step + 1), model, None, batch, step)
        assert {block.attn.kernel_policy for block in model.blocks} == {"auto"} and pinned.kernel_policy == "sdpa"
    assert all(len(kernels) == 1 for kernels in seen)
    assert seen[-3:] == [{"explicit"}] * 3
    (row,) = chooser.report()["keys"]
    assert row["key"] == "4x3x8x8" and row["final_kernel"] == "explicit"


def test_a_pinned_model_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VITKIT_ATTN_IMPL", "explicit")
    model = tiny_model()
    chooser = TrainingKernelChooser(clock=StepClock(model, {"sdpa": 0.03, "explicit": 0.02}))
    chooser.setup(None, model, "fit")
    chooser.on_train_batch_start(SimpleNamespace(global_step=0), model, (torch.randn(4, 3, 8, 8),), 0)
    assert {block.attn.kernel_policy for block in model.blocks} == {"explicit"}
    assert "pinned" in chooser.report()


def test_ab_steps_compute_the_update_either_kernel_alone_would() -> None:
    # dropout everywhere it applies (attention weights, projections, stochastic depth): the masks
    # come from the same random stream whichever kernel runs
    model = tiny_model(attn_drop_rate=0.2, proj_drop_rate=0.1, drop_path_rate=0.1).train()
    chooser = TrainingKernelChooser(clock=StepClock(model, {"sdpa": 0.03, "explicit": 0.02}))
    chooser.setup(None, model, "fit")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    torch.manual_seed(1)
    batches = [(torch.randn(4, 3, 8, 8), torch.randint(0, 5, (4,))) for _ in range(STEPS_TO_CHOOSE)]
    ran = set()
    for step, batch in enumerate(batches):
        weights, rng = {k: v.clone() for k, v in model.state_dict().items()}, torch.get_rng_state()
        alone = {}
        for kernel in ("sdpa", "explicit"):
            model.load_state_dict(weights)
            torch.set_rng_state(rng)
            for block in model.blocks:
                block.attn.kernel_policy = kernel
            alone[kernel] = (train_step(model, *batch), torch.get_rng_state())
        model.load_state_dict(weights)
        torch.set_rng_state(rng)
        for block in model.blocks:
            block.attn.kernel_policy = "auto"
        chooser.on_train_batch_start(SimpleNamespace(global_step=step), model, batch, step)
        ran.add(model.blocks[0].attn.kernel_policy)
        grads = train_step(model, *batch)
        chooser.on_train_batch_end(SimpleNamespace(global_step=step + 1), model, None, batch, step)
        for reference, rng_after in alone.values():
            assert torch.equal(torch.get_rng_state(), rng_after)  # same random stream consumed
            for grad, expected in zip(grads, reference):
                torch.testing.assert_close(grad, expected, rtol=1e-5, atol=1e-5)
        optimizer.step()
    assert ran == {"sdpa", "explicit"}
