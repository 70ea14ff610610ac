"""What a pre-training run measures, draws and suggests besides its loss: the weighted k-NN
accuracy of the encoder's features (:func:`vitkit.train.knn.knn_accuracy`, DINO's ``eval_knn``),
for MAE its reconstructions of a few test images (the paper's Figure 2), and the command that
fine-tunes the encoder (:func:`finetune_command`).

Both are Lightning callbacks, added by :func:`pretraining_callbacks` for a task that releases an
encoder or draws a figure; a run passes them to the ``Trainer`` and reads
:func:`pretraining_summary` into ``summary.json``. Any task whose model is a
:class:`~vitkit.models.VisionTransformer` encoder can use :class:`KnnEvaluation` as it is.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import lightning as L
import torch
import yaml
from lightning.pytorch.callbacks import Callback
from torch import nn
from torch.utils.data import Dataset

from ..data import DataInfo, display_image, unaugmented
from .config import RecipeConfig, load_recipe
from .knn import knn_accuracy, linear_probe_accuracy, pooled_features
from .plots import plot_reconstructions

#: Test images in ``reconstructions.png``.
FIGURE_IMAGES = 8


class KnnEvaluation(Callback):
    """Weighted k-NN top-1 accuracy (percent) of the encoder's pooled features: the data's
    training split without augmentation is the labelled memory bank, its test split the queries.

    With ``root``, a labelled image folder (``task.knn_root``) is the bank and queries instead, so
    that pre-training on a flat folder of unlabelled images gets a quality number too.

    Logged as ``val/knn_acc1`` after every ``every``-th training epoch (``None``: never during
    training), and measured once after the run's test on the weights tested (the best checkpoint,
    its EMA when enabled): :attr:`result`, ``summary.json``'s ``knn_acc1`` (``None`` for data of one
    class, a flat folder of images). Every process measures
    the whole splits (no sampler), so all ranks agree.

    With ``linear_probe``, the end of the run also fits a linear classifier on the same features
    (:func:`~vitkit.train.knn.linear_probe_accuracy`): :attr:`probe_result`, ``linear_probe_acc1``.

    Args:
        every: epochs between measurements during training, or ``None``.
        k, temperature: :func:`~vitkit.train.knn.knn_accuracy`'s (DINO's 20 and 0.07).
        linear_probe: also measure the linear probe at the end.
        root: a labelled folder to measure on (:func:`~vitkit.data.labelled_folder_halves`, read once by the datamodule), or ``None``.
    """

    def __init__(
        self, every: int | None = None, k: int = 20, temperature: float = 0.07, linear_probe: bool = False,
        root: str | None = None,
    ) -> None:
        self.every = every
        self.k = k
        self.temperature = temperature
        self.linear_probe = linear_probe
        self.root = root
        self.result: float | None = None
        self.probe_result: float | None = None

    def splits(self, trainer: L.Trainer) -> tuple[Dataset, Dataset, int]:
        """``(bank, queries, classes)``: the labelled folder ``root`` (through the run's evaluation
        transform, :meth:`~vitkit.train.datamodule.ViTDataModule.labelled_folder`), else the run's own training split
        unaugmented and its test split."""
        data = trainer.datamodule
        if self.root is not None:
            return data.labelled_folder(self.root)
        return unaugmented(data.bundle.train, data.bundle.test), data.bundle.test, data.info.num_classes

    def features(self, trainer: L.Trainer, pl_module: L.LightningModule) -> tuple[torch.Tensor, ...]:
        """``(bank features, bank labels, test features, test labels)`` of ``pl_module``'s evaluated
        weights on :meth:`splits`."""
        data = trainer.datamodule
        bank_split, query_split, _ = self.splits(trainer)
        model = _evaluated(pl_module)
        was_training = model.training
        model.eval()
        try:
            bank = pooled_features(model, data.loader(bank_split, data.batch_size * 2, False), pl_module.device)
            queries = pooled_features(model, data.loader(query_split, data.batch_size * 2, False), pl_module.device)
        finally:
            model.train(was_training)
        return (*bank, *queries)

    def classes(self, trainer: L.Trainer) -> int:
        """The number of classes the measurement tells apart (1: a flat folder, nothing to measure)."""
        return self.splits(trainer)[2] if self.root is not None else trainer.datamodule.info.num_classes

    def measure(self, trainer: L.Trainer, pl_module: L.LightningModule) -> float:
        """The k-NN accuracy of ``pl_module``'s evaluated weights on :meth:`splits`."""
        return self._knn(self.features(trainer, pl_module), self.classes(trainer))

    def _knn(self, features: tuple[torch.Tensor, ...], num_classes: int) -> float:
        return knn_accuracy(*features, num_classes=num_classes, k=self.k, temperature=self.temperature)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.every and (trainer.current_epoch + 1) % self.every == 0 and self.classes(trainer) > 1:
            pl_module.log("val/knn_acc1", self.measure(trainer, pl_module), batch_size=1)

    def on_test_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        num_classes = self.classes(trainer)
        if num_classes < 2:  # one class (a flat folder of images) and no labelled folder: nothing to measure
            return
        features = self.features(trainer, pl_module)
        self.result = round(self._knn(features, num_classes), 3)
        if self.linear_probe:
            self.probe_result = round(linear_probe_accuracy(*features, num_classes=num_classes), 3)


class ReconstructionFigure(Callback):
    """The rows of the task's :meth:`~vitkit.tasks.Task.figure_rows` (MAE's masked input,
    reconstruction and original) of the first :data:`FIGURE_IMAGES` test images, drawn to ``path``
    after the run's test (the tested weights), by the global rank 0 process."""

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
    """The callbacks the recipe's task asks for by its capabilities: k-NN evaluation of an encoder
    it releases (:attr:`~vitkit.tasks.Task.releases_encoder`), and its figure in ``run_dir``
    (:attr:`~vitkit.tasks.Task.figure`: MAE's ``reconstructions.png``)."""
    task, callbacks = config.task.task_class, []
    if task.releases_encoder:
        callbacks.append(KnnEvaluation(config.task.knn_every, linear_probe=config.task.linear_probe,
                                       root=config.task.knn_root))
    if task.figure is not None:
        callbacks.append(ReconstructionFigure(run_dir / task.figure))
    return callbacks


def pretraining_summary(callbacks: list[Callback]) -> dict[str, Any]:
    """``summary.json``'s entries from :func:`pretraining_callbacks`: ``knn_acc1`` and, when
    measured, ``linear_probe_acc1`` (percent), with ``knn_root`` where a labelled folder measured them."""
    knn = next((callback for callback in callbacks if isinstance(callback, KnnEvaluation)), None)
    if knn is None:
        return {}
    return {"knn_acc1": knn.result, **({"linear_probe_acc1": knn.probe_result} if knn.linear_probe else {}),
            **({"knn_root": knn.root} if knn.root is not None else {})}


#: The shipped classification recipe that fine-tunes an encoder pre-trained on each dataset.
FINETUNE_RECIPES = {"fashion_mnist": "fashion_mnist_fast", "imagefolder": "finetune_small"}
#: Encoders deeper than this fine-tune on an image folder with layer decay (``finetune_imagefolder``):
#: a few blocks have too few layers for a per-layer rate to help (docs/finetune.md).
SMALL_ENCODER_DEPTH = 8
#: Where the fine-tuning command of an encoder pre-trained on unlabelled images wants the labelled ones.
LABELLED_PLACEHOLDER = "LABELLED_FOLDER"


def finetune_command(config: RecipeConfig, model_file: Path, depth: int, *, fresh: bool = False) -> str:
    """``vitkit train RECIPE data.root=... model.pretrained=MODEL``: a classification recipe of the
    same data (:data:`FINETUNE_RECIPES`; an image folder's by the encoder's ``depth``, else
    ``RECIPE`` to fill in) starting from the exported encoder, whose file gives the image size,
    channels and normalisation. An image folder's labelled images are ``task.knn_root`` where the
    run had one, else :data:`LABELLED_PLACEHOLDER`: never the (unlabelled) pre-training folder.
    The encoder's value of each model key that recipe sets otherwise is added (``model.patch_embed=linear``).
    ``fresh``: the same model from fresh weights, the baseline that shows what pre-training bought."""
    data = config.data
    recipe = FINETUNE_RECIPES.get(data.name, "RECIPE")
    if data.name == "imagefolder" and depth > SMALL_ENCODER_DEPTH:
        recipe = "finetune_imagefolder"
    words = ["vitkit", "train", recipe]
    if data.name == "imagefolder":
        words.append(override_word("data.root", config.task.knn_root or LABELLED_PLACEHOLDER))
    elif data.name in FINETUNE_RECIPES:  # datasets read from files
        words.append(override_word("data.root", data.root))
    words.append(override_word("model.pretrained", str(model_file)))
    if recipe != "RECIPE":  # the fine-tuning recipe's architecture keys that differ from the encoder's
        theirs = load_recipe(recipe).model.vit_overrides()
        words += [override_word(f"model.{key}", value) for key, value in config.model.vit_overrides().items()
                  if theirs.get(key, value) != value]
    if data.name == "fashion_mnist":
        words.append("data.train_per_class=10")  # the few labels pre-training is for
    if fresh:
        words.append("model.pretrained_weights=false")
    return " ".join(words)


def override_word(key: str, value: Any) -> str:
    """``key=value`` as one shell word that ``vitkit train`` reads back as ``value``: a pair of equal
    sides as one number (``model.patch_size=4``), other tuples and lists as YAML's ``[4, 8]``, a
    string YAML would read as something else (``true``, ``1.5``) in quotes, the word quoted for the
    shell where it holds spaces or characters the shell would read (a path with a space, ``[``)."""
    if isinstance(value, (tuple, list)) and len(set(value)) == 1:
        value = value[0]
    if isinstance(value, str):
        text = value if yaml.safe_load(value) == value else json.dumps(value)
    else:
        text = json.dumps(list(value) if isinstance(value, tuple) else value)
    return shlex.quote(f"{key}={text}")
