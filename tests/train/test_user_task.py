"""A task registered in a user's own script trains through a recipe like a shipped one: its options
come from the recipe's ``task.<name>`` section, its monitor and summary metrics from its class, and
the run checkpoints it, resumes it and exports its encoder. The task is rotation prediction (Gidaris
et al. 2018, "Unsupervised Representation Learning by Predicting Image Rotations", arXiv 1803.07728),
the example of docs/tasks.md."""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from tiny_runs import ROOT, SHORT, shipped_tasks, tiny_recipe
from torch import nn

import vitkit
from vitkit.models import ViTConfig
from vitkit.schema import Config, RecipeError, bounds
from vitkit.tasks import StepOutput, Task, register_task, registry
from vitkit.train import load_recipe, train


# ----------------------------------------------------------------- the example of docs/tasks.md
@dataclass
class RotationOptions(Config):
    """The recipe's ``task.rotation`` section."""

    hidden_dim: int = field(default=64, metadata=bounds(ge=1, le=4096))


@register_task("rotation")
class RotationTask(Task):
    """Predict by how many quarter turns each image was rotated, from the encoder's pooled feature."""

    Options: ClassVar[type[Config]] = RotationOptions
    uses_labels: ClassVar[bool] = False  # the data's labels are never read
    releases_encoder: ClassVar[bool] = True  # model.safetensors holds the encoder, headless
    monitors: ClassVar[dict[str, str]] = {"val/loss": "min", "val/turn_acc1": "max"}
    monitor: ClassVar[str] = "val/turn_acc1"
    summary_metrics: ClassVar[dict[str, str]] = {"test_turn_acc": "test/turn_acc1"}
    progress_metric: ClassVar[str] = "turn_acc1"

    def __init__(self, model: ViTConfig, options: RotationOptions) -> None:
        super().__init__()
        self.head = nn.Sequential(nn.Linear(model.embed_dim, options.hidden_dim), nn.GELU(),
                                  nn.Linear(options.hidden_dim, 4))  # a child: trained and checkpointed

    def _turns(self, model: nn.Module, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The head's ``[B, 4]`` logits for the images turned by 0-3 quarter turns, and the turns ``[B]``."""
        turns = torch.arange(len(images), device=images.device) % 4
        turned = torch.stack([image.rot90(int(k), dims=(-2, -1)) for image, k in zip(images, turns)])
        return self.head(model.forward_head(model.forward_features(turned), pre_logits=True)), turns

    def training_step(self, model: nn.Module, batch: Any) -> StepOutput:
        logits, turns = self._turns(model, batch[0])
        return StepOutput(F.cross_entropy(logits, turns), len(turns))

    def evaluation_step(self, model: nn.Module, batch: Any, stage: str) -> StepOutput:
        logits, turns = self._turns(model, batch[0])
        accuracy = (logits.argmax(dim=1) == turns).float().mean() * 100
        return StepOutput(F.cross_entropy(logits, turns), len(turns), {"turn_acc1": accuracy})
# ---------------------------------------------------------------------------- end of the example


def rotation_recipe(out_dir: Path, **trainer: object) -> dict:
    recipe = tiny_recipe(out_dir, **{**SHORT, **trainer})
    recipe["task"] = {"name": "rotation", "rotation": {"hidden_dim": 24}}
    return recipe


def test_the_example_in_the_docs_is_the_task_this_file_trains() -> None:
    page = (ROOT / "docs" / "tasks.md").read_text()
    shown = re.search(r"```python\n(.*?)```", page, flags=re.S).group(1)
    source = inspect.getsource(inspect.getmodule(RotationTask))
    example = source.split("# ----------------------------------------------------------------- the example of docs/tasks.md\n")[1]
    example = example.split("# ---------------------------------------------------------------------------- end of the example")[0]
    assert shown.strip().endswith(example.strip())  # the page adds the imports


def test_a_task_registered_in_a_script_trains_resumes_and_exports_its_encoder(tmp_path: Path) -> None:
    first = train(rotation_recipe(tmp_path / "runs"))
    run_dir = first.run_dir
    checkpoint = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert checkpoint["state_dict"]["task.head.0.weight"].shape == (24, 32)  # task.rotation.hidden_dim reached the head
    assert checkpoint["hyper_parameters"]["recipe"]["task"] == {
        "name": "rotation", "rotation": {"hidden_dim": 24}, "knn_every": None, "linear_probe": False, "knn_root": None}
    best = next(c for key, c in checkpoint["callbacks"].items() if key.startswith("ModelCheckpoint"))
    assert best["monitor"] == "val/turn_acc1"  # the task's monitor, maximised
    steps = checkpoint["global_step"]
    assert steps == SHORT["limit_train_batches"]

    resumed = train(run_dir / "config.yaml", ["trainer.max_epochs=2"], resume=run_dir / "checkpoints" / "last.ckpt")
    assert resumed.run_dir == run_dir and resumed.summary["resumed_from"] is not None
    assert resumed.summary["global_steps"] == 2 * steps and resumed.summary["epochs"] == 2
    after = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)["state_dict"]
    assert not torch.equal(after["task.head.0.weight"], checkpoint["state_dict"]["task.head.0.weight"])  # it trained on

    summary = resumed.summary
    assert 0 <= summary["test_turn_acc"] <= 100 and "test_acc" not in summary  # the task's summary, not accuracy's
    assert summary["knn_acc1"] is not None and "model.pretrained=" in summary["finetune_command"]
    best_state = torch.load(summary["best_checkpoint"], map_location="cpu", weights_only=True)["state_dict"]
    encoder = vitkit.load_model(run_dir / "model.safetensors")
    assert encoder.config.num_classes == 0 and isinstance(encoder.head, nn.Identity)
    exported = load_file(run_dir / "model.safetensors")
    assert exported.keys() == {key.removeprefix("model.") for key in best_state if key.startswith("model.")}
    assert all(torch.equal(value, best_state[f"model.{key}"]) for key, value in exported.items())
    assert not any(key.startswith("head") for key in exported)  # the task's head stays the task's


def test_the_tasks_options_are_checked_by_its_own_dataclass(tmp_path: Path) -> None:
    recipe = rotation_recipe(tmp_path)
    with pytest.raises(RecipeError, match=r"task\.rotation\.hidden_dim in a command-line override is out of range"):
        load_recipe(recipe, ["task.rotation.hidden_dim=0"])
    with pytest.raises(RecipeError, match=r"unknown key 'task\.rotation\.hiden_dim'.*Did you mean 'task\.rotation\.hidden_dim'"):
        load_recipe(recipe, ["task.rotation.hiden_dim=3"])
    assert load_recipe(recipe, ["task.rotation.hidden_dim=7"]).task.options == RotationOptions(hidden_dim=7)


def test_a_task_without_labels_refuses_label_options_and_monitors_only_its_metrics(tmp_path: Path) -> None:
    recipe = rotation_recipe(tmp_path)
    with pytest.raises(RecipeError, match=r"is 'rotation', which pre-trains without labels.*optim\.mixup=0\.8"):
        load_recipe(recipe, ["optim.mixup=0.8"])
    with pytest.raises(RecipeError, match=r"trainer\.monitor=val/acc1 \(use val/loss or val/turn_acc1 or last\)"):
        load_recipe(recipe, ["trainer.monitor=val/acc1"])
    assert load_recipe(recipe).trainer.monitor == "val/turn_acc1"
    assert load_recipe(recipe, ["trainer.monitor=val/loss"]).trainer.monitor == "val/loss"


def test_an_unknown_task_name_is_refused_with_the_registered_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shipped = shipped_tasks()
    monkeypatch.setattr(registry, "_TASKS", {**shipped, "rotation": RotationTask})
    assert {"classify", "dino", "mae"} <= shipped.keys()  # a new shipped task joins the list below by its name
    known = ", ".join(sorted({*shipped, "rotation"}))
    recipe = rotation_recipe(tmp_path)
    with pytest.raises(RecipeError, match=r"task\.name in a command-line override is 'rotaton', which is no registered "
                                          rf"task \(known: {known}\)\. Did you mean 'rotation'\?"):
        load_recipe(recipe, ["task.name=rotaton"])
    with pytest.raises(ValueError, match="already registered to RotationTask"):
        register_task("rotation")(type("Other", (Task,), {}))
