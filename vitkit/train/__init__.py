"""Training: recipes (validated YAML), a Lightning module and data module, atomic ``weights_only``
checkpoints, run directories with metrics, curves and an exported model, and evaluation.

``train(recipe, overrides, resume)`` runs a recipe; ``evaluate(path)`` measures a trained model's
accuracy. ``vitkit.load_model(path)`` rebuilds a trained model from ``model.safetensors`` or a
``.ckpt`` without Lightning.
"""

from ..io import CheckpointError, UnsafeCheckpointError, load_checkpoint
from ..schema import RecipeError
from .checkpoint import AtomicCheckpointIO
from .config import ModelConfig, OptimConfig, OutputConfig, RecipeConfig, TrainerConfig, load_recipe
from .datamodule import ViTDataModule
from .eval_report import evaluate, write_evaluation
from .kernel_trial import KernelTrial, TrainingKernelChooser
from .module import NonFiniteLossError, ViTModule
from .run import RunInterruptedError, RunResult, RunStoppedError, train

__all__ = [
    "KernelTrial",
    "TrainingKernelChooser",
    "AtomicCheckpointIO",
    "CheckpointError",
    "ModelConfig",
    "NonFiniteLossError",
    "OptimConfig",
    "OutputConfig",
    "RecipeConfig",
    "RecipeError",
    "RunResult",
    "RunInterruptedError",
    "RunStoppedError",
    "TrainerConfig",
    "UnsafeCheckpointError",
    "ViTModule",
    "ViTDataModule",
    "evaluate",
    "load_checkpoint",
    "load_recipe",
    "train",
    "write_evaluation",
]
