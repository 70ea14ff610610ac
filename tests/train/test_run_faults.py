"""Fault injection: concurrent runs, divergence, a refused resume, SIGTERM, a killed save, a full
disk and a user's mistake given to every tool. Each case ends in one clear error (or a clean stop)
with nothing lost or overwritten. Tiny ViTs on 8x8 digits, a few steps each."""

from __future__ import annotations

import errno
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import lightning as L
import pytest
import torch
import yaml
from tiny_runs import ROOT, SHORT, short_recipe, snapshot, tool_env, write_tiny_recipe

from vitkit.errors import VitkitError
from vitkit.train import (
    CheckpointError,
    NonFiniteLossError,
    RunResult,
    RunStoppedError,
    artifacts,
    load_checkpoint,
    load_recipe,
    train,
)
from vitkit.train.checkpoint import AtomicCheckpointIO


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> RunResult:
    return train(short_recipe(tmp_path_factory.mktemp("runs"), checkpoint_every_n_steps=2))


# --- 1. runs never share a directory ----------------------------------------------------------


def test_runs_resolved_in_the_same_second_claim_different_directories(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(artifacts.time, "strftime", lambda pattern: "20250101-000000")
    config = load_recipe(short_recipe(tmp_path))
    # Two runs that both resolve before either writes: each must already own its directory.
    first, second, third = (artifacts.resolve_run_dir(config, None) for _ in range(3))
    assert [p.name for p in (first, second, third)] == ["20250101-000000", "20250101-000000-1", "20250101-000000-2"]
    assert all(p.is_dir() for p in (first, second, third))


def test_two_trainings_in_the_same_second_keep_their_own_files(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(artifacts.time, "strftime", lambda pattern: "20250101-000000")
    results = [train(short_recipe(tmp_path, seed=seed, limit_train_batches=2)) for seed in (1, 2)]
    assert results[0].run_dir != results[1].run_dir
    for seed, result in zip((1, 2), results):
        assert yaml.safe_load((result.run_dir / "config.yaml").read_text())["trainer"]["seed"] == seed
        assert (result.run_dir / "model.safetensors").is_file()


def test_a_latest_folder_that_is_not_a_link_is_refused_before_training(tmp_path: Path) -> None:
    (tmp_path / "tiny" / "latest").mkdir(parents=True)
    with pytest.raises(VitkitError, match=r"latest is a real folder"):
        train(short_recipe(tmp_path))
    assert [p.name for p in (tmp_path / "tiny").iterdir()] == ["latest"]  # no run started


# --- 2. the last good checkpoint is good ------------------------------------------------------


def test_divergence_names_a_finite_checkpoint_and_writes_no_non_finite_one(tmp_path: Path) -> None:
    recipe = short_recipe(tmp_path, checkpoint_every_n_steps=1, limit_train_batches=20)
    recipe["optim"]["lr"] = 1e4  # the weights overflow before the loss does
    with pytest.raises(NonFiniteLossError) as caught:
        train(recipe)
    message = str(caught.value)
    named = Path(re.search(r"last good checkpoint is (\S+)\.$", message).group(1))
    checkpoint = load_checkpoint(named)
    for key in ("state_dict", "optimizer_states"):
        tensors = [t for t in _tensors(checkpoint[key]) if t.is_floating_point()]
        assert tensors and all(t.isfinite().all() for t in tensors), key
    assert "clip_grad" not in message  # the recipe already clips (optim.clip_grad defaults to 1.0)
    for path in named.parent.glob("*.ckpt"):
        assert all(t.isfinite().all() for t in _tensors(load_checkpoint(path)["state_dict"]))


def _tensors(tree: object) -> list[torch.Tensor]:
    if isinstance(tree, torch.Tensor):
        return [tree]
    if isinstance(tree, dict):
        return [t for value in tree.values() for t in _tensors(value)]
    if isinstance(tree, (list, tuple)):
        return [t for value in tree for t in _tensors(value)]
    return []


class PoisonOptimizerState(L.Callback):
    """After step ``at``, put a NaN into the AdamW moment of one weight: the next step's loss is
    still finite, its update makes the weights NaN."""

    def __init__(self, at: int) -> None:
        self.at = at

    def on_train_batch_end(self, trainer: L.Trainer, *args: object) -> None:
        if trainer.global_step == self.at:
            optimizer = trainer.optimizers[0]
            state = optimizer.state[optimizer.param_groups[0]["params"][0]]
            state["exp_avg"].fill_(float("nan"))


def test_weights_that_diverge_before_the_loss_are_not_checkpointed(tmp_path: Path) -> None:
    recipe = short_recipe(tmp_path, checkpoint_every_n_steps=1, limit_train_batches=20)
    recipe["optim"]["clip_grad"] = None
    with pytest.raises(NonFiniteLossError, match=r"non-finite at step 4 .*set optim.clip_grad") as caught:
        train(recipe, callbacks=[PoisonOptimizerState(at=3)])
    assert "loss became" not in str(caught.value)  # caught at the save, before any loss went non-finite
    last = next(tmp_path.glob("tiny/*/checkpoints/last.ckpt"))
    assert str(last) in str(caught.value) and load_checkpoint(last)["global_step"] == 3


# --- 3. a failed --resume leaves the run as it was --------------------------------------------


def test_resume_with_another_model_names_the_difference_and_changes_nothing(finished: RunResult) -> None:
    before = snapshot(finished.run_dir.parent)
    recipe = short_recipe(finished.run_dir.parent.parent)
    recipe["model"]["depth"] = 3
    with pytest.raises(CheckpointError, match=r"depth \(checkpoint 2, recipe 3\)"):
        train(recipe, resume=finished.run_dir / "checkpoints" / "last.ckpt")
    assert snapshot(finished.run_dir.parent) == before


def test_resume_on_other_data_is_refused_before_a_run_directory_exists(finished: RunResult, tmp_path: Path) -> None:
    recipe = short_recipe(tmp_path)
    recipe["data"].update(name="shapes", in_chans=1, shapes_num_samples=60)
    with pytest.raises(CheckpointError, match=r"dataset \(checkpoint 'digits', recipe 'shapes'\)"):
        train(recipe, resume=finished.run_dir / "checkpoints" / "last.ckpt")
    assert not (tmp_path / "tiny").exists()


@pytest.mark.parametrize("damage", ["truncated", "safetensors", "not_lightning", "directory", "step_count"])
def test_unusable_resume_file_gets_a_message(finished: RunResult, tmp_path: Path, damage: str) -> None:
    last = finished.run_dir / "checkpoints" / "last.ckpt"
    if damage == "truncated":
        resume = tmp_path / "last.ckpt"
        resume.write_bytes(last.read_bytes()[: last.stat().st_size // 2])
        expected = "truncated or corrupt"
    elif damage == "safetensors":
        resume, expected = finished.run_dir / "model.safetensors", "holds the weights only"
    elif damage == "not_lightning":
        resume = tmp_path / "weights.ckpt"
        torch.save({"state_dict": load_checkpoint(last)["state_dict"]}, resume)
        expected = "not a vitkit training checkpoint"
    elif damage == "step_count":  # the record a resumed run reads its global step from
        checkpoint = load_checkpoint(last)
        checkpoint["loops"]["fit_loop"]["epoch_loop.manual_optimization.optim_step_progress"] = {"total": {"completed": "4"}}
        resume = tmp_path / "edited.ckpt"
        torch.save(checkpoint, resume)
        expected = "does not count the optimiser steps taken"
    else:
        resume, expected = finished.run_dir / "checkpoints", "is a directory"
    with pytest.raises(CheckpointError, match=expected):
        train(short_recipe(tmp_path), resume=resume)


# --- 4. SIGTERM is not success ----------------------------------------------------------------


def _stopped_run(tmp_path: Path, stop: signal.Signals, timeout: float, **trainer: object) -> tuple[int, str]:
    """Exit status and stderr of ``tools/train.py`` on a long tiny run sent ``stop`` once ``last.ckpt``
    exists (at every process of the run, as a terminal or a scheduler sends it), which must end within
    ``timeout`` seconds."""
    recipe = write_tiny_recipe(tmp_path, **{**SHORT, "max_epochs": 100, "checkpoint_every_n_steps": 2,
                                                "limit_train_batches": 10, **trainer})
    process = subprocess.Popen([sys.executable, "tools/train.py", str(recipe)], cwd=ROOT, env=tool_env(),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and process.poll() is None:
        if list((tmp_path / "runs").glob("tiny/*/checkpoints/last.ckpt")):
            break
        time.sleep(0.2)
    os.killpg(process.pid, stop)
    try:
        _, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)  # every rank: they share the session
        process.communicate()
        raise
    return process.returncode, stderr


@pytest.mark.parametrize(("stop", "status", "words"), [(signal.SIGTERM, 143, "SIGTERM"), (signal.SIGINT, 130, "Ctrl-C")])
def test_sigterm_or_ctrl_c_saves_last_checkpoint_says_how_to_resume_and_exits_128_plus_the_signal(
    tmp_path: Path, stop: signal.Signals, status: int, words: str
) -> None:
    returncode, stderr = _stopped_run(tmp_path, stop, timeout=120)
    assert returncode == status, stderr[-2000:]
    assert "Traceback" not in stderr and f"error: stopped by {words} at step" in stderr
    command = re.search(r"Resume with: vitkit train (\S+) --resume (\S+)", stderr)
    assert command, stderr[-2000:]
    config, last = Path(command.group(1)), Path(command.group(2))
    assert config.name == "config.yaml" and config.is_file()
    checkpoint = load_checkpoint(last)
    assert 0 < checkpoint["global_step"] < 100 * 10
    assert f"holds step {checkpoint['global_step']}" in stderr  # saved at the stop, not at the last schedule


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_sigterm_stops_both_processes_of_a_two_process_run_at_one_step_with_143(tmp_path: Path, strategy: str) -> None:
    returncode, stderr = _stopped_run(tmp_path, signal.SIGTERM, timeout=60, strategy=strategy, devices=2)
    assert returncode == 143 and "Traceback" not in stderr, stderr[-3000:]
    step = int(re.search(r"error: stopped by SIGTERM at step (\d+) .* holds step \1\.", stderr).group(1))
    (checkpoints,) = (tmp_path / "runs").glob("tiny/*/checkpoints")
    assert not list(checkpoints.glob("*.tmp"))  # no half-written checkpoint
    last = checkpoints / "last.ckpt"
    saved = load_checkpoint(last / "meta.pt" if strategy == "fsdp" else last)
    assert saved["global_step"] == step > 0


class SigtermAfterTheTest(L.Callback):
    """Sends this process SIGTERM when the end-of-run test ends (where the k-NN of a pre-training
    run works), and records the stages that start after it."""

    def __init__(self) -> None:
        self.later_stages: list[str] = []

    def on_test_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        os.kill(os.getpid(), signal.SIGTERM)

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.state.fn == "validate":  # not the validation of a training epoch
            self.later_stages.append("validate")


def test_sigterm_during_the_end_of_run_work_stops_it_at_once_with_143_keeping_the_checkpoints(tmp_path: Path) -> None:
    sender, handler = SigtermAfterTheTest(), signal.getsignal(signal.SIGTERM)
    with pytest.raises(RunStoppedError, match=r"stopped by SIGTERM at step 4 .* holds step 4") as stopped:
        train(short_recipe(tmp_path), callbacks=[sender])
    assert stopped.value.exit_status == 143 and sender.later_stages == []  # the best weights were not validated
    (run_dir,) = (tmp_path / "tiny").iterdir()
    assert load_checkpoint(run_dir / "checkpoints" / "last.ckpt")["global_step"] == 4
    assert not (run_dir / "model.safetensors").exists() and signal.getsignal(signal.SIGTERM) is handler


class SigtermAtStep(L.Callback):
    """Sends this process SIGTERM at the end of optimiser step ``step``."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer: L.Trainer, *args: object) -> None:
        if trainer.global_step == self.step:
            os.kill(os.getpid(), signal.SIGTERM)


def test_sigterm_of_an_fsdp_run_names_its_sharded_last_checkpoint(tmp_path: Path) -> None:
    with pytest.raises(RunStoppedError, match=r"stopped by SIGTERM at step 2 .*last\.ckpt holds step 2\.") as stopped:
        train(short_recipe(tmp_path), ["trainer.strategy=fsdp", "trainer.devices=1"], callbacks=[SigtermAtStep(2)])
    (run_dir,) = (tmp_path / "tiny").iterdir()
    assert stopped.value.exit_status == 143 and (run_dir / "checkpoints" / "last.ckpt" / "meta.pt").is_file()


# --- 7. orphan temporary files of a killed save -----------------------------------------------


def test_orphan_temp_files_are_removed_at_the_next_save(tmp_path: Path) -> None:
    orphan = tmp_path / ".last.ckpt.x1y2z3.tmp"
    orphan.write_bytes(b"half a checkpoint")
    unrelated = tmp_path / "notes.tmp"
    unrelated.write_text("keep me")
    AtomicCheckpointIO().save_checkpoint({"step": torch.tensor(3)}, tmp_path / "best.ckpt")
    assert not orphan.exists() and unrelated.exists()
    assert load_checkpoint(tmp_path / "best.ckpt")["step"] == 3


def test_orphan_temp_files_are_removed_at_resume(finished: RunResult, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(finished.run_dir, run_dir)
    orphan = run_dir / "checkpoints" / ".last.ckpt.abc123.tmp"
    orphan.write_bytes(b"half a checkpoint")
    epochs = load_checkpoint(run_dir / "checkpoints" / "last.ckpt")["epoch"] + 1
    result = train(short_recipe(tmp_path, max_epochs=epochs), resume=run_dir / "checkpoints" / "last.ckpt")
    assert result.run_dir == run_dir and not orphan.exists()


# --- full disk and the command-line tools -----------------------------------------------------


def test_full_disk_during_a_checkpoint_is_one_error_line(tmp_path: Path, monkeypatch, capsys, load_tool) -> None:
    def no_space(obj: object, path: str) -> None:
        Path(path).write_bytes(b"partial")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)

    monkeypatch.setattr("vitkit.train.checkpoint.torch.save", no_space)
    code = load_tool("train").main([str(write_tiny_recipe(tmp_path, **SHORT, checkpoint_every_n_steps=1))])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1 and "no space left on device" in lines[0], err[-2000:]
    assert not list((tmp_path / "runs").rglob("*.tmp"))  # the partial file is removed


TOOL_MISTAKES: dict[str, tuple[list[str], int, str]] = {
    # tool: (arguments, exit status, words of the message)
    "train": (["recipes/quickstart.yaml", "trainer.max_epoch=1"], 2, "trainer.max_epoch"),
    "evaluate": (["MISSING/model.safetensors"], 2, "does not exist"),
    "attention_maps": (["--checkpoint", "missing.safetensors", "x.png", "--out", "OUT"], 2, "does not exist"),
    "attention_report": (["--checkpoint", "missing.safetensors", "--out", "OUT"], 2, "does not exist"),
    "localization": (["--checkpoint", "missing.safetensors"], 2, "does not exist"),
    "prune_heads": (["--checkpoint", "missing.safetensors", "--out", "OUT"], 2, "does not exist"),
    "ablate_heads": (["recipes/quickstart.yaml", "optim.lr=-1", "--out", "OUT"], 2, "optim.lr"),
    "make_subset": (["missing_source", "OUT", "--classes", "1", "--images", "1"], 2, "source folder"),
    "time_to_accuracy": (["recipes/quickstart.yaml", "model.dept=1", "--out", "OUT"], 2, "model.dept"),
    "init_ablation": (["recipes/quickstart.yaml", "data.nam=x", "--out", "OUT"], 2, "data.nam"),
}


@pytest.mark.parametrize("tool", sorted(TOOL_MISTAKES))
def test_every_tool_reports_a_mistake_in_one_line(tool: str, tmp_path: Path, capsys, load_tool) -> None:
    arguments, status, words = TOOL_MISTAKES[tool]
    arguments = [str(tmp_path / "out") if a == "OUT" else a for a in arguments]
    arguments = [a.replace("MISSING", str(tmp_path / "missing")) for a in arguments]
    main: Callable[[list[str]], int] = load_tool(tool).main
    assert main(arguments) == status
    err = capsys.readouterr().err
    assert err.startswith("error: ") and words in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "missing").exists()  # no output folder claimed for an input that is not there
    with pytest.raises((VitkitError, OSError)):
        main([*arguments, "--debug"])  # --debug lets the error through, with its traceback


@pytest.mark.parametrize("tool", ["attention_maps", "attention_report", "prune_heads"])
def test_batch_size_zero_is_refused_as_such(tool: str, capsys, load_tool) -> None:
    with pytest.raises(SystemExit) as exited:
        load_tool(tool).main(["--checkpoint", "model.safetensors", "--out", "out", "--batch-size", "0"])
    assert exited.value.code == 2
    assert "--batch-size: must be at least 1, got 0" in capsys.readouterr().err


def test_an_output_folder_that_is_a_file_is_one_error_line(finished: RunResult, tmp_path: Path, capsys,
                                                           load_tool) -> None:
    blocker = tmp_path / "eval"
    blocker.write_text("a file where the output folder should go")
    code = load_tool("evaluate").main([str(finished.run_dir / "model.safetensors"), "--out", str(blocker)])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: ") and str(blocker) in err and "Traceback" not in err


@pytest.mark.slow
def test_resuming_with_an_edited_recipe_is_refused_naming_the_change_and_writes_nothing(tmp_path: Path) -> None:
    from vitkit.schema import RecipeError
    from vitkit.train import train as train_run

    first = train_run(short_recipe(tmp_path / "runs"))
    last = first.run_dir / "checkpoints" / "last.ckpt"
    before = snapshot(first.run_dir)
    edited = short_recipe(tmp_path / "runs")
    edited["optim"]["lr"] = 1e-4  # the recipe file edited since the run started
    with pytest.raises(RecipeError, match=r"optim.lr 0.005 -> 0.0001; resume with the run's own recipe") as error:
        train_run(edited, resume=last)
    assert "\n" not in str(error.value) and snapshot(first.run_dir) == before
    extended = train_run(short_recipe(tmp_path / "runs", max_epochs=2), resume=last)  # more epochs may change
    assert extended.run_dir == first.run_dir


def test_a_run_that_fails_mid_fit_leaves_the_process_as_it_found_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The Ctrl-C handler and the CUDA check setting a fit installs are put back when the fit
    raises, not only when it ends (Lightning calls ``on_exception`` then, not ``teardown``)."""
    monkeypatch.setenv("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    handler = signal.getsignal(signal.SIGINT)
    seen = {}

    class Fails(L.Callback):
        def on_train_batch_end(self, trainer: L.Trainer, *args: object) -> None:
            if trainer.global_step == 2:
                seen["sigint"], seen["check"] = signal.getsignal(signal.SIGINT), os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"]
                raise ValueError("a bug in a user's callback")

    recipe = yaml.safe_load(write_tiny_recipe(tmp_path, limit_train_batches=6).read_text())
    with pytest.raises(ValueError, match="a bug in a user's callback"):
        train(recipe, callbacks=[Fails()])
    assert seen["sigint"] is not handler  # the fit had installed its own
    assert seen["check"] == ("1" if torch.cuda.device_count() else "0")
    assert signal.getsignal(signal.SIGINT) is handler
    assert os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] == "1"
