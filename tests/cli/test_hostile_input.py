"""Hostile or unlucky input that once lost data, hung, exhausted memory or ended in a traceback:
each case ends in one clear error (or the correct result), nothing overwritten, no hang, memory
bounded by the declared data. Tests are named by the behaviour they keep."""

from __future__ import annotations

import errno
import gzip
import json
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
from PIL import Image
from safetensors import SafetensorError
from safetensors.torch import save_file
from tiny_models import save_tiny, tiny_shapes_model
from tiny_runs import ROOT, short_recipe, snapshot, tool_env

import vitkit
import vitkit.data.arrays as arrays_module
from vitkit.cli.common import describe_os_error
from vitkit.data import CifarFileError, DataConfig, build_datasets
from vitkit.data.arrays import ResizeMemoryError, resize_images
from vitkit.data.cifar import read_pickle
from vitkit.data.mnist import IMAGES_MAGIC, IdxFileError, read_idx
from vitkit.files import write_json
from vitkit.io import CONFIG_KEY, EXTRA_KEY, FORMAT_KEY, ModelFileError, load_model_and_extra
from vitkit.output_dirs import MARKER, OutputDirError, claim_output_dir, hold, mark, release_output_dirs
from vitkit.pretrained import PretrainedError, read_pretrained
from vitkit.prune import prune_heads
from vitkit.schema import RecipeError
from vitkit.train import CheckpointError, RunResult, load_checkpoint, load_recipe, train
from vitkit.train.checkpoint import AtomicCheckpointIO


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


# --- IDX files ------------------------------------------------------------------


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


def test_an_idx_gzip_bomb_is_refused_within_the_declared_memory(tmp_path: Path) -> None:
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


def test_a_gzip_declaring_more_than_deflate_can_hold_is_refused_unread(tmp_path: Path) -> None:
    header = IMAGES_MAGIC.to_bytes(4, "big") + b"".join(n.to_bytes(4, "big") for n in (4_000_000, 28, 28))
    path = tmp_path / "x.gz"
    path.write_bytes(gzip.compress(header + bytes(100)))
    with pytest.raises(IdxFileError, match="more than a .*gzip file can hold"):
        read_idx(path, IMAGES_MAGIC)


def test_dimensions_that_overflow_int64_are_one_error(tmp_path: Path) -> None:
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


def test_a_training_set_of_no_images_is_refused(tmp_path: Path) -> None:
    fabricate_mnist(tmp_path)
    write_idx(tmp_path / "train-images-idx3-ubyte.gz", np.zeros((0, 28, 28)))
    write_idx(tmp_path / "train-labels-idx1-ubyte.gz", np.zeros((0,)))
    with pytest.raises(IdxFileError, match="holds no images"):
        build_datasets(_mnist_config(tmp_path))


@pytest.mark.parametrize("shape", [(20, 1, 1), (20, 1, 784)])
def test_test_images_of_another_geometry_are_refused_not_resized(tmp_path: Path, shape: tuple) -> None:
    fabricate_mnist(tmp_path)
    write_idx(tmp_path / "t10k-images-idx3-ubyte.gz", np.zeros(shape))
    with pytest.raises(IdxFileError, match="must be the training set's geometry"):
        build_datasets(_mnist_config(tmp_path))


# --- a FIFO as the autotune cache ---------------------------------------------------------


def test_a_fifo_as_autotune_cache_is_ignored_not_waited_on(tmp_path: Path) -> None:
    """In a subprocess with a deadline: the old reader blocked in open() forever (SIGTERM ignored)."""
    fifo = tmp_path / "cache.json"
    os.mkfifo(fifo)
    script = textwrap.dedent("""
        import warnings, torch
        from vitkit.kernels.autotune import AutotuneKey, Autotuner
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


# --- a refused --resume changes nothing ----------------------------------------------------


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
def test_a_refused_resume_leaves_the_run_byte_identical(finished: RunResult, tmp_path: Path, damage: str) -> None:
    run_dir = _copy_run(finished, tmp_path)
    checkpoint = _damaged_checkpoint(run_dir / "checkpoints" / "last.ckpt", run_dir / "checkpoints" / "last.ckpt", damage)
    before = snapshot(tmp_path)
    with pytest.raises(CheckpointError, match="cannot continue this run"):
        train(short_recipe(tmp_path / "runs", max_epochs=5), ["trainer.max_epochs=7"], resume=checkpoint)
    assert snapshot(tmp_path) == before


# --- values Lightning would refuse, before a run directory is claimed ---------------------


@pytest.mark.parametrize("override, words", [
    ("trainer.limit_train_batches=1.5", "limit_train_batches"),
    ("trainer.strategy=garbage", "strategy"),
    ("trainer.accelerator=gpu", "cannot run on this machine"),
    ("trainer.devices=[5]", "cannot run on this machine"),
    ("data.augment.rand_augment=rand-q7", "rand_augment"),
])
def test_values_lightning_or_timm_refuse_leave_no_run_directory(tmp_path: Path, override: str, words: str) -> None:
    if "accelerator=gpu" in override and torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(RecipeError, match=words):
        train(short_recipe(tmp_path / "runs"), [override])
    assert not (tmp_path / "runs").exists()


# --- two resumes of one run ---------------------------------------------------------------


def test_a_second_resume_of_a_run_in_use_is_refused_and_changes_nothing(finished: RunResult, tmp_path: Path) -> None:
    run_dir = _copy_run(finished, tmp_path)
    last = run_dir / "checkpoints" / "last.ckpt"
    with hold(run_dir):  # another process resuming (or still training) this run
        before = snapshot(run_dir)
        with pytest.raises(OutputDirError, match="in use by another vitkit process"):
            train(short_recipe(tmp_path / "runs", max_epochs=5), ["trainer.max_epochs=9"], resume=last)
        after = snapshot(run_dir)
    assert {k: v for k, v in after.items() if k != MARKER} == {k: v for k, v in before.items() if k != MARKER}


def test_the_lock_of_a_killed_run_is_not_stale(tmp_path: Path) -> None:
    folder = mark(tmp_path / "run", "train")  # a run directory, as training marks it
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


# --- a folder that is not a run is not adopted --------------------------------------------


def test_resume_from_a_folder_vitkit_did_not_write_starts_a_new_run(finished: RunResult, tmp_path: Path) -> None:
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


# --- an output folder holding another writer's results ------------------------------------


def test_prune_heads_refuses_a_training_run_as_its_output(finished: RunResult, tmp_path: Path, capsys,
                                                               load_tool) -> None:
    run_dir = _copy_run(finished, tmp_path)
    before = snapshot(run_dir)
    code = load_tool("prune_heads").main(["--checkpoint", str(run_dir / "model.safetensors"), "--out", str(run_dir)])
    assert code == 2 and "is a training run" in _one_error_line(capsys.readouterr().err)
    assert snapshot(run_dir) == before


def test_output_folders_are_refused_unless_their_own(tmp_path: Path) -> None:
    claim_output_dir(tmp_path / "a", "prune_heads")
    release_output_dirs(complete=True)  # what the end of the command does
    claim_output_dir(tmp_path / "a", "prune_heads")  # a rerun replaces its own results
    release_output_dirs(complete=True)
    with pytest.raises(OutputDirError, match="prune_heads's output folder"):
        claim_output_dir(tmp_path / "a", "evaluate")
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "summary.json").write_text("{}")
    with pytest.raises(OutputDirError, match="already holds summary.json"):
        claim_output_dir(tmp_path / "b", "prune_heads")
    assert not (tmp_path / "b" / MARKER).exists()


def test_a_tool_folder_is_locked_while_its_command_runs_and_marked_complete_after(tmp_path: Path) -> None:
    folder = tmp_path / "maps"
    claim_output_dir(folder, "attention_maps")
    assert json.loads((folder / MARKER).read_text())["state"] == "running"
    holder = subprocess.Popen(  # a second maps command into the same folder, while the first runs
        [sys.executable, "-c", "from vitkit.output_dirs import claim_output_dir\n"
         f"claim_output_dir({str(folder)!r}, 'attention_maps')"],
        stderr=subprocess.PIPE, text=True, env=tool_env(), cwd=ROOT,
    )
    _, err = holder.communicate(timeout=60)
    assert holder.returncode != 0 and f"in use by another vitkit process (pid {os.getpid()})" in err
    release_output_dirs(complete=True)
    assert json.loads((folder / MARKER).read_text())["state"] == "complete"


def test_a_folder_a_stopped_command_left_is_named_by_the_next_run(tmp_path: Path, capsys, load_tool) -> None:
    folder = tmp_path / "prune"
    folder.mkdir()
    (folder / MARKER).write_text(json.dumps({"written_by": "prune_heads", "state": "running", "pid": 1}))
    claim_output_dir(folder, "prune_heads")
    release_output_dirs(complete=False)  # stopped again: the state stays running
    assert "the previous prune_heads run into" in capsys.readouterr().err
    assert json.loads((folder / MARKER).read_text())["state"] == "running"


# --- a CIFAR pickle memory bomb -------------------------------------------------------------


class _HugeArray:
    """Pickles as numpy's own ``_reconstruct(ndarray, shape, dtype)`` call, asking for 28.6 GiB."""

    def __reduce__(self) -> tuple:
        return np.ndarray.__reduce__(np.zeros(1, np.uint8))[0], (np.ndarray, (30_700_000_000,), b"b")


class _CalledNdarray:
    """Pickles as ``numpy.ndarray((28.6 GiB,))``: the constructor itself allocates."""

    def __reduce__(self) -> tuple:
        return np.ndarray, ((30_700_000_000,), np.dtype("u1"))


@pytest.mark.parametrize("bomb", [_HugeArray(), _CalledNdarray()], ids=["reconstruct", "constructor"])
def test_a_tiny_cifar_pickle_cannot_request_gigabytes(tmp_path: Path, bomb: object) -> None:
    path = tmp_path / "data_batch_1"
    dump(path, {"data": bomb, "labels": [0]})
    assert path.stat().st_size < 200
    with pytest.raises(CifarFileError, match="not a valid CIFAR batch file"):
        read_pickle(path)


# --- model files and .ckpt files -------------------------------------------


def _tiny_model() -> vitkit.VisionTransformer:
    return vitkit.create_model("vit_cifar_tiny", patch_size=8, embed_dim=24, depth=2, num_heads=3, num_classes=6)


def _model_file(path: Path, tensors: dict[str, torch.Tensor], config: dict, extra: dict) -> Path:
    metadata = {FORMAT_KEY: "1", CONFIG_KEY: json.dumps(config), EXTRA_KEY: json.dumps(extra)}
    save_file(tensors, str(path), metadata=metadata)
    return path


@pytest.mark.parametrize("damage", ["wrong shape", "extra tensor", "missing tensor", "pos_embed length"])
def test_tensors_that_do_not_match_the_config_are_one_error(tmp_path: Path, damage: str) -> None:
    model = _tiny_model()
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    if damage == "wrong shape":
        state["head.weight"] = torch.zeros(7, 24)
    elif damage == "extra tensor":
        state["surprise"] = torch.zeros(1)
    elif damage == "missing tensor":
        del state["blocks.1.mlp.fc2.weight"]
    else:
        state["pos_embed"] = torch.zeros(1, 7, 24)
    config = model.config.replace(num_heads=model.heads_per_layer()).to_dict()
    path = _model_file(tmp_path / "m.safetensors", state, config, {})
    with pytest.raises(ModelFileError, match="do not match its model config"):
        vitkit.load_model(path)


def test_a_header_relabelling_float_weights_as_integers_is_one_error_naming_the_tensor(tmp_path: Path, capsys,
                                                                                       load_tool) -> None:
    path = save_tiny(tiny_shapes_model(), tmp_path / "m.safetensors")
    raw, label = path.read_bytes(), b'"head.weight":{"dtype":"F32"'
    assert raw.count(label) == 1  # the same 4 bytes a value, read as integers near 1e9:
    path.write_bytes(raw.replace(label, label.replace(b"F32", b"I32")))
    with pytest.raises(ModelFileError, match=rf"model file {path}: tensor 'head.weight' is int32"):
        vitkit.load_model(path)
    image = tmp_path / "a.png"
    Image.new("RGB", (32, 32)).save(image)
    assert load_tool("predict").main([str(path), str(image)]) == 2
    assert "'head.weight' is int32" in _one_error_line(capsys.readouterr().err)


@pytest.mark.parametrize(("kind", "words"), [("folder", "is a folder"), ("fifo", r"is a FIFO \(named pipe\)"), ("device", "is a device")])
def test_a_model_path_that_is_no_file_is_named_for_what_it_is(tmp_path: Path, kind: str, words: str) -> None:
    path = Path("/dev/zero") if kind == "device" else tmp_path / "m.safetensors"
    if kind == "folder":  # as the folder of a sharded checkpoint is
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    with pytest.raises(PretrainedError, match=f"{path} {words}; give a vitkit model file"):
        read_pretrained(path)  # model.pretrained=
    if kind != "device":
        with pytest.raises(FileNotFoundError, match=f"model file {path} {words}; expected a file"):
            vitkit.load_model(path)


def test_a_file_as_an_image_folder_root_is_named_a_file(tmp_path: Path) -> None:
    root = tmp_path / "images.zip"
    root.write_bytes(b"PK")
    with pytest.raises(FileNotFoundError, match=f"{root} is a file; an image folder dataset is laid out as"):
        build_datasets(DataConfig(name="imagefolder", root=str(root), img_size=8))


def test_a_tiny_file_declaring_a_billion_weights_is_refused_before_allocation(tmp_path: Path) -> None:
    config = {"img_size": 224, "patch_size": 16, "embed_dim": 8192, "depth": 4, "num_heads": 16, "num_classes": 1000}
    path = _model_file(tmp_path / "m.safetensors", {"w": torch.zeros(4)}, config, {})
    script = textwrap.dedent(f"""
        import resource, vitkit
        from vitkit.io import ModelFileError
        from vitkit.models import VisionTransformer  # the libraries' own memory, before the file is read
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        try:
            vitkit.load_model({str(path)!r})
        except ModelFileError as error:
            print("refused", (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024)
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                            env=tool_env(), cwd=ROOT)
    outcome, grown_mb = result.stdout.split()
    assert outcome == "refused" and int(grown_mb) < 500, result.stderr[-2000:]  # 3.2e9 weights = 13 GB


@pytest.mark.parametrize("extra, words", [
    ({"img_size": [0, 32]}, "img_size"),
    ({"in_chans": 2}, "in_chans"),
    ({"in_chans": 1}, "the model takes 3"),
    ({"crop_pct": 0}, "crop_pct"),
    ({"data_config": [1, 2]}, "data_config"),
    ({"mean": "x"}, "mean"),
])
def test_bad_extra_metadata_is_one_error(tmp_path: Path, extra: dict, words: str) -> None:
    path = vitkit.save_model(_tiny_model(), tmp_path / "m.safetensors", extra=extra)
    with pytest.raises(ModelFileError, match=words):
        vitkit.load_model(path)


def test_d9_a_model_saved_without_extra_loads_and_tools_say_what_is_missing(tmp_path: Path, capsys,
                                                                                load_tool) -> None:
    path = vitkit.save_model(_tiny_model(), tmp_path / "m.safetensors")  # docs/models.md's own call
    model, extra = load_model_and_extra(path)
    assert extra == {} and model.num_classes == 6
    assert load_tool("evaluate").main([str(path)]) == 2
    assert "names no dataset" in _one_error_line(capsys.readouterr().err)
    images = tmp_path / "images"
    images.mkdir()
    Image.new("RGB", (32, 32)).save(images / "a.png")
    assert load_tool("attention_maps").main(["--checkpoint", str(path), str(images), "--out", str(tmp_path / "o")]) == 2
    assert "lacks mean, std" in _one_error_line(capsys.readouterr().err)


@pytest.mark.parametrize("damage", ["not a dict", "bad extra", "wrong shape", "class_names length"])
def test_a_damaged_training_checkpoint_is_one_error(finished: RunResult, tmp_path: Path, damage: str) -> None:
    checkpoint = load_checkpoint(finished.run_dir / "checkpoints" / "last.ckpt")
    if damage == "not a dict":
        checkpoint = [1, 2, 3]
    elif damage == "bad extra":
        checkpoint["hyper_parameters"]["extra"] = ["not", "a", "dict"]
    elif damage == "wrong shape":
        name = next(key for key in checkpoint["state_dict"] if key.endswith("head.bias"))
        checkpoint["state_dict"][name] = torch.zeros(99)
    else:
        checkpoint["hyper_parameters"]["extra"]["class_names"] = ["only one"]
    torch.save(checkpoint, tmp_path / "x.ckpt")
    with pytest.raises(CheckpointError):
        vitkit.load_model(tmp_path / "x.ckpt")


# --- huge integers --------------------------------------------------------------------------


@pytest.mark.parametrize("digits", [400, 5000])
def test_huge_integers_are_out_of_range_not_an_overflow(tmp_path: Path, digits: int) -> None:
    huge = "9" * digits
    with pytest.raises(RecipeError):
        load_recipe(short_recipe(tmp_path), [f"model.depth={huge}"])
    with pytest.raises(RecipeError):
        load_recipe(short_recipe(tmp_path), [f"optim.lr={huge}"])
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"trainer:\n  max_epochs: {huge}\n")
    with pytest.raises(RecipeError):
        load_recipe(recipe)
    path = _model_file(tmp_path / "m.safetensors", {"w": torch.zeros(1)}, {}, {})
    metadata = {FORMAT_KEY: "1", CONFIG_KEY: f'{{"depth": {huge}}}', EXTRA_KEY: "{}"}
    save_file({"w": torch.zeros(1)}, str(path), metadata=metadata)
    with pytest.raises(ModelFileError):
        vitkit.load_model(path)


# --- resizing a whole split at once --------------------------------------------------------


def test_resizing_works_a_chunk_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    images = np.random.default_rng(0).integers(0, 256, (10, 5, 6, 1), dtype=np.uint8)
    whole = resize_images(images, (9, 11))
    chunks = []
    real = torch.nn.functional.interpolate
    monkeypatch.setattr(arrays_module, "RESIZE_CHUNK_BYTES", 4 * 9 * 11 * 3)  # 3 images a chunk
    monkeypatch.setattr(arrays_module.F, "interpolate", lambda x, **kw: chunks.append(len(x)) or real(x, **kw))
    np.testing.assert_array_equal(resize_images(images, (9, 11)), whole)
    assert chunks == [3, 3, 3, 1]


def test_a_split_that_would_not_fit_in_memory_is_refused_before_allocating() -> None:
    images = np.zeros((60000, 1, 1, 1), dtype=np.uint8)  # Fashion-MNIST's count, at 4096 px: 1 TB
    with pytest.raises(ResizeMemoryError, match="choose a smaller data.img_size"):
        resize_images(images, (4096, 4096))


# --- D15, minor: recipe values no path can hold -------------------------------------------------


@pytest.mark.parametrize("override", ["output.dir=runs\x00x", "name=../../x", "name=a/b"])
def test_nul_bytes_and_paths_as_names_are_refused(tmp_path: Path, override: str) -> None:
    with pytest.raises(RecipeError):
        load_recipe(short_recipe(tmp_path), [override])


# --- a full disk, whatever the library raises ----------------------------------------------


@pytest.mark.parametrize("library", ["torch", "safetensors"])
def test_a_full_disk_is_named_whatever_the_library_raises(tmp_path: Path, monkeypatch, library: str) -> None:
    if library == "torch":
        def fail(*args: object, **kwargs: object) -> None:
            raise RuntimeError("[enforce fail at inline_container.cc:783] . PytorchStreamWriter failed writing "
                               "file data/0: file write failed")
        monkeypatch.setattr("vitkit.train.checkpoint.torch.save", fail)
        monkeypatch.setattr("vitkit.files._disk_full", lambda error, folder: "file write failed" in str(error))
        write = lambda: AtomicCheckpointIO().save_checkpoint({"x": torch.zeros(1)}, tmp_path / "last.ckpt")  # noqa: E731
    else:
        def fail(*args: object, **kwargs: object) -> None:
            raise SafetensorError("Error while serializing: IoError(Os { code: 28, kind: StorageFull, "
                                  "message: \"No space left on device\" })")
        monkeypatch.setattr("vitkit.io.save_file", fail)
        write = lambda: vitkit.save_model(_tiny_model(), tmp_path / "m.safetensors")  # noqa: E731
    with pytest.raises(OSError) as raised:
        write()
    assert raised.value.errno == errno.ENOSPC and "no space left" in describe_os_error(raised.value)
    assert not list(tmp_path.iterdir())


# --- bad --timm-weights files --------------------------------------------------------------


@pytest.mark.parametrize("content", ["corrupt", "pickled", "truncated", "wrong shape"])
def test_a_bad_timm_weights_file_is_one_error_exit_2(tmp_path: Path, capsys, load_tool, content: str) -> None:
    path = tmp_path / ("w.safetensors" if content == "corrupt" else "w.pth")
    if content == "corrupt":
        path.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all")
    elif content == "pickled":
        torch.save({"patch_embed.proj.weight": torch.zeros(1), "x": Path("evil")}, path)
    elif content == "truncated":
        torch.save({"patch_embed.proj.weight": torch.zeros(1000)}, path)
        path.write_bytes(path.read_bytes()[:200])
    else:
        torch.save({"patch_embed.proj.weight": torch.zeros(3, 3, 3, 3)}, path)
    images = tmp_path / "images"
    images.mkdir()
    Image.new("RGB", (32, 32)).save(images / "a.png")
    code = load_tool("attention_maps").main(["--model", "vit_cifar_tiny", "--timm-weights", str(path), str(images),
                                             "--out", str(tmp_path / "o")])
    assert code == 2
    _one_error_line(capsys.readouterr().err)


# --- D21, D22, D26, D27 and the minor counts: tool arguments ------------------------------------


@pytest.mark.parametrize("tool, arguments", [
    ("prune_heads", ["--max-drop", "nan"]),
    ("prune_heads", ["--max-drop", "-1"]),
    ("prune_heads", ["--step-fraction", "0"]),
    ("prune_heads", ["--step-fraction", "2"]),
    ("localization", ["--discard-ratio", "5"]),
    ("localization", ["--tolerance", "-3"]),
    ("attention_maps", ["--test-images", "-1"]),
    ("prune_heads", ["--num-threads", "0"]),
    ("time_to_accuracy", ["--budget-minutes", "0"]),
])
def test_d22_d26_out_of_range_tool_arguments_are_usage_errors(tool: str, arguments: list[str], capsys,
                                                                   load_tool) -> None:
    base = {"prune_heads": ["--checkpoint", "m.safetensors", "--out", "o"], "localization": ["--checkpoint", "m"],
            "attention_maps": ["--checkpoint", "m", "x.png", "--out", "o"], "time_to_accuracy": ["r.yaml"]}[tool]
    with pytest.raises(SystemExit) as exited:
        load_tool(tool).main([*base, *arguments])
    assert exited.value.code == 2
    assert arguments[0] in capsys.readouterr().err


@pytest.mark.parametrize("arguments", [["--repeats", "0"], ["--models", "vit_cifar_tiny:abc"], ["--models", "vit_cifar_tiny:8:depth"],
                                       ["--threads", "0"]])
def test_benchmark_refuses_bad_counts_and_model_specs(arguments: list[str]) -> None:
    result = subprocess.run([sys.executable, "tools/benchmark.py", *arguments], capture_output=True, text=True,
                            timeout=120, env=tool_env(), cwd=ROOT)
    assert result.returncode == 2 and arguments[0] in result.stderr and "Traceback" not in result.stderr


# --- a fully pruned model ------------------------------------------------------------------


@pytest.fixture
def headless(tmp_path: Path) -> Path:
    model = prune_heads(tiny_shapes_model(), {0: [0, 1, 2], 1: [0, 1, 2]})
    assert model.heads_per_layer() == [0, 0]
    return save_tiny(model, tmp_path / "headless.safetensors")


def test_pruning_a_model_without_heads_keeps_it_as_it_is(headless: Path, tmp_path: Path, load_tool) -> None:
    out = tmp_path / "prune"
    code = load_tool("prune_heads").main(["--checkpoint", str(headless), "--out", str(out), "--max-batches", "1",
                                          "--random-seeds", "1", "--rounds", "2", "--batch-size", "8"])
    summary = json.loads((out / "summary.json").read_text())
    assert code == 0 and summary["heads"] == [0, 0] and summary["fraction_pruned"] == 0.0


def test_attention_report_on_a_model_without_heads_is_one_error(headless: Path, tmp_path: Path, capsys,
                                                                    load_tool) -> None:
    code = load_tool("attention_report").main(["--checkpoint", str(headless), "--out", str(tmp_path / "r")])
    assert code == 2 and "no attention heads left" in _one_error_line(capsys.readouterr().err)


# --- data overrides that no longer fit the model -------------------------------------------


@pytest.mark.parametrize("override, words", [
    ("shapes_style=textured", None),
    ("img_size=16", "16x16 images"),
    ("in_chans=1", "1 channel"),
])
def test_data_overrides_that_do_not_fit_the_model_are_one_error(tmp_path: Path, capsys, load_tool,
                                                                    override: str, words: str | None) -> None:
    path = save_tiny(tiny_shapes_model(), tmp_path / "m.safetensors")
    out = tmp_path / "e"
    code = load_tool("evaluate").main([str(path), "--data", override, "--out", str(out)])
    if words is None:
        assert code == 0 and (out / "eval.json").is_file()  # a change that keeps the geometry is fine
    else:
        assert code == 2 and words in _one_error_line(capsys.readouterr().err)
        assert not out.exists()  # the folder is claimed only once there are results


# --- minor points --------------------------------------------------------------------------------


def test_a_key_given_twice_is_refused_in_overrides_and_yaml(tmp_path: Path) -> None:
    with pytest.raises(RecipeError, match="given twice"):
        load_recipe(short_recipe(tmp_path), ["trainer.max_epochs=2", "trainer.max_epochs=3"])
    recipe = tmp_path / "r.yaml"
    recipe.write_text("trainer:\n  max_epochs: 2\n  max_epochs: 3\n")
    with pytest.raises(RecipeError, match="twice"):
        load_recipe(recipe)


def test_a_nan_in_results_is_written_as_json_null(tmp_path: Path) -> None:
    write_json(tmp_path / "eval.json", {"loss": float("nan"), "curve": [1.0, float("inf")]})
    assert json.loads((tmp_path / "eval.json").read_text()) == {"loss": None, "curve": [1.0, None]}


def test_overrides_may_follow_resume(load_tool, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = {}
    tool = load_tool("train")
    monkeypatch.setattr(tool, "train", lambda recipe, overrides, resume: seen.update(o=overrides, r=resume) or 1 / 0)
    with pytest.raises(ZeroDivisionError):
        tool.main(["r.yaml", "--resume", "x.ckpt", "trainer.max_epochs=3"])
    assert seen == {"o": ["trainer.max_epochs=3"], "r": "x.ckpt"}


def test_orphan_model_file_temporaries_are_removed_at_resume(finished: RunResult, tmp_path: Path) -> None:
    run_dir = _copy_run(finished, tmp_path)
    orphan = run_dir / ".model.safetensors.k3j2.tmp"
    orphan.write_bytes(b"half a model")
    epochs = load_checkpoint(run_dir / "checkpoints" / "last.ckpt")["epoch"] + 1
    train(short_recipe(tmp_path / "runs", max_epochs=epochs), resume=run_dir / "checkpoints" / "last.ckpt")
    assert not orphan.exists() and (run_dir / MARKER).is_file()


# --- fourth sweep (issue 51) -------------------------------------------------------------------


def test_prune_heads_refuses_an_out_folder_holding_its_own_input_model(tmp_path: Path, capsys, load_tool) -> None:
    """A rerun into its own folder replaces its results, so the model it reads must not be one of them."""
    out = mark(tmp_path / "prune", "prune_heads")
    model = save_tiny(tiny_shapes_model(), out / "pruned.safetensors")
    before = snapshot(out)
    code = load_tool("prune_heads").main(["--checkpoint", str(model), "--out", str(out)])
    assert code == 2 and "holds this command's input" in _one_error_line(capsys.readouterr().err)
    assert snapshot(out) == before


@pytest.mark.parametrize("override", ["optim.clip_grad=null", "data.train_per_class=10", "data.mean=[0.5]",
                                      "data.std=[0.25]"])
def test_resuming_with_a_key_changed_to_or_from_null_is_refused(finished: RunResult, tmp_path: Path,
                                                                 override: str) -> None:
    run_dir = _copy_run(finished, tmp_path)
    before = snapshot(run_dir)
    epochs = load_checkpoint(run_dir / "checkpoints" / "last.ckpt")["epoch"] + 2
    key = override.split("=")[0]
    with pytest.raises(RecipeError, match=f"differs from the one .* started with: {key} ") as error:
        train(run_dir / "config.yaml", [override, f"trainer.max_epochs={epochs}"],
              resume=run_dir / "checkpoints" / "last.ckpt")
    assert "\n" not in str(error.value) and snapshot(run_dir) == before


@pytest.mark.parametrize("use", ["claim", "hold", "mark"])
def test_a_marker_that_is_a_symlink_is_refused_and_its_target_never_written(tmp_path: Path, use: str) -> None:
    elsewhere = tmp_path / "precious.txt"
    elsewhere.write_text("keep me\n")
    folder = tmp_path / "out"
    folder.mkdir()
    (folder / MARKER).symlink_to(elsewhere)
    with pytest.raises(OutputDirError, match="is not a regular file"):
        if use == "claim":
            claim_output_dir(folder, "faithfulness")
        elif use == "hold":
            with hold(folder):
                pass
        else:
            mark(folder, "train")
    release_output_dirs(complete=True)
    assert elsewhere.read_text() == "keep me\n" and (folder / MARKER).is_symlink()


def test_a_marker_that_is_a_folder_is_refused_in_one_line(tmp_path: Path, capsys, load_tool) -> None:
    folder = tmp_path / "out"
    (folder / MARKER).mkdir(parents=True)
    path = save_tiny(tiny_shapes_model(), tmp_path / "m.safetensors")
    assert load_tool("evaluate").main([str(path), "--out", str(folder)]) == 2
    assert "is not a regular file" in _one_error_line(capsys.readouterr().err)


def test_faithfulness_of_a_model_without_heads_is_one_line_before_out_is_claimed(headless: Path, tmp_path: Path,
                                                                                   capsys, load_tool) -> None:
    out = tmp_path / "f"
    code = load_tool("faithfulness").main(["--checkpoint", str(headless), "--out", str(out), "--images", "2"])
    assert code == 2 and "every head of every layer" in _one_error_line(capsys.readouterr().err)
    assert not out.exists()


@pytest.mark.parametrize("tool, base", [
    ("faithfulness", ["--checkpoint", "m.safetensors", "--out", "o"]),
    ("localization", ["--checkpoint", "m.safetensors"]),
])
@pytest.mark.parametrize("seed", ["1180591620717411303424", "-1"])
def test_a_seed_out_of_range_is_a_usage_error_before_anything_is_claimed(tool: str, base: list[str], seed: str,
                                                                         tmp_path: Path, capsys, load_tool,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exited:
        load_tool(tool).main([*base, "--seed", seed])
    assert exited.value.code == 2 and "--seed: must be in [0, 4294967295]" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_an_override_value_holding_a_hash_is_taken_whole_not_cut_as_a_comment(tmp_path: Path) -> None:
    assert load_recipe(short_recipe(tmp_path), ["model.pretrained=/a #b.safetensors"]).model.pretrained == "/a #b.safetensors"
    with pytest.raises(RecipeError, match="must be an integer, got '2 #x'"):
        load_recipe(short_recipe(tmp_path), ["trainer.max_epochs=2 #x"])
    from vitkit.prune import RecipeRecovery
    from vitkit.schema import parse_overrides

    recovery = RecipeRecovery(Path("r.yaml"), 1, 1e-3, 1e-5, tmp_path)
    values, _ = parse_overrides(recovery.overrides(Path("/x/a #1: [b]/p.safetensors"), Path("/x/a #1: [b]")))
    assert values["model"]["pretrained"] == "/x/a #1: [b]/p.safetensors" and values["output"]["dir"] == "/x/a #1: [b]"


def test_a_yaml_tag_and_an_unknown_lora_target_are_one_line_naming_what_is_allowed(tmp_path: Path) -> None:
    recipe = tmp_path / "evil.yaml"
    recipe.write_text("name: !!python/object:os.system\n  x\n")
    with pytest.raises(RecipeError, match="at line 1, column 7") as error:
        load_recipe(recipe)
    assert "\n" not in str(error.value)
    with pytest.raises(RecipeError, match="a list of values from 'qkv', 'proj', 'fc1', 'fc2'"):
        load_recipe(short_recipe(tmp_path), ["model.lora.targets=[qkv, head]"])


def test_lora_skips_a_pruned_block_without_heads() -> None:
    from vitkit.layers.lora import LoraConfig, add_lora

    model = prune_heads(tiny_shapes_model(), {0: [0, 1, 2]})
    adapted = add_lora(model, LoraConfig(rank=2))
    assert adapted == ["blocks.1.attn.qkv", "blocks.1.attn.proj"]
