"""A training run chooses its attention kernel on its own steps (A/B pairs of whole steps).

Step times are injected, never measured: the decision logic gets fake seconds, and the callback
a fake clock that advances by the time the kernel set on the model "costs", so every choice here
is deterministic. Two DDP ranks are simulated by two trials whose decisions pass through a fake
broadcast from the first.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from tiny_runs import short_recipe

import vitkit
from vitkit.layers import MultiHeadSelfAttention
from vitkit.train import kernel_trial, train
from vitkit.train.kernel_trial import (
    DRIFT_WINDOW,
    MIN_PAIRS,
    RECHECK_AFTER_STEPS,
    STEPS_TO_CHOOSE,
    KernelTrial,
    TrainingKernelChooser,
)

KEY = "32x3x8x8"


def run_trial(seconds: Callable[[int, str], float], steps: int, watch_drift: bool = True) -> tuple[KernelTrial, list[str]]:
    """Drive a trial for ``steps`` steps of one key as the callback does (a step is recorded when
    the trial times it); ``seconds(step, kernel)`` is a step's time."""
    trial, ran = KernelTrial(watch_drift), []
    for step in range(steps):
        kernel = trial.kernel_for(KEY, step)
        if trial.timing(KEY) is not None:
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
    assert STEPS_TO_CHOOSE == 14
    assert ran[STEPS_TO_CHOOSE:] == [expected] * 20  # chosen after 2 warm-up steps and 6 pairs, kept
    # warm-up one each, then pairs in alternating order: AB, BA, AB, ...
    assert ran[:6] == ["sdpa", "explicit", "sdpa", "explicit", "explicit", "sdpa"]
    (row,) = trial.report()
    assert row["final_kernel"] == expected and row["pairs"] == MIN_PAIRS and row["remeasured"] == []
    (first,) = row["rounds"]
    assert first["median_ratio_sdpa_over_explicit"] == pytest.approx(times["sdpa"] / times["explicit"], rel=1e-3)
    assert first["spread"] == 0.0 and first["median_s"] == pytest.approx(times)
    # the slower kernel's extra time: 6 pairs x 4 ms; 7 of the 34 steps ran the slower kernel
    assert row["ab_extra_s"] == pytest.approx(6 * 0.004)
    assert row["steps"] == {expected: 27, ({"sdpa", "explicit"} - {expected}).pop(): 7}


@pytest.mark.parametrize("seed", range(10))
def test_equal_kernels_keep_sdpa(seed: int) -> None:
    noise = random.Random(seed)
    trial, ran = run_trial(lambda step, kernel: 0.030 * noise.uniform(0.98, 1.02), 200)
    (row,) = trial.report()
    assert row["final_kernel"] == "sdpa" and ran[-50:] == ["sdpa"] * 50


def first_in_pair(penalty: float, times: dict[str, float], seed: int) -> Callable[[int, str], float]:
    """Step times with noise, the first step of each timed pair ``penalty`` slower (a cold cache
    after the other kernel's step); pairs start at the even steps after the two warm-up steps."""
    noise = random.Random(seed)
    return lambda step, kernel: times[kernel] * noise.uniform(0.98, 1.02) * (1.0 + penalty * (step % 2 == 0))


@pytest.mark.parametrize("seed", range(20))
def test_a_first_in_pair_penalty_cancels_and_equal_kernels_keep_sdpa(seed: int) -> None:
    # with 5 pairs (3 AB, 2 BA) and the median of their ratios, an 8% penalty chose explicit in ~60% of seeds
    trial, _ = run_trial(first_in_pair(0.08, {"sdpa": 0.030, "explicit": 0.030}, seed), STEPS_TO_CHOOSE)
    (row,) = trial.report()
    assert row["final_kernel"] == "sdpa"
    assert row["rounds"][0]["median_ratio_sdpa_over_explicit"] == pytest.approx(1.0, abs=0.03)


@pytest.mark.parametrize("seed", range(5))
def test_a_first_in_pair_penalty_does_not_hide_a_faster_explicit_kernel(seed: int) -> None:
    trial, _ = run_trial(first_in_pair(0.08, {"sdpa": 0.033, "explicit": 0.030}, seed), STEPS_TO_CHOOSE)
    (row,) = trial.report()
    assert row["final_kernel"] == "explicit"
    assert row["rounds"][0]["median_ratio_sdpa_over_explicit"] == pytest.approx(1.1, abs=0.03)


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
    # at the end of the first window of which most steps ran on the idle machine
    assert 40 < second["step"] <= 40 + 2 * DRIFT_WINDOW
    assert row["final_kernel"] == "explicit" and ran[-50:] == ["explicit"] * 50


def test_without_the_drift_watch_a_confident_choice_is_final_and_never_timed_again() -> None:
    loaded = {"sdpa": 0.060, "explicit": 0.090}
    trial, ran = run_trial(lambda step, kernel: loaded[kernel] if step < 40 else explicit_twice_as_fast(step, kernel),
                           200, watch_drift=False)
    (row,) = trial.report()
    assert row["final"] and row["final_kernel"] == "sdpa" and row["remeasured"] == []  # the GPU keeps its choice
    assert trial.timing(KEY) is None and ran[STEPS_TO_CHOOSE:] == ["sdpa"] * (200 - STEPS_TO_CHOOSE)


def test_without_the_drift_watch_weak_evidence_is_still_measured_again_once() -> None:
    def spiked(step: int, kernel: str) -> float:
        return 0.100 if kernel == "explicit" and 2 <= step < 8 else explicit_twice_as_fast(step, kernel)

    trial = KernelTrial(watch_drift=False)
    timed = []
    for step in range(200):
        kernel = trial.kernel_for(KEY, step)
        if trial.timing(KEY) is not None:
            trial.record(KEY, kernel, spiked(step, kernel), step)
            timed.append(step)
    (row,) = trial.report()
    recheck = STEPS_TO_CHOOSE - 1 + RECHECK_AFTER_STEPS
    assert [r["step"] for r in row["remeasured"]] == [recheck] and row["final"] and row["final_kernel"] == "explicit"
    # timed: the first round, then nothing until the re-measurement, then nothing again
    assert timed == list(range(STEPS_TO_CHOOSE)) + list(range(recheck, recheck + 2 * MIN_PAIRS))


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


def test_two_ranks_with_opposite_timings_run_the_same_kernel_at_every_step() -> None:
    # rank 0 measures SDPA faster, rank 1 explicit; rank 1 also sees a drift rank 0 does not. Every
    # decision's evidence is rank 0's (a fake broadcast), so rank 1 follows it step by step.
    times = [lambda step, kernel: {"sdpa": 0.020, "explicit": 0.030}[kernel],
             lambda step, kernel: {"sdpa": 0.030, "explicit": 0.020}[kernel] * (1.0 if step < 40 else 3.0)]
    trials, ran, sent = [KernelTrial(), KernelTrial()], [[], []], []

    def broadcast(rank: int) -> Callable[[object], object]:
        def send_or_receive(value: object) -> object:
            if rank == 0:
                sent.append(value)
                return value
            return sent.pop(0)
        return send_or_receive

    for step in range(200):
        for rank, trial in enumerate(trials):
            kernel = trial.kernel_for(KEY, step)
            if trial.timing(KEY) is not None:
                trial.record(KEY, kernel, times[rank](step, kernel), step, agree=broadcast(rank))
            ran[rank].append(kernel)
    assert ran[0] == ran[1] and ran[0][STEPS_TO_CHOOSE:] == ["sdpa"] * (200 - STEPS_TO_CHOOSE)
    assert trials[0].report() == trials[1].report() and trials[1].report()[0]["remeasured"] == []
    assert not sent  # every broadcast was received


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
            self.now += self.seconds[self.model.blocks[0].attn.attn_impl]
        return self.now


def fake_trainer(step: int) -> SimpleNamespace:
    """What the callback reads of a one-process trainer: the step and a broadcast that returns its object."""
    return SimpleNamespace(global_step=step, world_size=1, strategy=SimpleNamespace(broadcast=lambda obj, src: obj))


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
    chooser.on_train_start(None, model)
    batch = (torch.randn(4, 3, 8, 8), torch.randint(0, 5, (4,)))
    seen = []
    for step in range(STEPS_TO_CHOOSE + 3):
        chooser.on_train_batch_start(fake_trainer(step), model, batch, step)
        seen.append({block.attn.attn_impl for block in model.blocks})
        train_step(model, *batch)
        chooser.on_train_batch_end(fake_trainer(step + 1), model, None, batch, step)
        assert {block.attn.attn_impl for block in model.blocks} == {"auto"} and pinned.attn_impl == "sdpa"
    assert all(len(kernels) == 1 for kernels in seen)
    assert seen[-3:] == [{"explicit"}] * 3
    (row,) = chooser.report()["keys"]
    assert row["key"] == "4x3x8x8" and row["final_kernel"] == "explicit"


@pytest.mark.parametrize(("watch_drift", "clock_reads_per_step"), [(False, 0), (True, 2)])
def test_no_synchronize_once_the_choice_is_made(
    monkeypatch: pytest.MonkeyPatch, watch_drift: bool, clock_reads_per_step: int
) -> None:
    # watch_drift=False is the GPU's policy: neither synchronised nor timed after the choice;
    # the CPU's drift watch reads the clock but never synchronises
    synchronized = []
    monkeypatch.setattr(kernel_trial, "wait_for_device", lambda pl_module: synchronized.append(pl_module))
    model = tiny_model().train()
    clock = StepClock(model, {"sdpa": 0.03, "explicit": 0.02})
    chooser = TrainingKernelChooser(clock=clock, watch_drift=watch_drift)
    chooser.setup(None, model, "fit")
    chooser.on_train_start(None, model)
    batch = (torch.randn(4, 3, 8, 8), torch.randint(0, 5, (4,)))
    calls = []
    for step in range(STEPS_TO_CHOOSE + 15):
        before, reads = len(synchronized), clock.reads
        chooser.on_train_batch_start(fake_trainer(step), model, batch, step)
        train_step(model, *batch)
        chooser.on_train_batch_end(fake_trainer(step + 1), model, None, batch, step)
        calls.append((len(synchronized) - before, clock.reads - reads))
    assert calls[:STEPS_TO_CHOOSE] == [(2, 2)] * STEPS_TO_CHOOSE  # before and after each measured step
    assert calls[STEPS_TO_CHOOSE:] == [(0, clock_reads_per_step)] * 15
    (row,) = chooser.report()["keys"]
    assert row["final_kernel"] == "explicit" and row["final"] is not watch_drift


def test_the_drift_watch_is_on_for_a_cpu_module_only_unless_told() -> None:
    on_gpu = SimpleNamespace(device=torch.device("cuda", 0))  # what the callback reads of a LightningModule
    for module, watch_drift, expected in [(tiny_model(), None, True), (tiny_model(), False, False),
                                          (on_gpu, None, False), (on_gpu, True, True)]:
        chooser = TrainingKernelChooser(watch_drift=watch_drift)
        chooser.on_train_start(None, module)
        assert chooser.trial.watch_drift is expected


def test_a_pinned_model_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VITKIT_ATTN_IMPL", "explicit")
    model = tiny_model()
    chooser = TrainingKernelChooser(clock=StepClock(model, {"sdpa": 0.03, "explicit": 0.02}))
    chooser.setup(None, model, "fit")
    chooser.on_train_start(None, model)
    chooser.on_train_batch_start(fake_trainer(0), model, (torch.randn(4, 3, 8, 8),), 0)
    assert {block.attn.attn_impl for block in model.blocks} == {"explicit"}
    assert "pinned" in chooser.report()


def test_ab_steps_compute_the_update_either_kernel_alone_would() -> None:
    # dropout everywhere it applies (attention weights, projections, stochastic depth): the masks
    # come from the same random stream whichever kernel runs
    model = tiny_model(attn_drop_rate=0.2, proj_drop_rate=0.1, drop_path_rate=0.1).train()
    chooser = TrainingKernelChooser(clock=StepClock(model, {"sdpa": 0.03, "explicit": 0.02}))
    chooser.setup(None, model, "fit")
    chooser.on_train_start(None, model)
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
                block.attn.attn_impl = kernel
            alone[kernel] = (train_step(model, *batch), torch.get_rng_state())
        model.load_state_dict(weights)
        torch.set_rng_state(rng)
        for block in model.blocks:
            block.attn.attn_impl = "auto"
        chooser.on_train_batch_start(fake_trainer(step), model, batch, step)
        ran.add(model.blocks[0].attn.attn_impl)
        grads = train_step(model, *batch)
        chooser.on_train_batch_end(fake_trainer(step + 1), model, None, batch, step)
        for reference, rng_after in alone.values():
            assert torch.equal(torch.get_rng_state(), rng_after)  # same random stream consumed
            for grad, expected in zip(grads, reference):
                torch.testing.assert_close(grad, expected, rtol=1e-5, atol=1e-5)
        optimizer.step()
    assert ran == {"sdpa", "explicit"}


def test_a_deterministic_run_pins_sdpa_for_the_whole_run_and_never_reads_the_clock() -> None:
    model = tiny_model().train()
    clock = StepClock(model, {"sdpa": 0.03, "explicit": 0.02})  # explicit would win a measurement
    chooser = TrainingKernelChooser(clock=clock, pin="sdpa")
    chooser.setup(None, model, "fit")
    chooser.on_train_start(None, model)
    batch = (torch.randn(4, 3, 8, 8), torch.randint(0, 5, (4,)))
    for step in range(STEPS_TO_CHOOSE + 5):
        chooser.on_train_batch_start(fake_trainer(step), model, batch, step)
        assert {block.attn.attn_impl for block in model.blocks} == {"sdpa"}
        train_step(model, *batch)
        chooser.on_train_batch_end(fake_trainer(step + 1), model, None, batch, step)
        assert {block.attn.attn_impl for block in model.blocks} == {"sdpa"}  # evaluation too
    assert clock.reads == 0 and "trainer.deterministic" in chooser.report()["pinned"]
    with pytest.raises(ValueError, match="pin must be one of"):
        TrainingKernelChooser(pin="flash")


@pytest.mark.slow
def test_a_seed_reproduces_with_trainer_deterministic_under_a_noisy_clock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A clock that jumps at random stands for a busy machine: a measuring run could choose and
    # re-measure anything; a deterministic one must not look at it.
    noise = random.Random(0)
    monkeypatch.setattr(kernel_trial.time, "perf_counter", lambda: noise.random())
    runs = [train(short_recipe(tmp_path / f"run{i}", deterministic=True, max_epochs=2)) for i in range(2)]
    for (name, first), second in zip(runs[0].model.state_dict().items(), runs[1].model.state_dict().values()):
        torch.testing.assert_close(first, second, rtol=0, atol=0, msg=name)
    assert "pinned" in runs[0].summary["attention_kernels"]["training_steps"]
