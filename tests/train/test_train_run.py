"""End-to-end training runs on the bundled digits (tiny ViTs, a few steps each)."""

from __future__ import annotations

import csv
import importlib
import json
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch
import yaml
from tiny_runs import ROOT, SHORT, run_tool, tiny_recipe, tool_env, write_tiny_recipe
from torch.utils.data import DataLoader, DistributedSampler

import vitkit
from vitkit.data import DataConfig, build_datasets
from vitkit.io import load_model_and_extra, read_model_file
from vitkit.tasks import classify as classify_lib
from vitkit.train import (
    NonFiniteLossError,
    RunResult,
    UnsafeCheckpointError,
    load_checkpoint,
    load_recipe,
    train,
)
from vitkit.train.datamodule import ViTDataModule
from vitkit.train.kernel_trial import MIN_PAIRS, STEPS_TO_CHOOSE

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def fitted(tmp_path_factory: pytest.TempPathFactory) -> RunResult:
    out = tmp_path_factory.mktemp("runs")
    return train(tiny_recipe(out, max_epochs=3, checkpoint_every_n_steps=50))


def read_rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def test_fit_lowers_the_loss_and_beats_chance(fitted: RunResult) -> None:
    losses = [float(r["train/loss"]) for r in read_rows(fitted.run_dir / "metrics.csv") if r.get("train/loss")]
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 0.3
    assert fitted.summary["test_acc"] > 40.0 and fitted.summary["val_acc"] > 40.0  # chance: 10%


def test_run_directory_holds_every_artefact(fitted: RunResult) -> None:
    run = fitted.run_dir
    assert run.parent.name == "tiny"
    config = yaml.safe_load((run / "config.yaml").read_text())
    assert config["trainer"]["max_epochs"] == 3 and config["model"]["embed_dim"] == 32
    summary = json.loads((run / "summary.json").read_text())
    assert summary == fitted.summary
    (trained,) = summary["attention_kernels"]["training_steps"]["keys"]  # chosen on the run's own steps
    assert trained["pairs"] >= MIN_PAIRS and trained["final_kernel"] in ("sdpa", "explicit") and trained["rounds"][0]["spread"] >= 0
    assert isinstance(summary["attention_kernels"]["synthetic"], list)  # the process-wide autotuner's rows
    assert summary["epochs"] == 3 and summary["wall_time_s"] > 0 and summary["train_images_per_s"] > 0
    rows = read_rows(run / "metrics.csv")
    assert {"val/acc1", "val/loss", "train/loss", "lr/pg1", "lr/pg2"} <= set(rows[0])  # LearningRateMonitor
    lrs = [float(row["lr/pg1"]) for row in rows if row["lr/pg1"]]
    assert lrs[0] < max(lrs) <= 5e-3 and lrs[-1] < max(lrs)  # warmup to optim.lr, then cosine decay
    assert (run / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for name in ("best.ckpt", "last.ckpt"):
        checkpoint = load_checkpoint(run / "checkpoints" / name)  # weights_only=True
        assert "optimizer_states" in checkpoint and checkpoint["hyper_parameters"]["extra"]["dataset"] == "digits"
    assert not list((run / "checkpoints").glob("*.tmp"))


def test_exported_model_carries_metadata_and_matches_the_returned_model(fitted: RunResult) -> None:
    config, _, extra = read_model_file(fitted.run_dir / "model.safetensors")
    assert config.img_size == (8, 8) and config.in_chans == 1 and config.num_classes == 10
    assert extra["class_names"] == [str(d) for d in range(10)] and extra["recipe"] == "tiny"
    assert {"mean", "std", "img_size", "in_chans", "dataset"} <= set(extra)
    images = torch.randn(4, 1, 8, 8)
    for path in (fitted.run_dir / "model.safetensors", fitted.run_dir / "checkpoints" / "best.ckpt"):
        model, loaded_extra = load_model_and_extra(path)
        assert loaded_extra["dataset"] == "digits"
        model.eval()
        torch.testing.assert_close(model(images), fitted.model(images))


#: Run in a fresh interpreter: a meta-path finder that refuses Lightning, then ``vitkit.load_model``
#: on each path given in argv, printing the logits of a fixed input.
_NO_LIGHTNING = """
import sys

class Blocked:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("lightning", "pytorch_lightning"):
            raise ImportError(f"{name} is blocked in this test")
        return None

sys.meta_path.insert(0, Blocked())
import torch
import vitkit

torch.manual_seed(0)
images = torch.randn(4, 1, 8, 8)
for path in sys.argv[1:]:
    model = vitkit.load_model(path).eval()
    with torch.no_grad():
        print(model(images).flatten().tolist())
assert not any(name.split(".")[0] in ("lightning", "pytorch_lightning") for name in sys.modules)
"""


def test_load_model_reads_a_model_file_and_a_training_checkpoint_without_lightning(fitted: RunResult) -> None:
    paths = [fitted.run_dir / "model.safetensors", fitted.run_dir / "checkpoints" / "best.ckpt"]
    done = subprocess.run([sys.executable, "-c", _NO_LIGHTNING, *map(str, paths)], capture_output=True, text=True,
                          env=tool_env(), timeout=120)
    assert done.returncode == 0, done.stderr
    torch.manual_seed(0)
    images = torch.randn(4, 1, 8, 8)
    with torch.no_grad():
        expected = fitted.model.eval()(images).flatten()
    lines = done.stdout.splitlines()
    assert len(lines) == 2
    for line in lines:
        torch.testing.assert_close(torch.tensor(json.loads(line)), expected)


def test_evaluate_tool_reports_accuracy_and_confusion_matrix(fitted: RunResult, tmp_path: Path) -> None:
    done = run_tool("tools/evaluate.py", str(fitted.run_dir / "model.safetensors"), "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr
    report = json.loads((tmp_path / "eval.json").read_text())
    # Counted here: the exported model's top-1 and top-5 hits on the digits test split, by plain
    # argmax and topk over the whole split in one batch (the report rounds to 3 decimals).
    test = build_datasets(DataConfig.from_dict(tiny_recipe(tmp_path)["data"])).test
    images, labels = (torch.stack(items) if isinstance(items[0], torch.Tensor) else torch.tensor(items)
                      for items in zip(*(test[i] for i in range(len(test)))))
    with torch.no_grad():
        logits = vitkit.load_model(fitted.run_dir / "model.safetensors").eval()(images)
    top5 = logits.topk(5, dim=-1).indices
    assert report["num_images"] == len(labels)
    assert report["top1"] == pytest.approx(100.0 * (logits.argmax(-1) == labels).sum().item() / len(labels), abs=5e-4)
    assert report["top5"] == pytest.approx(100.0 * (top5 == labels[:, None]).any(-1).sum().item() / len(labels), abs=5e-4)
    assert report["top5"] >= report["top1"] and set(report["per_class"]) == {str(d) for d in range(10)}
    assert sum(map(sum, report["confusion_matrix"])) == report["num_images"]
    assert (tmp_path / "confusion_matrix.png").read_bytes()[:4] == b"\x89PNG"
    assert "top-1" in done.stdout
    assert report["precision"] == "fp32"


def test_evaluate_in_bf16_runs_the_forward_in_bfloat16(fitted: RunResult, monkeypatch: pytest.MonkeyPatch) -> None:
    """``precision="bf16"`` reaches the model's forward (its logits are bfloat16) and is recorded;
    the accuracy stays that of the float32 evaluation within the images whose top two logits are
    within bfloat16's rounding (a few percent of a briefly trained model's; CPUs round differently),
    far from a broken forward's chance level."""
    evaluate_lib = importlib.import_module("vitkit.train.eval_report")
    real, dtypes = evaluate_lib.evaluate_model, []

    def recording(model: torch.nn.Module, *args: object, **kwargs: object) -> object:
        model.head.register_forward_hook(lambda module, inputs, out: dtypes.append(out.dtype))
        return real(model, *args, **kwargs)

    monkeypatch.setattr(evaluate_lib, "evaluate_model", recording)
    model_file = fitted.run_dir / "model.safetensors"
    exact = evaluate_lib.evaluate(model_file, precision="fp32")
    rounded = evaluate_lib.evaluate(model_file, precision="bf16")
    assert set(dtypes) == {torch.float32, torch.bfloat16}
    assert rounded["precision"] == "bf16" and rounded["num_images"] == exact["num_images"]
    assert abs(rounded["top1"] - exact["top1"]) <= 5.0 < exact["top1"] - 100 / 10  # digits: 10 classes


def test_bf16_mixed_run_trains_without_third_party_warnings(tmp_path: Path) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = train(tiny_recipe(tmp_path, precision="bf16-mixed", **SHORT))
    unactionable = [str(w.message) for w in caught if "LeafSpec" in str(w.message) or "model summary" in str(w.message)]
    assert not unactionable
    assert result.summary["precision"] == "bf16-mixed" and result.summary["global_steps"] == 4
    assert all(torch.isfinite(p).all() and p.dtype == torch.float32 for p in result.model.parameters())


def test_grad_checkpointing_run_trains_with_ema_and_mixup(tmp_path: Path) -> None:
    recipe = tiny_recipe(tmp_path, **SHORT)
    recipe["model"]["grad_checkpointing"] = True
    recipe["optim"].update(mixup=0.8, cutmix=1.0, label_smoothing=0.1, ema=True, ema_decay=0.5)
    result = train(recipe)
    assert result.summary["global_steps"] == 4 and result.summary["test_acc"] is not None
    weights = load_checkpoint(result.run_dir / "checkpoints" / "last.ckpt")["state_dict"]
    assert any(key.startswith("ema.module.") for key in weights)
    assert not torch.equal(weights["ema.module.head.weight"], weights["model.head.weight"])


def test_non_finite_loss_stops_cleanly_and_keeps_last_good_checkpoint(tmp_path: Path, monkeypatch) -> None:
    real_build = classify_lib.build_criterion

    def poisoned(num_classes, **options):
        mixup, loss_fn = real_build(num_classes, **options)
        calls = iter(range(10**6))
        return mixup, lambda logits, targets: loss_fn(logits, targets) * (float("nan") if next(calls) == 5 else 1.0)

    monkeypatch.setattr(classify_lib, "build_criterion", poisoned)
    with pytest.raises(NonFiniteLossError, match=r"loss became nan at step 5 .*last 6 losses: \[.*, nan\].*last.ckpt"):
        train(tiny_recipe(tmp_path, checkpoint_every_n_steps=2, limit_train_batches=20))
    last = next(tmp_path.glob("tiny/*/checkpoints/last.ckpt"))
    checkpoint = load_checkpoint(last)
    assert checkpoint["global_step"] == 4
    assert all(torch.isfinite(value).all() for value in checkpoint["state_dict"].values())


def test_tampered_checkpoint_is_refused_on_resume(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return (Path.touch, (marker,))

    path = tmp_path / "last.ckpt"
    torch.save({"state_dict": {}, "hyper_parameters": {"vit_config": {}}, "payload": Payload()}, path)
    for attempt in (lambda: train(tiny_recipe(tmp_path, **SHORT), resume=path), lambda: vitkit.load_model(path)):
        with pytest.raises(UnsafeCheckpointError, match="refusing to load"):
            attempt()
    assert not marker.exists()


def test_train_tool_reports_a_bad_recipe_without_a_traceback(tmp_path: Path) -> None:
    done = run_tool("tools/train.py", "recipes/quickstart.yaml", "optim.weight_decy=0.1")
    assert done.returncode == 2
    assert "'optim.weight_decy'" in done.stderr and "'optim.weight_decay'" in done.stderr
    assert "Traceback" not in done.stderr


def test_sigkilled_run_resumes_from_its_step_checkpoint(tmp_path: Path) -> None:
    recipe = write_tiny_recipe(tmp_path, max_epochs=50, checkpoint_every_n_steps=3, limit_train_batches=10,
                               limit_val_batches=2, limit_test_batches=2, log_every=1)
    process = subprocess.Popen([sys.executable, "tools/train.py", str(recipe)], cwd=ROOT, env=tool_env(),
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 240
    last = None
    while time.monotonic() < deadline and process.poll() is None:
        found = list((tmp_path / "runs").glob("tiny/*/checkpoints/last.ckpt"))
        if found and load_checkpoint(found[0])["global_step"] >= 6:
            last = found[0]
            break
        time.sleep(0.5)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert last is not None, "no step checkpoint appeared before the deadline"
    saved = load_checkpoint(last)
    assert saved["global_step"] < 50 * 10  # killed mid-training
    resumed_epochs = saved["epoch"] + 2
    done = run_tool("tools/train.py", str(recipe), f"trainer.max_epochs={resumed_epochs}", "--resume", str(last))
    assert done.returncode == 0, done.stderr[-3000:]
    run_dir = last.parent.parent
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["epochs"] == resumed_epochs and summary["resumed_from"] == str(last)
    assert summary["global_steps"] == resumed_epochs * 10  # a partial epoch resumes where it stopped
    resumed_steps = [int(r["step"]) for r in read_rows(run_dir / "logs" / "version_1" / "metrics.csv")]
    assert min(resumed_steps) >= saved["global_step"] - 1  # continued, not restarted
    assert (run_dir / "model.safetensors").is_file()


def test_ddp_on_two_cpu_processes_with_a_weight_ema_and_one_attention_kernel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    steps = STEPS_TO_CHOOSE + 2  # the kernel is chosen, then two steps run it
    recipe = write_tiny_recipe(tmp_path, strategy="ddp", devices=2, **{**SHORT, "limit_train_batches": steps})
    # a child EMA copy made DDP refuse its parameters as unused; the copy now lives outside the module
    done = run_tool("tools/train.py", str(recipe), "optim.ema=true", "optim.ema_decay=0.5")
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("test accuracy") == 1  # rank 0 reports the run, rank 1 stays quiet
    summary = json.loads(next((tmp_path / "runs").glob("tiny/*/summary.json")).read_text())
    assert summary["world_size"] == 2 and summary["global_steps"] == steps
    # rank 0's timings chose the kernel for both ranks: each rank ran the same kernels, step for step
    kernels = summary["attention_kernels"]["training_steps"]
    (row,) = kernels["keys"]
    chosen, other = row["final_kernel"], ({"sdpa", "explicit"} - {row["final_kernel"]}).pop()
    assert row["pairs"] == MIN_PAIRS and row["steps"] == {chosen: MIN_PAIRS + 3, other: MIN_PAIRS + 1}
    assert kernels["ranks"] == [{"rank": rank, "steps": {row["key"]: row["steps"]}} for rank in (0, 1)]
    run_dirs = [p for p in (tmp_path / "runs" / "tiny").iterdir() if not p.is_symlink()]
    assert len(run_dirs) == 1  # both ranks shared one run directory
    assert (tmp_path / "runs" / "tiny" / "latest").resolve() == run_dirs[0].resolve()

    # the exported model is the EMA of the best (here: the last) step, kept under the checkpoint's ema.module.* keys
    exported, _ = load_model_and_extra(run_dirs[0] / "model.safetensors")
    saved = load_checkpoint(run_dirs[0] / "checkpoints" / "best.ckpt")
    assert saved["global_step"] == steps
    for name, tensor in exported.state_dict().items():
        assert torch.equal(tensor, saved["state_dict"]["ema.module." + name]), name
    assert not torch.equal(exported.head.weight, saved["state_dict"]["model.head.weight"])  # the average, not the weights

    # One process with the same global batch (2 x 32) in DDP's order (DistributedSampler's permutation
    # with one replica) reaches the same weights and loss: DDP averages the two halves' gradients.
    def ddp_order(self: ViTDataModule) -> DataLoader:
        sampler = DistributedSampler(self.bundle.train, num_replicas=1, rank=0, shuffle=True, seed=0)
        return DataLoader(self.bundle.train, batch_size=self.batch_size, sampler=sampler, drop_last=True)

    monkeypatch.setattr(ViTDataModule, "train_dataloader", ddp_order)
    single = tiny_recipe(tmp_path / "single", **{**SHORT, "limit_train_batches": steps, "batch_size": 64})
    single["optim"].update(ema=True, ema_decay=0.5)
    reference = train(single)
    expected = load_checkpoint(reference.run_dir / "checkpoints" / "best.ckpt")["state_dict"]
    # tolerance: both kernels are exact; what differs is the order of float32 sums (DDP's all-reduce
    # of two half-batch means against one mean) and AdamW's division by small second moments
    for name in ("model.head.weight", "model.blocks.1.mlp.fc2.weight", "ema.module.head.weight"):
        torch.testing.assert_close(saved["state_dict"][name], expected[name], rtol=0, atol=2e-4)
    images, labels = next(iter(DataLoader(ViTDataModule(load_recipe(single).data, 64).bundle.test, batch_size=4096)))
    with torch.no_grad():
        ddp_loss = torch.nn.functional.cross_entropy(exported(images), labels)
        single_loss = torch.nn.functional.cross_entropy(reference.model(images), labels)
    torch.testing.assert_close(ddp_loss, single_loss, rtol=1e-4, atol=0)
