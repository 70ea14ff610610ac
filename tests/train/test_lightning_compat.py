"""Every Lightning internal vitkit touches (:mod:`vitkit.train.lightning_compat`) is checked here
against the installed Lightning, which must be in the range the module was checked on: outside
it, the first test fails and says what to re-check. The others read each internal in a real
(tiny) run and compare it with what Lightning's public behaviour implies."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from lightning.pytorch.strategies import ModelParallelStrategy
from packaging.version import Version
from torch import nn

from vitkit.train import lightning_compat as compat

PYPROJECT = Path(__file__).parents[2] / "pyproject.toml"
STEPS, LOG_EVERY = 7, 3


def test_the_installed_lightning_is_in_the_range_the_internals_were_checked_on() -> None:
    low, high = compat.CHECKED_RANGE
    installed = Version(L.__version__)
    assert Version(low) <= installed < Version(high), (
        f"vitkit/train/lightning_compat.py reaches into Lightning internals checked on lightning>={low},<{high}, "
        f"but lightning {L.__version__} is installed: check each function there against this version's source "
        "and this file's tests, then widen CHECKED_RANGE and pyproject.toml's pin."
    )


def test_pyproject_pins_lightning_to_the_checked_range() -> None:
    low, high = compat.CHECKED_RANGE
    pins = re.findall(r'"lightning([^"]*)"', PYPROJECT.read_text())
    assert pins == [f">={low},<{high}"]


class Recorder(L.Callback):
    """Counts the ``on_train_batch_start`` calls it gets, with their batch indices."""

    def __init__(self) -> None:
        self.starts: list[int] = []

    def on_train_batch_start(self, trainer: L.Trainer, module: L.LightningModule, batch: Any, batch_idx: int) -> None:
        self.starts.append(batch_idx)


class Tiny(L.LightningModule):
    """One linear layer; records what the compat functions read inside each training step, and
    cuts the run to one epoch at its end (:func:`~vitkit.train.lightning_compat.set_max_epochs`)."""

    def __init__(self, manual: bool) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 1)
        self.automatic_optimization = not manual
        self.seen: list[tuple[bool, Any, bool, int]] = []
        self.module_starts: list[int] = []

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor | None:
        trainer = compat.attached_trainer(self)
        self.seen.append((trainer is self.trainer, getattr(self, compat.HOOK_NAME_ATTRIBUTE),
                          compat.loggers_write_this_step(trainer), compat.batches_started(trainer)))
        loss = self.layer(batch).pow(2).mean()
        if self.automatic_optimization:
            return loss
        optimizer = self.optimizers()
        optimizer.zero_grad()
        self.manual_backward(loss)
        optimizer.step()
        return None

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        self.module_starts.append(batch_idx)

    def on_train_epoch_end(self) -> None:
        compat.set_max_epochs(self.trainer, 1)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def fit(manual: bool, tmp_path: Path) -> tuple[L.Trainer, Tiny, Recorder, dict[str, Any]]:
    """A 5-epoch fit of :class:`Tiny` that its first epoch end cuts to one epoch, and its checkpoint."""
    module, recorder = Tiny(manual), Recorder()
    trainer = L.Trainer(max_epochs=5, accelerator="cpu", log_every_n_steps=LOG_EVERY, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[recorder])
    trainer.fit(module, torch.utils.data.DataLoader(torch.randn(STEPS * 2, 4), batch_size=2))
    trainer.save_checkpoint(tmp_path / "last.ckpt")
    return trainer, module, recorder, torch.load(tmp_path / "last.ckpt", weights_only=True)


@pytest.fixture(scope="module")
def manual_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[L.Trainer, Tiny, Recorder, dict[str, Any]]:
    return fit(manual=True, tmp_path=tmp_path_factory.mktemp("manual"))


def test_a_steps_reads_give_its_trainer_hook_name_logging_rule_and_batch_count(manual_run: tuple) -> None:
    trainer, module, _, _ = manual_run
    assert trainer.current_epoch == 1  # set_max_epochs stopped a 5-epoch fit after its first
    writes = [(step + 1) % LOG_EVERY == 0 for step in range(STEPS)]  # log_every_n_steps, counted from 1
    assert module.seen == [(True, "training_step", write, step + 1) for step, write in enumerate(writes)]
    assert compat.attached_trainer(Tiny(manual=True)) is None  # a module outside a Trainer


def test_the_checkpoint_keeps_each_loops_optimiser_steps_where_the_compat_keys_say(manual_run: tuple, tmp_path: Path) -> None:
    for manual in (True, False):
        checkpoint = manual_run[-1] if manual else fit(manual, tmp_path)[-1]
        fit_state = compat.fit_loop_state(checkpoint)
        manual_steps = fit_state[compat.MANUAL_STEPS]["total"]["completed"]
        automatic_steps = fit_state[compat.AUTOMATIC_STEPS]["optimizer"]["step"]["total"]["completed"]
        assert (manual_steps, automatic_steps) == ((STEPS, 0) if manual else (0, STEPS))
    assert compat.fit_loop_state({"state_dict": {}}) is None
    assert compat.fit_loop_state({"loops": {"fit_loop": "not a state"}}) is None


def test_the_hook_dispatchers_call_the_callbacks_and_the_module_hook(manual_run: tuple) -> None:
    trainer, module, recorder, _ = manual_run
    assert recorder.starts[:STEPS] == module.module_starts[:STEPS] == list(range(STEPS))
    compat.call_callback_hooks(trainer, "on_train_batch_start", None, 41)
    compat.call_module_hook(trainer, "on_train_batch_start", None, 42, pl_module=module)
    assert (recorder.starts[-1], module.module_starts[-1]) == (41, 42)


def test_the_mesh_sizes_set_are_the_strategys_own_attributes() -> None:
    strategy = ModelParallelStrategy()
    before = dict(vars(strategy))
    compat.set_parallel_sizes(strategy, data_parallel=6, tensor_parallel=1)
    changed = {key for key, value in vars(strategy).items() if before.get(key, object()) != value}
    assert changed == {"_data_parallel_size", "_tensor_parallel_size"} <= set(before)  # replaced, not added
    assert (strategy._data_parallel_size, strategy._tensor_parallel_size) == (6, 1)
