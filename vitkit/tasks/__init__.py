"""Training objectives: what a training step minimises, what evaluation measures, and the parts
of its own that train with the model (:mod:`.base` has the contract). One module per objective,
each registered by the name a recipe gives (:mod:`.registry`); :class:`vitkit.train.ViTModule`
runs any of them."""

from .base import NoOptions, StepOutput, Task, TaskSetup
from .classify import ClassifyTask, DistillationLoss, build_criterion
from .dino import DinoHead, DinoTask
from .dino_options import DinoOptions
from .fixmatch import FixMatchOptions, FixMatchTask, fixmatch_loss
from .ijepa import IjepaOptions, IjepaTask
from .mae import MaeOptions, MaeTask
from .registry import UnknownTaskError, get_task, register_task, task_names

__all__ = [
    "ClassifyTask", "DinoHead", "DinoOptions", "DinoTask", "DistillationLoss", "FixMatchOptions", "FixMatchTask",
    "IjepaOptions", "IjepaTask", "MaeOptions", "MaeTask", "NoOptions", "StepOutput", "Task", "TaskSetup",
    "UnknownTaskError", "build_criterion", "fixmatch_loss", "get_task", "register_task", "task_names",
]
