"""``trainer.time_budget_minutes``: fit the warm-up and the cosine schedule to a wall-clock budget,
and say where ``trainer.max_time_minutes`` cut a schedule short.

A run with a budget starts as the recipe says (its warm-up is in steps per epoch, whatever the
run's length), times its first training steps (the first one, which pays lazy initialisation and
compilation, untimed, then :data:`MEASURED_STEPS`, whose median counts: a step that compiles or
times both attention kernels is an outlier), and plans (:func:`plan_schedule`): as many whole
epochs as fit in what the budget leaves after the time spent so far and the time kept for the end
of the run. The learning-rate schedule's end, Lightning's ``max_epochs`` (and a
task's epoch count, DINO's) are then all set from the plan, so the schedule ends exactly when
training does; the steps already taken count, and ran at the warm-up's small rates.

What follows training is estimated, not measured: an evaluated image (validation, test, k-NN: a
forward pass without backward or update) counts :data:`EVAL_SHARE` of a trained image's time,
times its test-time augmentation views, and :data:`EXPORT_SECONDS` are kept for writing the model,
curves and summary. Validation after every epoch (and k-NN every ``task.knn_every`` epochs) counts
in each epoch's time.

After each epoch the plan is checked against the pace of that epoch (for the epoch the plan was
made in, the pace of its steps after the plan, when there were at least :data:`MEASURED_STEPS`).
When the planned epochs would end past the budget (other jobs came to share the cores), the plan
keeps the most whole epochs that still fit and the cosine ends with them (its remaining steps decay
faster), with a note. When more whole epochs fit than planned at a pace :data:`LENGTHEN_MARGIN`
times the last epoch's (the cores were shared while the plan was made, and are free now), the
plan grows to them, but only in its first :data:`LENGTHEN_SHARE` of epochs, while the cosine has
come down by a quarter at most: the longer cosine raises the rate of the next steps by at most a
third, never a restart from a rate that had decayed. A plan still in its warm-up takes the
warm-up of the longer plan. The plan is stored in the checkpoints (this callback's state) and in
``summary.json``; a resumed run reuses it as it is: the planned epochs, whatever time the pause
took. A run stopped before it planned (during its first steps) plans when resumed.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback, Timer
from lightning.pytorch.utilities import rank_zero_info

from ..errors import VitkitError
from ..schema import MAX_EPOCHS
from .config import RecipeConfig
from .datamodule import ViTDataModule
from .lightning_compat import set_max_epochs

#: Training steps timed, after the first, before the plan is made (fewer if the first epoch is shorter).
MEASURED_STEPS = 9
#: An evaluated image's time as a share of a trained image's (a forward pass is about a third of
#: forward, backward and update; rounded up for the evaluation loop's own work).
EVAL_SHARE = 0.5
#: Seconds kept after the last evaluation for the model file, curves and summary.
EXPORT_SECONDS = 10.0
#: The largest share of the plan the recipe's warm-up keeps; a longer one is scaled down.
WARMUP_SHARE = 0.25
#: The share of the planned epochs within which a faster pace lengthens the plan (a cosine over
#: the whole plan is then at 0.75 of its peak or above).
LENGTHEN_SHARE = 1 / 3
#: A plan grows only to the epochs that fit at this multiple of the last epoch's time, so that the
#: next epoch, if up to this much slower (the pace of a CPU run varies by 10-20% from epoch to
#: epoch), does not shorten it again.
LENGTHEN_MARGIN = 1.1
#: Forward passes per image of each test-time augmentation.
TTA_VIEWS = {"none": 1, "hflip": 2, "hflip_shift": 10}


class TimeBudgetError(VitkitError):
    """The time budget leaves no room for one epoch and the end of the run."""


@dataclass(frozen=True)
class Plan:
    """A time budget's plan (``summary.json``'s ``time_budget``; the times in seconds).

    Attributes:
        budget_minutes: ``trainer.time_budget_minutes``.
        epochs, steps: the planned training (``steps = epochs * steps_per_epoch``).
        steps_per_epoch: optimiser steps per epoch.
        step_s: the measured time of a training step.
        warmup_epochs, warmup_steps: the plan's warm-up.
        recipe_warmup_epochs: the recipe's warm-up, when the plan scaled it down (else ``None``).
        epoch_eval_s: the estimated evaluation after each epoch.
        end_s: the time kept for the end of the run (test, final validation, k-NN, export).
        ends_by: the local time the run should end by (``HH:MM``).
        shortened_after: the epoch after which a slower pace shortened the plan, or ``None``.
        lengthened_after: the epoch after which a faster pace lengthened the plan, or ``None``.
    """

    budget_minutes: float
    epochs: int
    steps: int
    steps_per_epoch: int
    step_s: float
    warmup_epochs: float
    warmup_steps: int
    recipe_warmup_epochs: float | None
    epoch_eval_s: float
    end_s: float
    ends_by: str = ""
    shortened_after: int | None = None
    lengthened_after: int | None = None

    def describe(self) -> str:
        """The plan in one line (printed when it is made, and again when a run resumes with it)."""
        warmup = f"warm-up {self.warmup_epochs:g} epochs"
        if self.recipe_warmup_epochs is not None:
            warmup += (f" (the recipe's {self.recipe_warmup_epochs:g} scaled down: at most "
                       f"{WARMUP_SHARE:.0%} of the plan, or the recipe's share of its own schedule)")
        return (f"time budget {self.budget_minutes:g} min: planned {self.epochs:,} epochs, {self.steps:,} steps "
                f"({self.step_s:.3g} s/step), to end by {self.ends_by}; {warmup}; {self.end_s:.0f} s kept for "
                f"the test, k-NN and export and {self.epoch_eval_s:.1f} s for each epoch's validation (estimated: "
                f"an evaluated image at {EVAL_SHARE:g} of a trained image's time)")


def planned_warmup(warmup_epochs: float, recipe_epochs: int, epochs: int) -> float:
    """The plan's warm-up in epochs: the recipe's ``warmup_epochs``, unless that is more than
    :data:`WARMUP_SHARE` of ``epochs``; then the recipe's share of its own schedule
    (``warmup_epochs / recipe_epochs``) of the plan, at most :data:`WARMUP_SHARE` of it."""
    if warmup_epochs <= WARMUP_SHARE * epochs:
        return warmup_epochs
    return epochs * min(WARMUP_SHARE, warmup_epochs / recipe_epochs)


def plan_schedule(
    budget_minutes: float,
    *,
    elapsed_s: float,
    steps_done: int,
    step_s: float,
    steps_per_epoch: int,
    epoch_eval_s: float,
    end_s: float,
    warmup_epochs: float,
    recipe_epochs: int,
) -> Plan:
    """The most whole epochs that fit: after ``elapsed_s`` seconds (``steps_done`` steps taken),
    each remaining step takes ``step_s``, each epoch ``epoch_eval_s`` more, and ``end_s`` is kept
    for the end of the run.

    Raises:
        TimeBudgetError: not even the epoch under way fits; the message gives the budget that would.
    """
    epoch_s = steps_per_epoch * step_s + epoch_eval_s
    # E epochs end at elapsed + (E * steps_per_epoch - steps_done) * step_s + E * epoch_eval_s + end
    room = budget_minutes * 60 - elapsed_s - end_s + steps_done * step_s
    epochs = min(MAX_EPOCHS, math.floor(room / epoch_s))
    needed = steps_done // steps_per_epoch + 1
    if epochs < needed:
        enough = math.ceil((budget_minutes * 60 - room + needed * epoch_s) / 6) / 10  # minutes, rounded up to 0.1
        raise TimeBudgetError(
            f"trainer.time_budget_minutes={budget_minutes:g} is too short for this run: {elapsed_s:.0f} s went to "
            f"setting up and the first steps, an epoch takes ~{epoch_s:.0f} s ({steps_per_epoch:,} steps of "
            f"{step_s:.3g} s and {epoch_eval_s:.0f} s of validation) and ~{end_s:.0f} s are kept for the test and "
            f"export; give trainer.time_budget_minutes={enough:g} or more, or train fewer steps an epoch "
            "(trainer.limit_train_batches)."
        )
    warmup = planned_warmup(warmup_epochs, recipe_epochs, epochs)
    return Plan(
        budget_minutes=budget_minutes, epochs=epochs, steps=epochs * steps_per_epoch, steps_per_epoch=steps_per_epoch,
        step_s=step_s, warmup_epochs=round(warmup, 3), warmup_steps=round(warmup * steps_per_epoch),
        recipe_warmup_epochs=warmup_epochs if warmup != warmup_epochs else None,
        epoch_eval_s=epoch_eval_s, end_s=end_s,
    )


def _batches_images(images: int, batch: int, limit: int | float | None) -> int:
    """How many of ``images`` an evaluation loop of ``batch``-image batches covers under Lightning's
    ``limit_*_batches`` (a count of batches or a fraction of them)."""
    batches = math.ceil(images / batch)
    if isinstance(limit, int):
        batches = min(batches, limit)
    elif isinstance(limit, float):
        batches = int(batches * limit)
    return min(images, batches * batch)


def evaluated_images(config: RecipeConfig, datamodule: ViTDataModule) -> tuple[float, float]:
    """Images evaluated (test-time augmentation views counted) after each epoch, on average, and
    after training: validation each epoch (plus the k-NN pass over the training and test splits
    every ``task.knn_every`` epochs); the test, a final validation and the k-NN pass at the end."""
    trainer, bundle, batch = config.trainer, datamodule.bundle, 2 * datamodule.batch_size
    val_tta = trainer.val_tta or trainer.tta
    val = _batches_images(len(bundle.val), batch, trainer.limit_val_batches) * TTA_VIEWS[val_tta]
    test = _batches_images(len(bundle.test), batch, trainer.limit_test_batches) * TTA_VIEWS[trainer.tta]
    knn = len(bundle.train) + len(bundle.test) if config.task.task_class.releases_encoder and bundle.info.num_classes > 1 else 0
    per_epoch = val + (knn / config.task.knn_every if config.task.knn_every else 0)
    return per_epoch, test + val + knn


class TimeBudget(Callback):
    """Plans a run to ``budget_minutes`` (see the module docstring) and applies the plan.

    Args:
        budget_minutes: ``trainer.time_budget_minutes``.
        config: the run's recipe (its warm-up, epochs, batch size and task: the images a step trains).
        eval_images: :func:`evaluated_images`.
        started: when the run started, by ``clock``.
        clock: seconds (``time.perf_counter``).
    """

    def __init__(
        self, budget_minutes: float, config: RecipeConfig, eval_images: tuple[float, float], started: float,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.budget_minutes = budget_minutes
        self.warmup_epochs, self.recipe_epochs = config.optim.warmup_epochs, config.trainer.max_epochs
        self.step_images = config.task.task_class.step_images(config.task.options, config.trainer.batch_size)
        self.eval_images = eval_images
        self.started, self.clock = started, clock
        self.plan: Plan | None = None
        self._times: list[float] = []
        self._planned_here = False  # a plan restored from a checkpoint is kept as it is
        self._planned_at = (0.0, 0)  # (clock, global step) when the plan was made
        self._epoch_ended: float | None = None  # when the last epoch ended, after the plan was made

    def state_dict(self) -> dict[str, Any]:
        return {} if self.plan is None else {"plan": dataclasses.asdict(self.plan)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if "plan" in state_dict:
            self.plan = Plan(**state_dict["plan"])

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.plan is not None:  # restored from the checkpoint: the run goes on as planned
            _apply(self.plan, trainer, pl_module)
            rank_zero_info(f"resuming with the plan made at the run's start: {self.plan.describe()}")
        self._times = [self.clock()]

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self.plan is not None:
            return
        self._times.append(self.clock())
        taken = len(self._times) - 1
        if taken < 1 + MEASURED_STEPS and batch_idx + 1 < trainer.num_training_batches:
            return
        times = self._times  # the median step: a step that compiles or times two kernels does not count
        step_s = statistics.median(b - a for a, b in zip(times[1:], times[2:])) if taken > 1 else times[1] - times[0]
        # every rank plans from rank 0's clock, so all stop at the same step
        step_s, elapsed_s = trainer.strategy.broadcast((step_s, times[-1] - self.started), src=0)
        image_s = EVAL_SHARE * step_s / self.step_images  # a trained image's time, from the task's step
        plan = plan_schedule(
            self.budget_minutes, elapsed_s=elapsed_s, steps_done=trainer.global_step, step_s=step_s,
            steps_per_epoch=int(trainer.num_training_batches), epoch_eval_s=self.eval_images[0] * image_s,
            end_s=self.eval_images[1] * image_s + EXPORT_SECONDS, warmup_epochs=self.warmup_epochs,
            recipe_epochs=self.recipe_epochs,
        )
        ends_by = datetime.now() + timedelta(seconds=self.budget_minutes * 60 - elapsed_s)
        self.plan = dataclasses.replace(plan, ends_by=ends_by.strftime("%H:%M"))
        self._planned_here, self._planned_at = True, (times[-1], trainer.global_step)
        _apply(self.plan, trainer, pl_module)
        rank_zero_info(self.plan.describe())

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Fit the plan to the pace of the epoch just ended (validation included): shorten it when
        the planned epochs would end past the budget, lengthen it early on when more fit."""
        if self.plan is None or not self._planned_here:
            return
        now, done = self.clock(), trainer.current_epoch + 1
        if self._epoch_ended is None:  # the epoch the plan was made in: its steps after the plan set the pace
            clock, step = self._planned_at
            since = trainer.global_step - step
            epoch_s = (now - clock) * self.plan.steps_per_epoch / since if since >= MEASURED_STEPS else None
        else:
            epoch_s = now - self._epoch_ended
        self._epoch_ended = now
        if epoch_s is None or done >= self.plan.epochs:
            return
        epoch_s, elapsed_s = trainer.strategy.broadcast((epoch_s, now - self.started), src=0)
        room = self.budget_minutes * 60 - elapsed_s - self.plan.end_s
        fits = min(MAX_EPOCHS, done + max(0, math.floor(room / epoch_s + 1e-9)))  # an exact fit is not rounded away
        if fits < self.plan.epochs:
            self._replan(trainer, pl_module, fits, shortened_after=done)
            rank_zero_info(
                f"note: epoch {done} took {epoch_s:.0f} s, slower than planned (other jobs on the cores?): the plan is "
                f"shortened to {fits:,} epochs, {self.plan.steps:,} steps, to end within trainer.time_budget_minutes="
                f"{self.budget_minutes:g}; the cosine schedule now ends at step {self.plan.steps:,}."
            )
            return
        grows_to = min(MAX_EPOCHS, done + max(0, math.floor(room / (LENGTHEN_MARGIN * epoch_s))))
        if grows_to > self.plan.epochs and done <= LENGTHEN_SHARE * self.plan.epochs:
            self._replan(trainer, pl_module, grows_to, lengthened_after=done)
            rank_zero_info(
                f"note: epoch {done} ran at {epoch_s:.0f} s an epoch, faster than planned (the cores were shared while "
                f"the plan was made?): the plan is lengthened to {grows_to:,} epochs, {self.plan.steps:,} steps, within "
                f"trainer.time_budget_minutes={self.budget_minutes:g}; the cosine schedule now ends at step "
                f"{self.plan.steps:,}."
            )

    def _replan(self, trainer: L.Trainer, pl_module: L.LightningModule, epochs: int, **when: int) -> None:
        """The plan of ``epochs`` epochs from here (``when``: the epoch after which it changed), applied. A
        plan still in its warm-up takes the longer or shorter plan's warm-up; one past it keeps its own."""
        plan, steps = self.plan, epochs * self.plan.steps_per_epoch
        warmup, recipe_warmup = plan.warmup_epochs, plan.recipe_warmup_epochs
        if trainer.global_step < plan.warmup_steps:
            warmup = planned_warmup(self.warmup_epochs, self.recipe_epochs, epochs)
            recipe_warmup = self.warmup_epochs if warmup != self.warmup_epochs else None
        warmup_steps = min(round(warmup * plan.steps_per_epoch), steps)
        self.plan = dataclasses.replace(plan, epochs=epochs, steps=steps, warmup_epochs=round(warmup, 3),
                                        warmup_steps=warmup_steps, recipe_warmup_epochs=recipe_warmup, **when)
        _apply(self.plan, trainer, pl_module)


def _apply(plan: Plan, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
    """Training stops, and the schedules end, where ``plan`` says."""
    set_max_epochs(trainer, plan.epochs)  # whole epochs: the last step is the plan's, validated and saved
    pl_module.set_schedule(plan.warmup_steps, plan.steps, plan.epochs)


def time_budget_callback(
    config: RecipeConfig, datamodule: ViTDataModule, started: float, clock: Callable[[], float]
) -> list[TimeBudget]:
    """The run's :class:`TimeBudget` in a list, or none without ``trainer.time_budget_minutes``."""
    budget = config.trainer.time_budget_minutes
    if budget is None:
        return []
    return [TimeBudget(budget, config, evaluated_images(config, datamodule), started, clock)]


def cut_short_note(trainer: L.Trainer, pl_module: L.LightningModule, max_time_minutes: float | None) -> str | None:
    """Where the learning-rate schedule was when ``trainer.max_time_minutes`` stopped training
    (Lightning's :class:`Timer` ran out before the schedule's last step), or ``None``."""
    timer = next((callback for callback in trainer.callbacks if isinstance(callback, Timer)), None)
    horizon, step = pl_module.horizon, trainer.global_step
    if max_time_minutes is None or timer is None or horizon is None or timer.time_remaining() > 0 or step >= horizon.total_steps:
        return None
    peak, floor = pl_module.optim_config.lr, pl_module.optim_config.min_lr
    return (
        f"stopped by trainer.max_time_minutes at epoch {math.ceil(step / trainer.num_training_batches)} of "
        f"{trainer.max_epochs} (step {step:,} of {horizon.total_steps:,}), the learning rate at "
        f"{peak * horizon.factor(step):.3g} of peak {peak:.3g} (min {floor:.3g}): the cosine schedule was cut at "
        f"{step / horizon.total_steps:.0%}; use trainer.time_budget_minutes={max_time_minutes:g} in place of "
        "trainer.max_time_minutes to fit the warm-up and the decay to the time."
    )


def budget_summary(budget: list[TimeBudget], note: str | None) -> dict[str, Any]:
    """``summary.json``'s ``time_budget`` (the plan) and ``schedule_note`` (:func:`cut_short_note`),
    each where there is one."""
    plan = budget[0].plan if budget else None
    return {**({"time_budget": dataclasses.asdict(plan)} if plan else {}), **({"schedule_note": note} if note else {})}
