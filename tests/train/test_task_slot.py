"""The task slot: the LightningModule trains whatever objective a :class:`~vitkit.tasks.Task`
defines. A task's loss is what the optimiser minimises, its own parts train with the model and are
checkpointed under ``task.*`` (never exported with the model), its metrics are logged per stage,
and its step hook runs after every optimiser step."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import lightning as L
import torch
from tiny_runs import tiny_recipe
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from vitkit.models import VisionTransformer, ViTConfig
from vitkit.tasks import ClassifyTask, StepOutput, Task
from vitkit.train import load_recipe
from vitkit.train.module import ViTModule


class FeatureRegression(Task):
    """Regress a fixed target vector from the pooled features through a linear probe of its own."""

    name: ClassVar[str] = "test_regression"
    progress_metric: ClassVar[str] = "error"

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.probe = nn.Linear(dim, 3)
        self.steps: list[tuple[int, int]] = []
        self.__dict__["prepared"] = None  # not a child: the model is the module's

    def prepare(self, model: nn.Module) -> None:
        self.__dict__["prepared"] = model

    def _loss(self, model: nn.Module, images: torch.Tensor) -> torch.Tensor:
        pooled = model.forward_head(model.forward_features(images), pre_logits=True)
        return (self.probe(pooled) - torch.tensor([1.0, -2.0, 0.5])).pow(2).mean()

    def training_step(self, model: nn.Module, batch: Any) -> StepOutput:
        images, _ = batch
        return StepOutput(self._loss(model, images), len(images), {"scale": torch.tensor(2.0)})

    def evaluation_step(self, model: nn.Module, batch: Any, stage: str) -> StepOutput:
        images, _ = batch
        loss = self._loss(model, images)
        return StepOutput(loss, len(images), {"error": loss.sqrt()})

    def after_optimizer_step(self, model: nn.Module, step: int, total_steps: int) -> None:
        self.steps.append((step, total_steps))


def headless() -> VisionTransformer:
    torch.manual_seed(0)
    return VisionTransformer(ViTConfig(img_size=8, patch_size=2, in_chans=1, num_classes=0, embed_dim=16, depth=1,
                                       num_heads=2, mlp_ratio=2.0))


def test_the_default_task_is_classification_and_a_given_task_replaces_it() -> None:
    recipe = load_recipe(tiny_recipe(Path("unused")))
    model = headless()
    assert isinstance(ViTModule(model, recipe, model.config, {}).task, ClassifyTask)
    task = FeatureRegression(16)
    module = ViTModule(model, recipe, model.config, {}, task=task)
    assert module.task is task and task.prepared is model


def test_the_tasks_parts_train_with_the_model_and_are_checkpointed_not_exported() -> None:
    recipe = load_recipe(tiny_recipe(Path("unused")))
    model = headless()
    module = ViTModule(model, recipe, model.config, {}, task=FeatureRegression(16))
    optimised = {id(p) for group in module.build_optimizer().param_groups for p in group["params"]}
    assert all(id(p) in optimised for p in module.task.probe.parameters())
    assert all(id(p) in optimised for p in model.parameters())
    assert {"task.probe.weight", "task.probe.bias"} <= set(module.state_dict())
    assert not any(key.startswith("probe") for key in module.export_model().state_dict())


def test_a_fit_minimises_the_tasks_loss_logs_its_metrics_and_calls_its_step_hook(tmp_path: Path) -> None:
    recipe = load_recipe(tiny_recipe(tmp_path), ["optim.lr=0.02", "optim.warmup_epochs=0"])
    model = headless()
    task = FeatureRegression(16)
    module = ViTModule(model, recipe, model.config, {}, task=task)
    images = torch.randn(64, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    loader = DataLoader(TensorDataset(images, torch.zeros(64, dtype=torch.long)), batch_size=16)
    with torch.no_grad():
        before = task._loss(model, images).item()
    trainer = L.Trainer(max_epochs=3, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, train_dataloaders=loader, val_dataloaders=loader)
    with torch.no_grad():
        after = task._loss(model, images).item()
    assert after < 0.5 * before
    assert {"train/loss", "train/scale", "val/loss", "val/error"} <= set(trainer.logged_metrics)
    assert [step for step, _ in task.steps] == list(range(1, 13)) and {total for _, total in task.steps} == {12}
