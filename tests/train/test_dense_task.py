"""Room for a dense task: a task on patch tokens reads targets of its own (its ``split_data`` turns
``(image, label)`` into ``(image, {"patch_class": [N]})``), ``best.ckpt`` and ``summary.json`` follow
the metric it names, and its head, a child of the task, is released beside the model. Not a vitkit
feature: the smallest patch-level task that exercises those seams."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import load_file
from tiny_runs import short_recipe
from torch import nn
from torch.utils.data import Dataset

import vitkit
from vitkit.data import build_datasets
from vitkit.models import ViTConfig
from vitkit.schema import Config
from vitkit.tasks import StepOutput, Task, register_task
from vitkit.train import load_recipe, train


def patch_classes(image: torch.Tensor, patch: int) -> torch.Tensor:
    """``[N]`` one class per ``patch`` x ``patch`` patch of ``image`` ``[C, H, W]``, row-major: 1 where
    the patch is brighter than the image on average, else 0."""
    means = F.avg_pool2d(image.mean(dim=0, keepdim=True), patch).flatten()
    return (means > image.mean()).long()


class PatchTargets(Dataset):
    """``dataset``'s images, each with its patch classes as the target (the label is dropped)."""

    def __init__(self, dataset: Dataset, patch: int) -> None:
        self.dataset, self.patch = dataset, patch

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        image, _ = self.dataset[index]
        return image, {"patch_class": patch_classes(image, self.patch)}


@register_task("patch_brightness")
class PatchBrightness(Task):
    """Classify every patch token as brighter or darker than its image, with a linear head of its own."""

    uses_labels: ClassVar[bool] = False
    monitors: ClassVar[dict[str, str]] = {"val/loss": "min", "val/patch_acc1": "max"}
    monitor: ClassVar[str] = "val/patch_acc1"
    summary_metrics: ClassVar[dict[str, str]] = {"test_patch_acc": "test/patch_acc1", "val_patch_acc": "val/patch_acc1"}

    def __init__(self, model: ViTConfig, options: Config) -> None:
        super().__init__()
        self.patch, self.prefix = model.patch_size[0], model.num_prefix_tokens
        self.head = nn.Linear(model.embed_dim, 2)

    def split_data(self, dataset: Dataset, split: str) -> Dataset:
        return PatchTargets(dataset, self.patch)

    def _logits(self, model: nn.Module, batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
        images, targets = batch
        return self.head(model.forward_features(images)[:, self.prefix:]).flatten(0, 1), targets["patch_class"].flatten()

    def training_step(self, model: nn.Module, batch: Any) -> StepOutput:
        logits, classes = self._logits(model, batch)
        return StepOutput(F.cross_entropy(logits, classes), len(batch[0]))

    def evaluation_step(self, model: nn.Module, batch: Any, stage: str) -> StepOutput:
        logits, classes = self._logits(model, batch)
        accuracy = (logits.argmax(dim=1) == classes).float().mean() * 100
        return StepOutput(F.cross_entropy(logits, classes), len(batch[0]), {"patch_acc1": accuracy})

    def released_parts(self) -> dict[str, nn.Module]:
        return {"patch_head": self.head}


def test_a_dense_task_reads_its_targets_monitors_its_metric_and_releases_its_head(tmp_path: Path) -> None:
    recipe = short_recipe(tmp_path, max_epochs=2, limit_test_batches=None)
    recipe["task"] = {"name": "patch_brightness"}
    result = train(recipe)
    run_dir, summary = result.run_dir, result.summary
    checkpoint = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    best = next(c for key, c in checkpoint["callbacks"].items() if key.startswith("ModelCheckpoint"))
    assert best["monitor"] == "val/patch_acc1" and summary["best_checkpoint"] == best["best_model_path"]
    assert "test_acc" not in summary and "val_acc" not in summary

    best_state = torch.load(summary["best_checkpoint"], map_location="cpu", weights_only=True)["state_dict"]
    head = load_file(run_dir / "patch_head.safetensors")
    assert head.keys() == {"weight", "bias"}
    assert all(torch.equal(head[key], best_state[f"task.head.{key}"]) for key in head)
    with safe_open(run_dir / "patch_head.safetensors", "pt") as released:
        assert released.metadata() == {"task": "patch_brightness"}
    assert not any(key.startswith("patch_head") for key in load_file(run_dir / "model.safetensors"))

    # The summary's accuracy, measured again by hand: the released model and head on every test
    # image's patches, their targets from the image (the labels play no part).
    model, probe = vitkit.load_model(run_dir / "model.safetensors").eval(), nn.Linear(32, 2)
    probe.load_state_dict(head)
    test = build_datasets(load_recipe(recipe).data).test
    images = torch.stack([test[index][0] for index in range(len(test))])
    classes = torch.stack([patch_classes(image, 2) for image in images]).flatten()
    with torch.no_grad():
        logits = probe(model.forward_features(images)[:, model.num_prefix_tokens:]).flatten(0, 1)
    assert summary["test_patch_acc"] == round((logits.argmax(dim=1) == classes).float().mean().item() * 100, 3)
    assert summary["test_images"] == [len(test), len(test)]
