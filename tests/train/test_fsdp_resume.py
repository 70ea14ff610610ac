"""A whole FSDP run on 2 CPU processes (gloo, torch's FSDP2 under Lightning): trained, saved sharded,
killed, resumed, finished; against the same run left uninterrupted. Torch 2.14's FSDP1 (Lightning's
``FSDPStrategy``) refuses to run without a GPU, FSDP2 does not, so this is the path GPUs take too.

Gloo's reductions on the CPU are deterministic and a sharded checkpoint holds every bit of the
weights and of AdamW's state, so the resumed run's loss curve and weights are compared exactly."""

from __future__ import annotations

import csv
import json
import os
import pickle
from pathlib import Path

import pytest
import torch
import yaml
from tiny_runs import run_tool, tiny_recipe

import vitkit
from vitkit.io import CheckpointError, UnsafeCheckpointError, load_checkpoint, read_model_file
from vitkit.train.checkpoint import check_resumable, read_sharded_metadata

HELPER = "tests/helpers/fsdp_run.py"
EPOCHS, STEPS_PER_EPOCH = 2, 4


def fsdp_recipe(folder: Path) -> Path:
    """The tiny recipe on 2 CPU processes under FSDP, one fixed attention kernel (a kernel chosen by
    timing could differ between the runs compared), ``last.ckpt`` written at each epoch's end."""
    recipe = tiny_recipe(folder / "runs", strategy="fsdp", devices=2, max_epochs=EPOCHS,
                         limit_train_batches=STEPS_PER_EPOCH, limit_val_batches=2, limit_test_batches=2, log_every=1,
                         checkpoint_every_n_steps=0)
    recipe["model"]["attn_impl"] = "sdpa"
    path = folder / "tiny.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def losses(run_dir: Path) -> dict[int, str]:
    """``step -> train/loss`` as the run's merged metrics.csv holds it (the text Lightning wrote)."""
    with open(run_dir / "metrics.csv", newline="") as handle:
        return {int(row["step"]): row["train/loss"] for row in csv.DictReader(handle) if row.get("train/loss")}


def only_run_dir(folder: Path) -> Path:
    (run_dir,) = [path for path in (folder / "runs" / "tiny").iterdir() if not path.is_symlink()]
    return run_dir


@pytest.mark.slow
def test_an_fsdp_run_killed_after_a_sharded_checkpoint_resumes_onto_the_uninterrupted_loss_curve(tmp_path: Path) -> None:
    whole, broken = tmp_path / "whole", tmp_path / "broken"
    for folder in (whole, broken):
        folder.mkdir()
    done = run_tool(HELPER, str(fsdp_recipe(whole)))
    assert done.returncode == 0, done.stderr[-3000:]

    killed = run_tool(HELPER, str(fsdp_recipe(broken)), "--die-after-epoch", "0")
    assert killed.returncode == 137, killed.stderr[-3000:]
    run_dir = only_run_dir(broken)
    last = run_dir / "checkpoints" / "last.ckpt"
    # a sharded checkpoint: a link to a directory of each rank's shards and the training metadata
    assert last.is_symlink() and last.is_dir()
    assert sorted(p.name for p in last.iterdir() if p.suffix == ".distcp") == ["__0_0.distcp", "__1_0.distcp"]
    metadata = load_checkpoint(last / "meta.pt")
    assert metadata["global_step"] == STEPS_PER_EPOCH and "state_dict" not in metadata
    assert not (run_dir / "model.safetensors").exists()
    # what a kill in the middle of a later save would leave: a staging directory, an unlinked version
    (run_dir / "checkpoints" / ".last.ckpt.0dead.tmp").mkdir()
    (run_dir / "checkpoints" / "last.ckpt.0dead").mkdir()

    resumed = run_tool(HELPER, str(fsdp_recipe(broken)), "--resume", str(last))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["resumed_from"] == str(last) and summary["world_size"] == 2
    assert summary["global_steps"] == EPOCHS * STEPS_PER_EPOCH and summary["epochs"] == EPOCHS
    assert sorted(p.name for p in (run_dir / "logs").iterdir()) == ["version_0", "version_1"]  # two attempts
    leftovers = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert [name for name in leftovers if "0dead" in name] == []
    assert len([name for name in leftovers if name.startswith("last.ckpt.")]) == 1  # the linked version only

    reference = losses(only_run_dir(whole))
    assert sorted(reference) == list(range(EPOCHS * STEPS_PER_EPOCH))
    assert losses(run_dir) == reference  # every step's loss, bit for bit
    # model.safetensors: the full weights gathered on rank 0 at the end, the uninterrupted run's
    _, exported, _ = read_model_file(run_dir / "model.safetensors")
    _, expected, _ = read_model_file(only_run_dir(whole) / "model.safetensors")
    assert exported.keys() == expected.keys()
    assert all(torch.equal(exported[name], expected[name]) for name in expected)


def test_a_checkpoint_saved_whole_or_sharded_resumes_only_under_the_strategy_that_saved_it(tmp_path: Path) -> None:
    whole = tmp_path / "last.ckpt"
    whole.write_bytes(b"")
    sharded = tmp_path / "sharded.ckpt"
    sharded.mkdir()
    torch.save({}, sharded / "meta.pt")
    for path, fsdp, saved in ((whole, True, "whole"), (sharded, False, "sharded")):
        with pytest.raises(CheckpointError, match=f"saved {saved} .*resume with the run's own trainer.strategy") as error:
            check_resumable(path, None, "digits", sharded=fsdp)  # refused before the module is looked at
        assert "\n" not in str(error.value)


class Payload:
    def __reduce__(self) -> tuple:
        return os.getcwd, ()  # harmless, but code all the same


def test_a_sharded_checkpoint_whose_metadata_would_run_code_is_refused_before_it_is_loaded(tmp_path: Path) -> None:
    # torch.distributed.checkpoint unpickles .metadata with no restriction; vitkit reads it first, restricted
    (tmp_path / ".metadata").write_bytes(pickle.dumps(Payload()))
    with pytest.raises(UnsafeCheckpointError, match="refusing to load"):
        read_sharded_metadata(tmp_path)


def test_other_tools_given_a_sharded_checkpoint_are_sent_to_model_safetensors(tmp_path: Path) -> None:
    sharded = tmp_path / "last.ckpt"
    sharded.mkdir()
    torch.save({}, sharded / "meta.pt")
    with pytest.raises(CheckpointError, match=r"is a directory: a sharded checkpoint .*model\.safetensors"):
        vitkit.load_model(sharded)

# --- S1: hostile metadata pickles of every protocol ---------------------------------------------------

#: Globals a hostile metadata pickle may name to run code: a module-level function, a dotted name
#: that protocol 4 resolves through a module attribute (``metadata`` imports ``os``), a submodule.
HOSTILE_GLOBALS = [
    ("os", "system"), ("posix", "system"), ("builtins", "eval"), ("builtins", "getattr"), ("subprocess", "call"),
    ("torch.distributed.checkpoint.metadata", "os.system"), ("torch.distributed.checkpoint.metadata", "os"),
    ("torch.distributed.checkpoint.filesystem", "os.system"), ("pathlib", "os.system"), ("collections", "os.system"),
    ("torch", "load"), ("torch", "serialization.os.system"), ("torch.serialization", "load"),
    ("torch.serialization", "os.system"), ("torch.distributed.checkpoint.metadata", "Metadata.__init__.__globals__"),
]


def _string(text: str, protocol: int) -> bytes:
    """``text`` pushed on the unpickler's stack: SHORT_BINUNICODE from protocol 4, a STRING before."""
    if protocol >= 4:
        return b"\x8c" + bytes([len(text)]) + text.encode()
    return b"S'" + text.encode() + b"'\n"


def hostile_pickles(command: str) -> list[tuple[str, bytes]]:
    """Pickles of protocols 0-5 that call each hostile global with ``command``, through every opcode
    that resolves a global: GLOBAL + REDUCE, STACK_GLOBAL + REDUCE (protocol 4+), INST (protocol 0)."""
    found = []
    for protocol in range(6):
        header = b"\x80" + bytes([protocol]) if protocol >= 2 else b""
        for module, name in HOSTILE_GLOBALS:
            args = b"(" + _string(command, protocol) + b"t"
            label = f"protocol {protocol} {module}.{name}"
            found.append((label + " GLOBAL", header + b"c" + f"{module}\n{name}\n".encode() + args + b"R."))
            if protocol >= 4:
                stack = _string(module, protocol) + _string(name, protocol) + b"\x93"
                found.append((label + " STACK_GLOBAL", header + stack + args + b"R."))
            if protocol == 0:
                found.append((label + " INST", b"(" + _string(command, 0) + b"i" + f"{module}\n{name}\n".encode() + b"."))
    return found


def test_no_metadata_pickle_of_any_protocol_reaches_code(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    pickles = hostile_pickles(f"touch {marker}")
    assert len(pickles) == len(HOSTILE_GLOBALS) * (6 + 2 + 1)  # GLOBAL in protocols 0-5, STACK_GLOBAL in 4-5, INST in 0
    # the generator's pickles do run code when unpickled without restriction (one, as a control)
    os_system = next(data for label, data in pickles if label == "protocol 4 os.system STACK_GLOBAL")
    pickle.loads(os_system)
    assert marker.exists()
    marker.unlink()
    for number, (label, data) in enumerate(pickles):
        folder = tmp_path / str(number)
        folder.mkdir()
        (folder / ".metadata").write_bytes(data)
        with pytest.raises((UnsafeCheckpointError, CheckpointError)) as error:
            read_sharded_metadata(folder)
        assert "\n" not in str(error.value), label
        assert not marker.exists(), f"{label} ran its command"


def test_the_metadata_reader_reads_a_real_sharded_checkpoint_and_refuses_a_path_outside_it(tmp_path: Path) -> None:
    import torch.distributed.checkpoint as dcp

    state = {"state_dict": {"w": torch.ones(3, 4), "b": torch.zeros(4, dtype=torch.bfloat16)},
             "optimizer_0": {"param_groups": [{"lr": 0.1, "params": [0]}]}}
    with pytest.warns(UserWarning, match="single process"):
        dcp.save(state, checkpoint_id=tmp_path)
    shapes = read_sharded_metadata(tmp_path)
    assert shapes["state_dict.w"] == torch.Size([3, 4]) and shapes["state_dict.b"] == torch.Size([4])
    assert shapes["optimizer_0.param_groups.0.lr"] is None  # a non-tensor entry, read weights_only
    # an entry pointing out of the checkpoint directory is refused before it is opened
    data = (tmp_path / ".metadata").read_bytes()
    relative = next(s.relative_path for s in pickle.loads(data).storage_data.values())
    (tmp_path / ".metadata").write_bytes(data.replace(relative.encode(), b"../" + relative.encode()[3:]))
    with pytest.raises(CheckpointError, match="outside the checkpoint"):
        read_sharded_metadata(tmp_path)
