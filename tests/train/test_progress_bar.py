"""The training progress bar redraws on a clock, not on every step."""

from __future__ import annotations

import lightning as L
import pytest
from lightning.pytorch.callbacks import TQDMProgressBar
from lightning.pytorch.demos.boring_classes import BoringModel

from vitkit.train.callbacks import LossProgressBar


def drawn_batches(monkeypatch: pytest.MonkeyPatch, min_interval_s: float, tick_s: float, batches: int = 10) -> list[int]:
    """The training batches after which the bar redrew, in a run whose clock moves ``tick_s`` per
    batch end."""
    drawn: list[int] = []
    monkeypatch.setattr(TQDMProgressBar, "on_train_batch_end", lambda self, trainer, module, outputs, batch, index: drawn.append(index))
    ticks = iter(tick_s * k for k in range(batches))
    bar = LossProgressBar(min_interval_s=min_interval_s, clock=lambda: next(ticks))
    trainer = L.Trainer(max_epochs=1, limit_train_batches=batches, limit_val_batches=0, callbacks=[bar], logger=False,
                        enable_checkpointing=False, enable_model_summary=False, accelerator="cpu")
    trainer.fit(BoringModel())
    return drawn


def test_the_bar_redraws_once_the_interval_has_passed_and_at_the_last_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    # Batch ends at 0, 0.03, 0.06, ... s with a 0.1 s interval: drawn at 0 s, then at 0.12 s
    # (batch 4), 0.24 s (batch 8), and at the last batch (9) whatever the clock.
    assert drawn_batches(monkeypatch, min_interval_s=0.1, tick_s=0.03) == [0, 4, 8, 9]


def test_a_zero_interval_redraws_every_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    assert drawn_batches(monkeypatch, min_interval_s=0.0, tick_s=0.0) == list(range(10))
