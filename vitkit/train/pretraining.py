"""What a pre-training run measures, draws and suggests besides its loss: the weighted k-NN
accuracy of the encoder's features (:func:`vitkit.tasks.knn.knn_accuracy`, DINO's ``eval_knn``),
for MAE its reconstructions of a few test images (the paper's Figure 2), and the command that
fine-tunes the encoder (:func:`finetune_command`).

Both are Lightning callbacks, added by :func:`pretraining_callbacks` for a recipe whose
``task.name`` pre-trains; a run passes them to the ``Trainer`` and reads
:func:`pretraining_summary` into ``summary.json``. Any task whose model is a
:class:`~vitkit.models.VisionTransformer` encoder can use :class:`KnnEvaluation` as it is.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from torch import nn

from ..data import DataInfo, display_image, unaugmented
from ..tasks.knn import knn_accuracy, linear_probe_accuracy, pooled_features
from ..tasks.mae import MaeTask
from .config import RecipeConfig
from .plots import plot_reconstructions

#: Test images in ``reconstructions.png``.
FIGURE_IMAGES = 8


class KnnEvaluation(Callback):
    """Weighted k-NN top-1 accuracy (percent) of the encoder's pooled features: the data's
    training split without augmentation is the labelled memory bank, its test split the queries.

    Logged as ``val/knn_acc1`` after every ``every``-th training epoch (``None``: never during
    training), and measured once after the run's test on the weights tested (the best checkpoint,
    its EMA when enabled): :attr:`result`, ``summary.json``'s ``knn_acc1`` (``None`` for data of one
    class, a flat folder of images). Every process measures
    the whole splits (no sampler), so all ranks agree.

    With ``linear_probe``, the end of the run also fits a linear classifier on the same features
    (:func:`~vitkit.tasks.knn.linear_probe_accuracy`): :attr:`probe_result`, ``linear_probe_acc1``.

    Args:
        every: epochs between measurements during training, or ``None``.
        k, temperature: :func:`~vitkit.tasks.knn.knn_accuracy`'s (DINO's 20 and 0.07).
        linear_probe: also measure the linear probe at the end.
    """

    def __init__(self, every: int | None = None, k: int = 20, temperature: float = 0.07, linear_probe: bool = False) -> None:
        self.every = every
        self.k = k
        self.temperature = temperature
        self.linear_probe = linear_probe
        self.result: float | None = None
        self.probe_result: float | None = None

    def features(self, trainer: L.Trainer, pl_module: L.LightningModule) -> tuple[torch.Tensor, ...]:
        """``(bank features, bank labels, test features, test labels)`` of ``pl_module``'s evaluated
        weights on ``trainer``'s datamodule (the training split unaugmented, the test split)."""
        data = trainer.datamodule
        bundle = data.bundle
        model = _evaluated(pl_module)
        was_training = model.training
        model.eval()
        try:
            bank = pooled_features(model, data.loader(unaugmented(bundle.train, bundle.test), data.batch_size * 2, False),
                                   pl_module.device)
            queries = pooled_features(model, data.loader(bundle.test, data.batch_size * 2, False), pl_module.device)
        finally:
            model.train(was_training)
        return (*bank, *queries)

    def measure(self, trainer: L.Trainer, pl_module: L.LightningModule) -> float:
        """The k-NN accuracy of ``pl_module``'s evaluated weights on ``trainer``'s datamodule."""
        return self._knn(self.features(trainer, pl_module), trainer.datamodule.info.num_classes)

    def _knn(self, features: tuple[torch.Tensor, ...], num_classes: int) -> float:
        return knn_accuracy(*features, num_classes=num_classes, k=self.k, temperature=self.temperature)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.every and (trainer.current_epoch + 1) % self.every == 0 and trainer.datamodule.info.num_classes > 1:
            pl_module.log("val/knn_acc1", self.measure(trainer, pl_module), batch_size=1)

    def on_test_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        num_classes = trainer.datamodule.info.num_classes
        if num_classes < 2:  # one class (a flat folder of images): nothing to measure
            return
        features = self.features(trainer, pl_module)
        self.result = round(self._knn(features, num_classes), 3)
        if self.linear_probe:
            self.probe_result = round(linear_probe_accuracy(*features, num_classes=num_classes), 3)


class ReconstructionFigure(Callback):
    """MAE's masked input, reconstruction and original of the first :data:`FIGURE_IMAGES` test
    images, drawn to ``path`` after the run's test (the tested weights, with fixed masks), by the
    global rank 0 process."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def on_test_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.is_global_zero:
            return
        bundle = trainer.datamodule.bundle
        count = min(FIGURE_IMAGES, len(bundle.test))
        images = torch.stack([bundle.test[index][0] for index in range(count)]).to(pl_module.device)
        model = _evaluated(pl_module)
        was_training = model.training
        model.eval()
        try:
            rows = pl_module.task.figure_rows(model, images)
        finally:
            model.train(was_training)
        plot_reconstructions({name: _shown(batch, bundle.info) for name, batch in rows.items()}, self.path)


def _shown(images: torch.Tensor, info: DataInfo) -> list[Any]:
    return [display_image(image.float().cpu(), info) for image in images]


def _evaluated(pl_module: L.LightningModule) -> nn.Module:
    """The weights a module evaluates: what its task releases (DINO's teacher) of its
    ``inference_model`` (the EMA when enabled), else its ``model``."""
    model = getattr(pl_module, "inference_model", None)
    model = model if model is not None else pl_module.model
    task = getattr(pl_module, "task", None)
    return task.exported_model(model) if task is not None else model


def pretraining_callbacks(config: RecipeConfig, run_dir: Path) -> list[Callback]:
    """The callbacks of a pre-training recipe (none for classification): k-NN evaluation, and
    MAE's ``reconstructions.png`` in ``run_dir``."""
    if not config.task.pretrains:
        return []
    callbacks: list[Callback] = [KnnEvaluation(config.task.knn_every, linear_probe=config.task.linear_probe)]
    if config.task.name == MaeTask.name:
        callbacks.append(ReconstructionFigure(run_dir / "reconstructions.png"))
    return callbacks


def pretraining_summary(callbacks: list[Callback]) -> dict[str, Any]:
    """``summary.json``'s entries from :func:`pretraining_callbacks`: ``knn_acc1`` and, when
    measured, ``linear_probe_acc1`` (percent)."""
    knn = next((callback for callback in callbacks if isinstance(callback, KnnEvaluation)), None)
    if knn is None:
        return {}
    return {"knn_acc1": knn.result, **({"linear_probe_acc1": knn.probe_result} if knn.linear_probe else {})}


#: The shipped classification recipe that fine-tunes an encoder pre-trained on each dataset.
FINETUNE_RECIPES = {"fashion_mnist": "fashion_mnist_fast", "imagefolder": "finetune_imagefolder"}


def finetune_command(config: RecipeConfig, model_file: Path) -> str:
    """``vitkit train RECIPE model.pretrained=MODEL ...``: a classification recipe of the same data
    (:data:`FINETUNE_RECIPES`, else ``RECIPE`` to fill in) starting from the exported encoder."""
    data = config.data
    recipe = FINETUNE_RECIPES.get(data.name, "RECIPE")
    words = ["vitkit train", recipe, f"model.pretrained={model_file}"]
    if data.name in FINETUNE_RECIPES:  # datasets read from files
        words.append(f"data.root={data.root}")
    if data.name == "fashion_mnist":
        words.append("data.train_per_class=10")  # the few labels pre-training is for
    if data.name == "imagefolder":  # the encoder's grid, not the recipe's ImageNet size
        words.append(f"data.img_size={config.data.resolved_img_size()[0]}")
    return " ".join(words)
