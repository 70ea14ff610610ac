"""``trainer.time_budget_minutes`` plans the schedule to the time, and ``trainer.max_time_minutes``
says where it cut one short. The clock is faked: a run's first two training steps take 3 s each
(first-call work and a compilation: the first is left out, the second is an outlier the median
ignores), every other exactly 0.5 s, so the plans below are computed by hand."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import lightning as L
import pytest
from lightning.pytorch.utilities.exceptions import SIGTERMException
from tiny_runs import Recorder, dino_recipe, run_tool, short_recipe, write_tiny_recipe

import vitkit.train.run as run_module
from vitkit.schema import RecipeError
from vitkit.train import train
from vitkit.train.checkpoint import load_checkpoint
from vitkit.train.config import load_recipe
from vitkit.train.run import RunStoppedError
from vitkit.train.time_budget import TimeBudgetError, plan_schedule

# --- the planner, by hand ---------------------------------------------------------------------

#: 3 s spent (6 steps of 0.5 s), 100 steps an epoch, 5 s of validation each, 20 s kept for the end.
MEASURED = {"elapsed_s": 3.0, "steps_done": 6, "step_s": 0.5, "steps_per_epoch": 100, "epoch_eval_s": 5.0,
            "end_s": 20.0}


def test_the_plan_is_the_most_whole_epochs_that_fit_with_the_steps_taken_counted() -> None:
    # room: 600 - 3 - 20 + 6 x 0.5 = 580 s; an epoch 100 x 0.5 + 5 = 55 s: 10 epochs (10.5)
    plan = plan_schedule(10, **MEASURED, warmup_epochs=2, recipe_epochs=100)
    assert (plan.epochs, plan.steps, plan.steps_per_epoch) == (10, 1000, 100)
    assert (plan.warmup_epochs, plan.warmup_steps, plan.recipe_warmup_epochs) == (2, 200, None)  # 2 <= 10 / 4
    assert (plan.step_s, plan.epoch_eval_s, plan.end_s) == (0.5, 5.0, 20.0)


def test_a_long_warmup_is_scaled_to_its_share_of_the_recipes_schedule_at_most_a_quarter() -> None:
    share = plan_schedule(10, **MEASURED, warmup_epochs=3, recipe_epochs=100)  # 3 > 2.5: 3 % of 10 epochs
    assert (share.warmup_epochs, share.warmup_steps, share.recipe_warmup_epochs) == (0.3, 30, 3)
    capped = plan_schedule(10, **MEASURED, warmup_epochs=5, recipe_epochs=10)  # 50 % of 10, capped at 25 %
    assert (capped.warmup_epochs, capped.warmup_steps, capped.recipe_warmup_epochs) == (2.5, 250, 5)


def test_a_budget_without_room_for_one_epoch_is_refused_with_the_budget_that_fits() -> None:
    # room: 60 - 3 - 20 + 3 = 40 s < 55 s; needed 3 + 20 + 55 - 3 = 75 s = 1.25 min, shown rounded up
    with pytest.raises(TimeBudgetError, match=r"too short.*trainer\.time_budget_minutes=1\.3 or more"):
        plan_schedule(1, **MEASURED, warmup_epochs=0, recipe_epochs=10)
    # 1.3 min: room 78 - 23 + 3 = 58 s, one epoch
    assert plan_schedule(1.3, **MEASURED, warmup_epochs=0, recipe_epochs=10).epochs == 1


def test_a_run_resumed_before_its_plan_must_finish_the_epoch_under_way() -> None:
    resumed = {**MEASURED, "steps_done": 150, "elapsed_s": 1.0}  # in the second epoch
    # room: 120 - 1 - 20 + 75 = 174 s: 3 epochs of 55 s
    assert plan_schedule(2, **resumed, warmup_epochs=0, recipe_epochs=10).steps == 300
    # room: 90 - 1 - 20 + 75 = 144 s: 2 epochs, the one under way included
    assert plan_schedule(1.5, **resumed, warmup_epochs=0, recipe_epochs=10).epochs == 2
    with pytest.raises(TimeBudgetError):  # room: 54 - 21 + 75 = 108 s: 1 epoch, not the 2 it needs
        plan_schedule(0.9, **resumed, warmup_epochs=0, recipe_epochs=10)


def test_a_budget_and_max_time_together_are_refused_at_load() -> None:
    with pytest.raises(RecipeError, match=r"time_budget_minutes .*max_time_minutes.*keep one"):
        load_recipe(short_recipe(Path("runs")), ["trainer.time_budget_minutes=5", "trainer.max_time_minutes=5"])


# --- a tiny real run on a faked clock ---------------------------------------------------------

STEP_S, FIRST_STEP_S = 0.5, 3.0
LR, MIN_LR = 5e-3, 1e-4


class FakeClock:
    """The run's clock, moved by :class:`Steps` only."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Steps(L.Callback):
    """The fit's first two training steps take :data:`FIRST_STEP_S` of ``clock``, every other ``seconds``,
    each validation ``validation_s``; optionally stops the run (SIGTERM) at step ``stop_at``."""

    def __init__(self, clock: FakeClock, seconds: float, stop_at: int | None = None, validation_s: float = 0.0) -> None:
        self.clock, self.seconds, self.stop_at, self.validation_s = clock, seconds, stop_at, validation_s
        self.taken = 0
        self.final_lr: float | None = None

    def on_validation_end(self, *args: Any) -> None:
        self.clock.now += self.validation_s

    def on_train_batch_start(self, *args: Any) -> None:
        self.clock.now += FIRST_STEP_S if self.taken < 2 else self.seconds
        self.taken += 1

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        if trainer.global_step == self.stop_at:
            raise SIGTERMException

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.final_lr = trainer.optimizers[0].param_groups[0]["lr"]


class StopsAt(L.Callback):
    """Stops training (as an early-stopping callback would) at step ``step``."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        trainer.should_stop = trainer.should_stop or trainer.global_step == self.step


def _budget_recipe(tmp_path: Path) -> dict:
    # 4 steps an epoch; validation and test 2 batches of 64 = 128 images each
    recipe = short_recipe(tmp_path, max_epochs=4, time_budget_minutes=0.65, log_every=1)
    recipe["optim"].update(lr=LR, min_lr=MIN_LR, warmup_epochs=2)
    return recipe


def _expected_lrs() -> list[float]:
    """The rates of the 28 planned steps, by hand. Planned after the first epoch (4 steps, 7 s;
    the median of the steps after the first, 3, 0.5 and 0.5 s: 0.5 s): an evaluated image costs half
    a trained one (0.5 x 0.5 s / 32), so validation 128 x 0.0078 = 1 s an epoch, and the end
    256 x 0.0078 + 10 (export) = 12 s; room 39 - 7 - 12 + 4 x 0.5 = 22 s; an epoch 4 x 0.5 + 1 = 3 s:
    7 epochs, 28 steps. The recipe's warm-up, 2 epochs, is more than a quarter of
    7: scaled to 7 x min(1/4, 2/4) = 1.75 epochs, 7 steps. The first 4 steps ran the recipe's
    warm-up (2 epochs x 4 = 8 steps); then (s + 1) / 7, and a cosine over steps 7..27."""
    floor = MIN_LR / LR
    warm = [LR * (s + 1) / 8 for s in range(4)] + [LR * (s + 1) / 7 for s in range(4, 7)]
    cosine = [LR * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * (s - 7) / 21))) for s in range(7, 28)]
    return warm + cosine


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(run_module, "time", SimpleNamespace(perf_counter=fake))
    return fake


@pytest.mark.slow
def test_the_schedule_ends_at_the_planned_step_where_lightning_stops(tmp_path: Path, clock: FakeClock) -> None:
    # each validation takes the 1 s the plan estimates: every epoch runs at the plan's pace, and the plan stays
    steps, recorder = Steps(clock, STEP_S, validation_s=1.0), Recorder()
    result = train(_budget_recipe(tmp_path), callbacks=[recorder, steps])
    plan = result.summary["time_budget"]
    assert (plan["epochs"], plan["steps"], plan["step_s"], plan["warmup_steps"]) == (7, 28, STEP_S, 7)
    assert plan["recipe_warmup_epochs"] == 2 and plan["end_s"] == pytest.approx(12.0)
    assert (result.summary["epochs"], result.summary["global_steps"]) == (7, 28)
    assert recorder.lrs == pytest.approx(_expected_lrs(), rel=1e-9)
    assert recorder.lrs[-1] > MIN_LR * 1.01 and steps.final_lr == pytest.approx(MIN_LR, rel=1e-9)
    assert "schedule_note" not in result.summary
    stored = load_checkpoint(result.run_dir / "checkpoints" / "last.ckpt")["callbacks"]["TimeBudget"]["plan"]
    assert stored == plan


@pytest.mark.slow
def test_a_resumed_run_keeps_its_plan_though_its_steps_now_take_another_time(tmp_path: Path, clock: FakeClock) -> None:
    with pytest.raises(RunStoppedError):
        train(_budget_recipe(tmp_path), callbacks=[Steps(clock, STEP_S, stop_at=18, validation_s=1.0)])  # past the recipe's 4 epochs
    last = next(tmp_path.glob("tiny/*/checkpoints/last.ckpt"))
    assert load_checkpoint(last)["global_step"] == 18
    clock.now, recorder = 0.0, Recorder()  # five times faster now: a new plan would differ
    result = train(_budget_recipe(tmp_path), resume=last, callbacks=[recorder, Steps(clock, STEP_S / 5)])
    assert (result.summary["time_budget"]["epochs"], result.summary["global_steps"]) == (7, 28)
    assert recorder.lrs == pytest.approx(_expected_lrs()[18:], rel=1e-9)


@pytest.mark.slow
def test_a_dino_budget_keeps_time_for_the_knn_pass_and_counts_the_planned_epochs(tmp_path: Path, clock: FakeClock) -> None:
    recipe = dino_recipe(tmp_path, max_epochs=4, time_budget_minutes=0.87)
    result = train(recipe, callbacks=[Steps(clock, STEP_S, validation_s=1.0)])
    # the end: test and validation 256 images, and k-NN over the training and test splits, 1,259 + 359:
    # 1,874 x 0.0078125 + 10 = 24.64 s; room 52.2 - 7 - 24.64 + 2 = 22.56 s: 7 epochs of 3 s
    plan = result.summary["time_budget"]
    assert plan["end_s"] == pytest.approx(24.640625) and (plan["epochs"], result.summary["global_steps"]) == (7, 28)
    state = load_checkpoint(result.run_dir / "checkpoints" / "last.ckpt")["state_dict"]
    assert float(state["task.epoch_progress"]) == pytest.approx(7.0)  # DINO's epochs are the plan's, not 4


@pytest.mark.slow
@pytest.mark.parametrize("minutes", [1e-6, 100])
def test_max_time_cutting_the_schedule_short_says_where_it_was(tmp_path: Path, minutes: float) -> None:
    recipe = short_recipe(tmp_path, max_epochs=3, max_time_minutes=minutes)  # 1e-6: stops after the first step
    recipe["optim"].update(lr=LR, min_lr=MIN_LR, warmup_epochs=1)
    result = train(recipe, callbacks=[StopsAt(2)] if minutes == 100 else [])
    if minutes == 100:  # stopped early by something else: not max_time's doing
        assert result.summary["global_steps"] == 2 and "schedule_note" not in result.summary
        return
    # 12 steps, warm-up 4: step 1 runs at 2/4 of the peak
    note = result.summary["schedule_note"]
    assert note.startswith("stopped by trainer.max_time_minutes at epoch 1 of 3 (step 1 of 12), the learning rate "
                           "at 0.0025 of peak 0.005 (min 0.0001): the cosine schedule was cut at 8%")
    assert "trainer.time_budget_minutes=1e-06" in note


@pytest.mark.slow
def test_a_budget_too_short_for_one_epoch_stops_with_one_line(tmp_path: Path) -> None:
    recipe = write_tiny_recipe(tmp_path, max_epochs=2, time_budget_minutes=0.05)  # 3 s: less than the export's 10
    done = run_tool("tools/train.py", str(recipe))
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert "error: trainer.time_budget_minutes=0.05 is too short for this run" in done.stderr


def test_the_closing_lines_say_where_max_time_cut_the_schedule_or_what_the_budget_planned(load_tool) -> None:
    summary = {"test_acc": 94.61, "test_acc5": 99.9, "val_acc": 94.2, "epochs": 8, "wall_time_s": 750.0,
               "train_images_per_s": 1790.0, "schedule_note": "stopped by trainer.max_time_minutes at epoch 8 of 100"}
    lines = load_tool("train").closing_lines(summary, Path("runs/r")).splitlines()
    assert lines[1] == "note: stopped by trainer.max_time_minutes at epoch 8 of 100" and lines[-1].startswith("  vitkit")
    del summary["schedule_note"]
    planned = {**summary, "time_budget": {"budget_minutes": 12.5, "epochs": 31}}
    assert load_tool("train").closing_lines(planned, Path("runs/r")).splitlines()[1].startswith(
        "time budget 12.5 min: 31 epochs planned")
    assert len(load_tool("train").closing_lines(summary, Path("runs/r")).splitlines()) == len(lines) - 1


def test_max_epochs_on_the_command_line_switches_the_recipes_budget_off_with_a_note(caplog) -> None:
    assert load_recipe("mae_imagefolder").trainer.time_budget_minutes == 15  # the recipe's budget
    config = load_recipe("mae_imagefolder", ["trainer.max_epochs=3"])
    assert (config.trainer.max_epochs, config.trainer.time_budget_minutes) == (3, None)  # the line's epochs run
    assert "trainer.max_epochs=3 on the command line: the recipe's trainer.time_budget_minutes=15 is switched off" \
        in caplog.text
    caplog.clear()
    budgeted = load_recipe("mae_imagefolder", ["trainer.time_budget_minutes=5"])
    assert budgeted.trainer.time_budget_minutes == 5 and "switched off" not in caplog.text
    with pytest.raises(RecipeError, match="max_epochs=3 and trainer.time_budget_minutes=5 both set the run's length"):
        load_recipe("mae_imagefolder", ["trainer.max_epochs=3", "trainer.time_budget_minutes=5"])
    assert load_recipe("mae_imagefolder", ["trainer.max_epochs=3", "trainer.time_budget_minutes=null"]).trainer.max_epochs == 3


class ChangesPace(Steps):
    """:class:`Steps`, each step from the ``after``-th on taking ``then`` seconds."""

    def __init__(self, clock: FakeClock, seconds: float, after: int, then: float, validation_s: float = 0.0) -> None:
        super().__init__(clock, seconds, validation_s=validation_s)
        self.after, self.then = after, then

    def on_train_batch_start(self, *args: Any) -> None:
        if self.taken >= self.after:
            self.clock.now += self.then
            self.taken += 1
        else:
            super().on_train_batch_start(*args)


@pytest.mark.slow
def test_a_run_that_slows_down_shortens_its_plan_to_end_within_the_budget(tmp_path: Path, clock: FakeClock) -> None:
    """Planned as in :func:`_expected_lrs` (7 epochs of 3 s, 12 s kept for the end of a 39-s budget;
    epoch 1 ends at 7 s), then every step takes 1 s: epoch 2 ends at 11 s, 4 s an epoch (the faked
    clock leaves validation out), and 5 more would end at 11 + 20 + 12 = 43 s > 39 s; the most that
    fit: 2 + floor((39 - 11 - 12) / 4) = 6 epochs, 24 steps, ending at 27 + 12 = 39 s. Epoch 3 at the
    same pace ends at 15 s: 15 + 3 x 4 + 12 = 39 s fits, so the plan stays."""
    steps = ChangesPace(clock, STEP_S, after=4, then=1.0)
    result = train(_budget_recipe(tmp_path), callbacks=[steps])
    plan = result.summary["time_budget"]
    assert (plan["epochs"], plan["steps"], plan["shortened_after"], plan["warmup_steps"]) == (6, 24, 2, 7)
    assert (result.summary["epochs"], result.summary["global_steps"]) == (6, 24)
    assert steps.final_lr == pytest.approx(MIN_LR, rel=1e-9)  # the cosine ended with the shortened plan
    assert clock.now + plan["end_s"] <= 39.0 + 1e-9
    assert plan["lengthened_after"] is None


@pytest.mark.slow
def test_a_run_planned_on_busy_cores_lengthens_its_plan_when_they_free_up(tmp_path: Path, clock: FakeClock) -> None:
    """32 steps an epoch. The plan is made after 10 steps (3, 3, then 1 s each: the median of the 9
    after the first is 1 s; 14 s gone): an evaluated image costs 0.5 x 1 / 32 s, so validation
    (128 images) 2 s an epoch and the end 256 / 64 + 10 = 14 s; room 150 - 14 - 14 + 10 x 1 = 132 s,
    an epoch 32 + 2 = 34 s: 3 epochs, 96 steps, the recipe's 2-epoch warm-up scaled to
    3 x min(1/4, 2/4) = 0.75 epochs, 24 steps. From step 11 on a step takes 0.25 s: epoch 1 ends at
    14 + 22 x 0.25 = 19.5 s, its 22 steps after the plan at 8 s an epoch, and 1 + floor((150 - 19.5
    - 14) / (1.1 x 8)) = 14 epochs fit with the 10% margin; epoch 1 is within the first third of 3,
    so the plan grows to 14 epochs, 448 steps, and keeps its warm-up (step 32 is past it). Epoch 2
    ends at 27.5 s: 2 + floor(108.5 / 8) = 15 fit, so no shortening, and 2 + floor(108.5 / 8.8) = 14
    with the margin, so the plan stays (as at epochs 3 and 4: 3 + floor(100.5 / 8.8), 4 +
    floor(92.5 / 8.8)); the run ends at 19.5 + 13 x 8 + 14 = 137.5 s."""
    recipe = short_recipe(tmp_path, max_epochs=4, time_budget_minutes=2.5, log_every=1, limit_train_batches=32)
    recipe["optim"].update(lr=LR, min_lr=MIN_LR, warmup_epochs=2)
    steps = ChangesPace(clock, 1.0, after=10, then=0.25)
    result = train(recipe, callbacks=[steps])
    plan = result.summary["time_budget"]
    assert (plan["epochs"], plan["steps"], plan["lengthened_after"], plan["warmup_steps"]) == (14, 448, 1, 24)
    assert plan["shortened_after"] is None and plan["step_s"] == 1.0
    assert (result.summary["epochs"], result.summary["global_steps"]) == (14, 448)
    assert steps.final_lr == pytest.approx(MIN_LR, rel=1e-9)  # the cosine ended with the lengthened plan
    assert clock.now + plan["end_s"] == pytest.approx(137.5)


@pytest.mark.slow
def test_a_plan_past_its_first_third_is_not_lengthened(tmp_path: Path, clock: FakeClock) -> None:
    """Planned as in the test above (3 epochs of 34 s, validation 2 s), each validation now taking
    its 2 s. Epoch 1 runs at 1 s a step (38 s in all; its 22 steps after the plan and a validation: 34.9 s
    an epoch: 1 + floor((150 - 38 - 14) / 34.9) = 3 fit). From step 40 on a step takes 0.25 s: epoch 2
    takes 7 + 25 x 0.25 + 2 = 15.25 s, and 2 + floor((150 - 53.25 - 14) / (1.1 x 15.25)) = 6 epochs would
    fit, but epoch 2 is past the first third of 3: the cosine has come down too far to stretch."""
    recipe = short_recipe(tmp_path, max_epochs=4, time_budget_minutes=2.5, log_every=1, limit_train_batches=32)
    recipe["optim"].update(lr=LR, min_lr=MIN_LR, warmup_epochs=2)
    result = train(recipe, callbacks=[ChangesPace(clock, 1.0, after=39, then=0.25, validation_s=2.0)])
    plan = result.summary["time_budget"]
    assert (plan["epochs"], plan["lengthened_after"], plan["shortened_after"]) == (3, None, None)
    assert result.summary["global_steps"] == 96
