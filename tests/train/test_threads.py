"""The note on CPU threads: more threads than usable cores, or other work on the cores, is said in
one line before a run starts, with the setting that helps; an idle machine gets no note."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import lightning as L
import pytest
import torch
from tiny_runs import short_recipe

from vitkit.train import run as run_module
from vitkit.train import threads, train
from vitkit.train.threads import thread_advice, usable_cores


def test_usable_cores_follow_the_process_affinity_not_the_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {3}, raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    assert usable_cores() == 1


@pytest.mark.parametrize(
    ("threads_", "cores", "load", "expected"),
    [
        (4, 2, 0.0, "4 CPU threads on the 2 cores"),  # oversubscribed by the setting itself
        (2, 2, 1.2, "other work keeps about 1.2 of the 2 usable cores busy"),  # a job beside the run
        (2, 2, 0.1, None),  # idle
        (1, 2, 3.0, None),  # one thread already
        (2, 8, 2.0, None),  # room enough
        (2, 2, None, None),  # no load average on this OS
    ],
)
def test_thread_advice(threads_: int, cores: int, load: float | None, expected: str | None) -> None:
    advice = thread_advice(threads_, cores, load)
    if expected is None:
        assert advice is None
    else:
        assert advice.startswith("note: ") and expected in advice and "trainer.num_threads=" in advice
        assert "\n" not in advice


@pytest.mark.slow
def test_a_run_on_a_busy_machine_prints_the_note_before_training(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(run_module, "other_load", lambda: 3.0)
    monkeypatch.setattr(run_module, "usable_cores", lambda: 2)
    with caplog.at_level(logging.INFO):
        run_module.train(short_recipe(tmp_path, num_threads=2))
    assert any("note: other work keeps about 3.0 of the 2 usable cores busy" in r.getMessage() for r in caplog.records)
    assert threads.BUSY_LOAD < 3.0


def test_more_data_workers_than_usable_cores_are_clamped_to_the_cores_with_a_note() -> None:
    from vitkit.data import DataConfig
    from vitkit.train.datamodule import ViTDataModule

    datamodule = ViTDataModule(DataConfig(name="digits", num_workers=4), 32)
    assert datamodule.fit_workers(cores=4) is None and datamodule.config.num_workers == 4
    assert datamodule.fit_workers(cores=2) == "note: data.num_workers 4 is more than the 2 usable CPU cores; 2 workers instead."
    assert datamodule.config.num_workers == 2 and datamodule.loader(datamodule.bundle.val, 8, train=False).num_workers == 2


def test_a_run_sets_its_threads_and_gives_the_process_its_own_back(tmp_path: Path) -> None:
    """``trainer.num_threads`` holds during the run only: a script or notebook that trains the
    quickstart (1 thread) and then goes on keeps its own thread count, after a failed run too."""
    before = torch.get_num_threads()
    seen = []

    class Threads(L.Callback):
        def on_train_batch_start(self, *args: object) -> None:
            seen.append(torch.get_num_threads())

    class Fails(L.Callback):
        def on_train_batch_end(self, *args: object) -> None:
            raise ValueError("stop")

    torch.set_num_threads(3)
    try:
        train(short_recipe(tmp_path, num_threads=1), callbacks=[Threads()])
        assert seen and set(seen) == {1}
        assert torch.get_num_threads() == 3
        torch.set_num_threads(2)
        with pytest.raises(ValueError, match="stop"):
            train(short_recipe(tmp_path / "failing", num_threads=1), callbacks=[Fails()])
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
