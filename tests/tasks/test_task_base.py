"""The task contract's defaults (``vitkit.tasks.base``), as its docstrings state them: a task that
overrides only its steps takes no options, refuses nothing and notes nothing, is built from the
model's config and its options, prices a step at its batch, reads each split as built, summarises
its ``summary_metrics`` as the run logged them, adds no callback, releases the model it trained and
no part of its own, and says so when a step it must write is missing."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from vitkit.models import ViTConfig
from vitkit.tasks import NoOptions, StepOutput, Task, TaskSetup


class Bare(Task):
    """A task that keeps what it is built with and overrides nothing else."""

    summary_metrics: ClassVar[dict[str, str]] = {"test_acc": "test/acc1", "val_loss": "val/loss"}

    def __init__(self, config: ViTConfig, options: Any) -> None:
        super().__init__()
        self.config, self.options = config, options


CONFIG = ViTConfig(img_size=8, patch_size=4, in_chans=1, num_classes=3, embed_dim=8, depth=1, num_heads=2)


def test_a_task_without_options_has_an_empty_section_and_refuses_nothing() -> None:
    assert Task.Options is NoOptions and dataclasses.fields(NoOptions()) == ()
    recipe = SimpleNamespace(optim=SimpleNamespace(ema=True, mixup=0.8), trainer=SimpleNamespace(strategy="fsdp"))
    assert Bare.check_model(NoOptions(), CONFIG) is None and Bare.check_recipe(NoOptions(), recipe) is None
    assert Bare.conflicts(NoOptions(), recipe) == [] and Bare.notes(NoOptions(), 300) == []


def test_the_default_task_is_built_from_the_models_config_and_its_options() -> None:
    options = NoOptions()
    task = Bare.from_recipe(options, TaskSetup(model=CONFIG, extra={"mean": (0.5,)}, recipe=None, epochs=4))
    assert isinstance(task, Bare) and task.config is CONFIG and task.options is options


@pytest.mark.parametrize("batch_size", [1, 48])
def test_a_step_is_priced_at_its_batch_of_images_trained_once(batch_size: int) -> None:
    work = Bare.step_images(NoOptions(), batch_size)
    assert work == batch_size and isinstance(work, float)


def test_the_hooks_leave_the_model_the_data_and_the_run_as_they_are() -> None:
    task, model = Bare(CONFIG, NoOptions()), nn.Linear(2, 2)
    before = {key: value.clone() for key, value in model.state_dict().items()}
    task.prepare(model)
    task.on_fit_start(torch.device("cpu"))
    task.after_optimizer_step(model, 3, 10)
    task.set_epochs(7)
    assert all(torch.equal(before[key], value) for key, value in model.state_dict().items())
    assert list(task.children()) == []  # the model never became the task's child
    data = TensorDataset(torch.zeros(2, 1))
    assert all(task.split_data(data, split) is data for split in ("train", "val", "test"))
    assert task.callbacks() == [] and task.released_parts() == {} and task.exported_model(model) is model


def test_the_summary_reads_each_summary_metric_by_its_logged_name() -> None:
    logged = {"test/acc1": 0.75, "val/loss": None}
    assert Bare(CONFIG, NoOptions()).summary(logged.get) == {"test_acc": 0.75, "val_loss": None}
    assert Task.summary_metrics == {} and Task().summary(logged.get) == {}


def test_a_step_the_task_does_not_write_is_refused() -> None:
    task, model = Bare(CONFIG, NoOptions()), nn.Identity()
    for call in (lambda: task.training_step(model, None), lambda: task.evaluation_step(model, None, "val"),
                 lambda: task.figure_rows(model, torch.zeros(1, 1, 8, 8))):
        with pytest.raises(NotImplementedError):
            call()


def test_each_step_output_has_its_own_metrics() -> None:
    first, second = StepOutput(torch.tensor(1.0), 4), StepOutput(torch.tensor(2.0), 4)
    first.metrics["acc1"] = torch.tensor(0.5)
    assert second.metrics == {} and first.batch_size == 4
