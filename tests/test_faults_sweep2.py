"""The second reliability sweep (issue 23): hostile or unlucky input that lost data, hung, exhausted
memory or ended in a traceback. Each case now ends in one clear error (or the correct result),
nothing overwritten, no hang, memory bounded by the declared data. Test names carry the defect's
number (D4, D11, ...)."""

from __future__ import annotations

import gzip
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from cifar_files import dump
from mnist_files import fabricate_mnist, write_idx
from test_faults import short_recipe, snapshot
from tiny_runs import ROOT, tool_env

from vitkit.data import CifarFileError, DataConfig, build_datasets
from vitkit.data.cifar import read_pickle
from vitkit.data.mnist import IMAGES_MAGIC, IdxFileError, read_idx
from vitkit.output_dirs import MARKER, OutputDirError, claim_output_dir, hold
from vitkit.train import CheckpointError, RunResult, load_checkpoint, train
from vitkit.train.schema import RecipeError


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> RunResult:
    return train(short_recipe(tmp_path_factory.mktemp("runs"), checkpoint_every_n_steps=2))


def _copy_run(finished: RunResult, tmp_path: Path) -> Path:
    run_dir = tmp_path / "run"
    shutil.copytree(finished.run_dir, run_dir)
    return run_dir


def _one_error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1 and "Traceback" not in err, err[-2000:]
    return lines[0]


# --- D4, D1, D2, D3: IDX files ------------------------------------------------------------------


def _gzip_bomb(path: Path, header: bytes, inflated: int) -> Path:
    """``header`` then ``inflated`` zero bytes, gzipped (about 1 MB per GiB), written in chunks."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)  # wbits 31: a gzip container
    chunk = bytes(1 << 24)
    with open(path, "wb") as handle:
        handle.write(packer.compress(header))
        for _ in range(inflated // len(chunk)):
            handle.write(packer.compress(chunk))
        handle.write(packer.flush())
    return path


def test_d4_an_idx_gzip_bomb_is_refused_within_the_declared_memory(tmp_path: Path) -> None:
    """1 MB inflating to 1 GiB behind a header declaring 10000 28x28 images (7.8 MB): the old
    reader decompressed all of it (2.9 GB RSS); now at most the declared bytes (+1) are inflated."""
    header = IMAGES_MAGIC.to_bytes(4, "big") + b"".join(n.to_bytes(4, "big") for n in (10000, 28, 28))
    bomb = _gzip_bomb(tmp_path / "t10k-images-idx3-ubyte.gz", header, 1 << 30)
    assert bomb.stat().st_size < 2 << 20
    script = textwrap.dedent(f"""
        import resource
        from vitkit.data.mnist import IMAGES_MAGIC, IdxFileError, read_idx
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        try:
            read_idx({str(bomb)!r}, IMAGES_MAGIC)
            outcome = "read"
        except IdxFileError as error:
            outcome = "refused" if "truncated or corrupt" in str(error) else str(error)
        grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
        print(outcome, round(grown_mb))
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                            env=tool_env(), cwd=ROOT)
    outcome, grown_mb = result.stdout.split()
    assert outcome == "refused" and int(grown_mb) < 64, result.stdout + result.stderr[-2000:]


def test_d4_a_gzip_declaring_more_than_deflate_can_hold_is_refused_unread(tmp_path: Path) -> None:
    header = IMAGES_MAGIC.to_bytes(4, "big") + b"".join(n.to_bytes(4, "big") for n in (4_000_000, 28, 28))
    path = tmp_path / "x.gz"
    path.write_bytes(gzip.compress(header + bytes(100)))
    with pytest.raises(IdxFileError, match="more than a .*gzip file can hold"):
        read_idx(path, IMAGES_MAGIC)


def test_d1_dimensions_that_overflow_int64_are_one_error(tmp_path: Path) -> None:
    header = IMAGES_MAGIC.to_bytes(4, "big") + b"\xff\xff\xff\xff" * 3
    (tmp_path / "raw").write_bytes(header)
    with pytest.raises(IdxFileError, match="each side must be"):
        read_idx(tmp_path / "raw", IMAGES_MAGIC)
    header = IMAGES_MAGIC.to_bytes(4, "big") + b"\xff\xff\xff\xff" + (4096).to_bytes(4, "big") * 2
    (tmp_path / "raw").write_bytes(header)
    with pytest.raises(IdxFileError, match="more than a"):
        read_idx(tmp_path / "raw", IMAGES_MAGIC)


def _mnist_config(root: Path) -> DataConfig:
    return DataConfig(name="fashion_mnist", root=str(root), num_workers=0)


def test_d2_a_training_set_of_no_images_is_refused(tmp_path: Path) -> None:
    fabricate_mnist(tmp_path)
    write_idx(tmp_path / "train-images-idx3-ubyte.gz", np.zeros((0, 28, 28)))
    write_idx(tmp_path / "train-labels-idx1-ubyte.gz", np.zeros((0,)))
    with pytest.raises(IdxFileError, match="holds no images"):
        build_datasets(_mnist_config(tmp_path))


@pytest.mark.parametrize("shape", [(20, 1, 1), (20, 1, 784)])
def test_d3_test_images_of_another_geometry_are_refused_not_resized(tmp_path: Path, shape: tuple) -> None:
    fabricate_mnist(tmp_path)
    write_idx(tmp_path / "t10k-images-idx3-ubyte.gz", np.zeros(shape))
    with pytest.raises(IdxFileError, match="must be the training set's geometry"):
        build_datasets(_mnist_config(tmp_path))


# --- D16: a FIFO as the autotune cache ---------------------------------------------------------


def test_d16_a_fifo_as_autotune_cache_is_ignored_not_waited_on(tmp_path: Path) -> None:
    """In a subprocess with a deadline: the old reader blocked in open() forever (SIGTERM ignored)."""
    fifo = tmp_path / "cache.json"
    os.mkfifo(fifo)
    script = textwrap.dedent("""
        import warnings, torch
        from vitkit.layers.attention_autotune import AutotuneKey, Autotuner
        q = torch.randn(1, 2, 5, 8)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert Autotuner({}).cached(AutotuneKey.of(q, q, False, 0.0)) is None  # reads $VITKIT_AUTOTUNE_CACHE
        print(any("not a regular file" in str(w.message) for w in caught))
    """)
    env = {**tool_env(), "VITKIT_AUTOTUNE_CACHE": str(fifo)}
    try:
        result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, env=env,
                                cwd=ROOT)
    except subprocess.TimeoutExpired:
        pytest.fail("the first attention call waited on the FIFO")
    assert result.stdout.strip() == "True", result.stderr[-2000:]
    assert fifo.is_fifo()


# --- D11: a refused --resume changes nothing ----------------------------------------------------


def _damaged_checkpoint(source: Path, target: Path, damage: str) -> Path:
    checkpoint = load_checkpoint(source)
    if damage == "no optimiser state":
        del checkpoint["optimizer_states"]
    elif damage == "other parameter groups":
        groups = checkpoint["optimizer_states"][0]["param_groups"]
        groups[0]["params"] = groups[0]["params"][:-1]
    elif damage == "wrong optimiser state shape":
        state = checkpoint["optimizer_states"][0]["state"]
        first = next(iter(state))
        state[first]["exp_avg"] = torch.zeros(3, 3)
    elif damage == "wrong weight shape":
        name = next(key for key in checkpoint["state_dict"] if key.endswith("head.weight"))
        checkpoint["state_dict"][name] = torch.zeros(1, 1)
    torch.save(checkpoint, target)
    return target


@pytest.mark.parametrize(
    "damage", ["no optimiser state", "other parameter groups", "wrong optimiser state shape", "wrong weight shape"]
)
def test_d11_a_refused_resume_leaves_the_run_byte_identical(finished: RunResult, tmp_path: Path, damage: str) -> None:
    run_dir = _copy_run(finished, tmp_path)
    checkpoint = _damaged_checkpoint(run_dir / "checkpoints" / "last.ckpt", run_dir / "checkpoints" / "last.ckpt", damage)
    before = snapshot(tmp_path)
    with pytest.raises(CheckpointError, match="cannot continue this run"):
        train(short_recipe(tmp_path / "runs", max_epochs=5), ["trainer.max_epochs=7"], resume=checkpoint)
    assert snapshot(tmp_path) == before


# --- D13: values Lightning would refuse, before a run directory is claimed ---------------------


@pytest.mark.parametrize("override, words", [
    ("trainer.limit_train_batches=1.5", "limit_train_batches"),
    ("trainer.strategy=garbage", "strategy"),
    ("trainer.accelerator=gpu", "cannot run on this machine"),
    ("trainer.devices=[5]", "cannot run on this machine"),
    ("data.augment.rand_augment=rand-q7", "rand_augment"),
])
def test_d13_values_lightning_or_timm_refuse_leave_no_run_directory(tmp_path: Path, override: str, words: str) -> None:
    if "accelerator=gpu" in override and torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(RecipeError, match=words):
        train(short_recipe(tmp_path / "runs"), [override])
    assert not (tmp_path / "runs").exists()


# --- D18: two resumes of one run ---------------------------------------------------------------


def test_d18_a_second_resume_of_a_run_in_use_is_refused_and_changes_nothing(finished: RunResult, tmp_path: Path) -> None:
    run_dir = _copy_run(finished, tmp_path)
    last = run_dir / "checkpoints" / "last.ckpt"
    with hold(run_dir):  # another process resuming (or still training) this run
        before = snapshot(run_dir)
        with pytest.raises(OutputDirError, match="in use by another vitkit process"):
            train(short_recipe(tmp_path / "runs", max_epochs=5), ["trainer.max_epochs=9"], resume=last)
        after = snapshot(run_dir)
    assert {k: v for k, v in after.items() if k != MARKER} == {k: v for k, v in before.items() if k != MARKER}


def test_d18_the_lock_of_a_killed_run_is_not_stale(tmp_path: Path) -> None:
    folder = claim_output_dir(tmp_path / "run", "train")
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from vitkit.output_dirs import hold\n"
         f"with hold({str(folder)!r}):\n    print('held', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True, env=tool_env(), cwd=ROOT,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(OutputDirError, match=f"pid {holder.pid}"), hold(folder):
            pass
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
    with hold(folder):  # the kernel released the killed process's lock
        pass


# --- D19: a folder that is not a run is not adopted --------------------------------------------


def test_d19_resume_from_a_folder_vitkit_did_not_write_starts_a_new_run(finished: RunResult, tmp_path: Path) -> None:
    user = tmp_path / "mine"
    (user / "anything").mkdir(parents=True)
    (user / "config.yaml").write_text("my own: config\n")
    (user / "summary.json").write_text('{"mine": true}\n')
    shutil.copy(finished.run_dir / "checkpoints" / "last.ckpt", user / "anything" / "last.ckpt")
    before = snapshot(tmp_path)
    epochs = load_checkpoint(user / "anything" / "last.ckpt")["epoch"] + 1
    result = train(short_recipe(tmp_path / "runs", max_epochs=epochs), resume=user / "anything" / "last.ckpt")
    assert result.run_dir.parent == tmp_path / "runs" / "tiny"
    assert {k: v for k, v in snapshot(tmp_path).items() if k.startswith("mine")} == before
    assert not (tmp_path / "latest").exists()


# --- D23: an output folder holding another writer's results ------------------------------------


def test_d23_prune_heads_refuses_a_training_run_as_its_output(finished: RunResult, tmp_path: Path, capsys,
                                                               load_tool) -> None:
    run_dir = _copy_run(finished, tmp_path)
    before = snapshot(run_dir)
    code = load_tool("prune_heads").main(["--checkpoint", str(run_dir / "model.safetensors"), "--out", str(run_dir)])
    assert code == 1 and "is a training run" in _one_error_line(capsys.readouterr().err)
    assert snapshot(run_dir) == before


def test_d23_output_folders_are_refused_unless_their_own(tmp_path: Path) -> None:
    claim_output_dir(tmp_path / "a", "prune_heads")
    claim_output_dir(tmp_path / "a", "prune_heads")  # a rerun replaces its own results
    with pytest.raises(OutputDirError, match="prune_heads's output folder"):
        claim_output_dir(tmp_path / "a", "evaluate")
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "summary.json").write_text("{}")
    with pytest.raises(OutputDirError, match="already holds summary.json"):
        claim_output_dir(tmp_path / "b", "prune_heads")
    assert not (tmp_path / "b" / MARKER).exists()


# --- D5: a CIFAR pickle memory bomb -------------------------------------------------------------


class _HugeArray:
    """Pickles as numpy's own ``_reconstruct(ndarray, shape, dtype)`` call, asking for 28.6 GiB."""

    def __reduce__(self) -> tuple:
        return np.ndarray.__reduce__(np.zeros(1, np.uint8))[0], (np.ndarray, (30_700_000_000,), b"b")


class _CalledNdarray:
    """Pickles as ``numpy.ndarray((28.6 GiB,))``: the constructor itself allocates."""

    def __reduce__(self) -> tuple:
        return np.ndarray, ((30_700_000_000,), np.dtype("u1"))


@pytest.mark.parametrize("bomb", [_HugeArray(), _CalledNdarray()], ids=["reconstruct", "constructor"])
def test_d5_a_tiny_cifar_pickle_cannot_request_gigabytes(tmp_path: Path, bomb: object) -> None:
    path = tmp_path / "data_batch_1"
    dump(path, {"data": bomb, "labels": [0]})
    assert path.stat().st_size < 200
    with pytest.raises(CifarFileError, match="not a valid CIFAR batch file"):
        read_pickle(path)
