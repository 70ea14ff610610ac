"""Training objectives: what a training step minimises, what evaluation measures, and the parts
of its own that train with the model (:mod:`.base` has the contract). One module per objective;
:class:`vitkit.train.ViTModule` runs any of them."""

from .base import StepOutput, Task
from .classify import ClassifyTask, DistillationLoss, build_criterion
from .dino import DinoHead, DinoTask
from .fixmatch import FixMatchOptions, FixMatchTask, fixmatch_loss
from .mae import MaeTask

__all__ = [
    "ClassifyTask", "DinoHead", "DinoTask", "DistillationLoss", "FixMatchOptions", "FixMatchTask", "MaeTask", "StepOutput",
    "Task", "build_criterion", "fixmatch_loss",
]
