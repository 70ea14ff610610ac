"""FixMatch semi-supervised classification (``task.name: fixmatch``; Sohn et al. 2020, "FixMatch:
Simplifying Semi-Supervised Learning with Consistency and Confidence", arXiv 2001.07685).

Each step reads ``B`` labelled images and ``mu * B`` unlabeled ones
(:class:`~vitkit.data.unlabeled.SemiSupervisedStream`). The labelled images, weakly augmented,
learn their labels by cross-entropy. Each unlabeled image's weak view is classified by the model
being trained (in training mode, without gradients); where the top class's probability reaches
``threshold``, that class becomes the pseudo-label of the image's strong view (RandAugment and
Cutout), learnt by cross-entropy; the other images contribute zero, and the unlabeled term is the
mean over all ``mu * B`` images:

    loss = CE(labelled) + lambda_u * mean_i( 1[max p_i >= threshold] * CE(strong_i, argmax p_i) ),
    p_i = softmax(model(weak_i)).

:func:`fixmatch_loss` is USB's ``FixMatch.train_step`` loss (microsoft/Semi-supervised-learning,
``FixedThresholdingHook`` and ``consistency_loss``): the same logits give the same loss. With
``temperature`` set, the pseudo-label is the soft ``softmax(weak / temperature)`` instead (the
paper's sharpening ablation; USB's ``hard_label: false`` is temperature 1), while the mask still
reads the untempered probabilities.

Deviations from the paper, by design: the weak unlabeled view runs apart from the labelled and
strong ones (USB's ``use_cat: false``; a ViT has no batch statistics to share), and the optimiser
is the recipe's (the paper's SGD with Nesterov momentum and its cosine to 7/16 of the rate are
replaced by the project's AdamW and warmup-cosine; ``optim.ema`` is the paper's weight EMA).
Evaluation is classification's (:class:`~vitkit.tasks.ClassifyTask`), on the EMA weights when on.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np
import torch
import torch.nn.functional as F
from timm.utils import accuracy
from torch import nn
from torch.utils.data import Dataset

from ..data import ArrayDataset, DataInfo
from ..data.unlabeled import FixMatchViews, SemiSupervisedStream, batchable_problem, unlabeled_images
from ..evaluation import TestTimeAugmentation, black_level
from ..schema import Config, FieldError, bounds
from .base import StepOutput, TaskSetup
from .classify import ClassifyTask
from .dist_align import DistributionAlignment
from .flexmatch import FlexThresholds
from .registry import register_task

if TYPE_CHECKING:
    from lightning.pytorch.callbacks import Callback

#: A training batch: labelled ``uint8 [B, H, W, C]``, labels ``[B]``, unlabeled ``uint8 [B, mu, H, W, C]``
#: and the unlabeled images' indices ``long [B, mu]``.
Batch = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


@dataclass
class FixMatchOptions(Config):
    """FixMatch's options (``task.fixmatch``); the defaults are the paper's.

    Attributes:
        threshold: the confidence a weak view's top class needs to become a pseudo-label (tau, 0.95).
        threshold_mode: ``fixed``: ``threshold`` for every image (FixMatch's); ``flex``: FlexMatch's
            class-wise thresholds, rising to ``threshold`` as each class is learnt
            (:mod:`vitkit.tasks.flexmatch`).
        dist_align: align the weak views' probabilities to a uniform class distribution before
            the threshold and the pseudo-label read them (ReMixMatch's distribution alignment,
            :mod:`vitkit.tasks.dist_align`); off in FixMatch.
        mu: unlabeled images per labelled one in a step (7): the unlabeled batch is ``mu`` times
            ``trainer.batch_size``.
        lambda_u: the weight of the unlabeled term (1).
        temperature: ``null``: hard pseudo-labels (the argmax, the paper's); a number: soft ones,
            ``softmax(weak logits / temperature)``.
        strong_ops: RandAugment operations per strong view (USB's 3).
        cutout: the strong view's Cutout square's largest side, as a fraction of the width (USB's 0.5).
        unlabeled_root: a folder of unlabeled images (every image under it, subfolders included),
            decoded once at the data's size and channels and held in memory; ``null``: the training
            images ``data.train_per_class`` leaves out.
    """

    threshold: float = field(default=0.95, metadata=bounds(ge=0, le=1))
    threshold_mode: Literal["fixed", "flex"] = "fixed"
    dist_align: bool = False
    mu: int = field(default=7, metadata=bounds(ge=1, le=1024))
    lambda_u: float = field(default=1.0, metadata=bounds(ge=0))
    temperature: float | None = field(default=None, metadata=bounds(gt=0))
    strong_ops: int = field(default=3, metadata=bounds(ge=0, le=16))
    cutout: float = field(default=0.5, metadata=bounds(ge=0, le=1))
    unlabeled_root: str | None = None

    def validate(self) -> None:
        if self.unlabeled_root == "":
            raise FieldError("unlabeled_root", "is empty; give the folder of unlabeled images, or null.")
        if self.dist_align and self.temperature is not None:
            raise FieldError("dist_align", "is true with a temperature: soft pseudo-labels would not read the aligned "
                             "probabilities; set temperature to null (hard pseudo-labels) or dist_align to false.")


@dataclass
class FixMatchLoss:
    """:func:`fixmatch_loss`'s terms (scalars but ``mask``).

    Attributes:
        total: ``supervised + lambda_u * unsupervised``.
        supervised: the labelled images' mean cross-entropy.
        unsupervised: the masked pseudo-label cross-entropy, averaged over every unlabeled image.
        mask: ``[U]`` 1 where the weak view's confidence reached the threshold, else 0.
    """

    total: torch.Tensor
    supervised: torch.Tensor
    unsupervised: torch.Tensor
    mask: torch.Tensor


def fixmatch_loss(
    labelled_logits: torch.Tensor,
    labels: torch.Tensor,
    weak_logits: torch.Tensor,
    strong_logits: torch.Tensor,
    *,
    threshold: float | torch.Tensor = 0.95,
    lambda_u: float = 1.0,
    temperature: float | None = None,
    weak_probs: torch.Tensor | None = None,
) -> FixMatchLoss:
    """FixMatch's loss (see the module docstring), in float32.

    Args:
        labelled_logits: ``[B, K]`` the weakly augmented labelled images' logits.
        labels: ``[B]`` their classes.
        weak_logits: ``[U, K]`` the unlabeled images' weak views' logits (no gradient flows through them).
        strong_logits: ``[U, K]`` the same images' strong views' logits.
        threshold: the confidence a pseudo-label needs: one for all, or ``[U]`` one per image.
        lambda_u: the unlabeled term's weight.
        temperature: ``None``: hard pseudo-labels; else soft ones at this temperature.
        weak_probs: ``[U, K]`` the class probabilities the mask and the hard pseudo-labels read;
            ``None``: the softmax of ``weak_logits`` (distribution alignment passes its own).
    """
    supervised = F.cross_entropy(labelled_logits.float(), labels)
    weak = weak_logits.detach().float()
    confidence, guess = (weak.softmax(dim=-1) if weak_probs is None else weak_probs.detach().float()).max(dim=-1)
    mask = confidence.ge(threshold).float()
    targets = guess if temperature is None else (weak / temperature).softmax(dim=-1)
    unsupervised = (F.cross_entropy(strong_logits.float(), targets, reduction="none") * mask).mean()
    return FixMatchLoss(supervised + lambda_u * unsupervised, supervised, unsupervised, mask)


@register_task("fixmatch")
class FixMatchTask(ClassifyTask):
    """FixMatch on :class:`~vitkit.data.unlabeled.SemiSupervisedStream` batches (see the module
    docstring); evaluation, monitored metrics and ``summary.json`` as classification's.

    Args:
        views: the weak and strong views (:class:`~vitkit.data.unlabeled.FixMatchViews`), made on
            the training device in the step.
        unlabeled: returns the ``uint8 [N, H, W, C]`` unlabeled images (called once, when the
            training split is first read: a run that never trains never reads them).
        options: threshold, ``mu``, ``lambda_u`` and pseudo-label temperature
            (:class:`FixMatchOptions`; its strong-view options are the ``views``').
        flex: FlexMatch's record of the unlabeled images (``threshold_mode: flex``), or ``None``.
        align: the distribution alignment (``dist_align: true``), or ``None``.
        seed: the seed of the passes over the unlabeled images (the run's ``trainer.seed``).
        tta, val_tta, fill: classification's test-time augmentation.
    """

    Options: ClassVar[type[Config]] = FixMatchOptions

    def __init__(
        self, views: FixMatchViews, unlabeled: Callable[[], np.ndarray], options: FixMatchOptions, *,
        flex: FlexThresholds | None = None, align: DistributionAlignment | None = None, seed: int = 0,
        tta: TestTimeAugmentation = "none",
        val_tta: TestTimeAugmentation | None = None, fill: torch.Tensor | None = None,
    ) -> None:
        super().__init__(None, nn.CrossEntropyLoss(), tta=tta, val_tta=val_tta, fill=fill)
        self.views = views
        self.options = options
        self.flex = flex
        self.align = align
        self.seed = seed
        self._read_unlabeled = unlabeled
        self._unlabeled: np.ndarray | None = None

    @classmethod
    def check_recipe(cls, options: Config, recipe: Any) -> None:
        """Unlabeled images to read, a labelled split in memory, views the device can make, and no
        classification option FixMatch's loss would ignore.

        Raises:
            FieldError: keyed by the recipe key to change.
        """
        data = recipe.data.resolved()
        if options.unlabeled_root is None and data.train_per_class is None:
            raise FieldError("task.name", "is 'fixmatch', which reads unlabeled images beside the labelled ones, but every "
                             "training image is labelled: set data.train_per_class (the training images it leaves out "
                             "are the unlabeled ones) or task.fixmatch.unlabeled_root (a folder of images).")
        if data.name == "imagefolder" and not data.in_memory:
            raise FieldError("data.in_memory", "is false, but FixMatch draws its views of the labelled images on the "
                             "device from memory: set data.in_memory=true.")
        problem = batchable_problem(data.augment)
        if problem is not None:
            raise FieldError("task.name", f"is 'fixmatch', whose weak and strong views run on whole batches, but {problem}.")
        optim = recipe.optim
        found = [f"optim.{key}={getattr(optim, key):g}" for key in ("mixup", "cutmix", "label_smoothing")
                 if getattr(optim, key) > 0]
        found += [f"distill.type={recipe.distill.type}"] if recipe.distill.type != "none" else []
        if found:
            raise FieldError("task.name", f"is 'fixmatch', whose loss is FixMatch's cross-entropies, but the recipe sets "
                             f"{', '.join(found)}: remove them.")

    @classmethod
    def step_images(cls, options: Config, batch_size: int) -> float:
        """A step trains ``batch_size`` labelled images and ``mu`` times as many strong views, and
        forwards as many weak views without a backward pass (each counted half)."""
        return batch_size * (1 + 1.5 * options.mu)

    @classmethod
    def from_recipe(cls, options: Config, setup: TaskSetup) -> FixMatchTask:
        """The views from the data section's augmentation and the run's data, the unlabeled images
        from ``options.unlabeled_root`` or the data section, and the test-time augmentation of the
        recipe's ``trainer``."""
        recipe, extra = setup.recipe, setup.extra
        info = DataInfo.from_extra(extra)
        views = FixMatchViews(recipe.data.resolved().augment, info, strong_ops=options.strong_ops, cutout=options.cutout)
        read = partial(unlabeled_images, recipe.data, info, options.unlabeled_root)
        flex = FlexThresholds(info.num_classes) if options.threshold_mode == "flex" else None
        align = DistributionAlignment(info.num_classes) if options.dist_align else None
        return cls(views, read, options, flex=flex, align=align, seed=recipe.trainer.seed, tta=recipe.trainer.tta,
                   val_tta=recipe.trainer.val_tta, fill=black_level(extra["mean"], extra["std"]))

    def callbacks(self) -> list[Callback]:
        """FlexMatch's record and the alignment's running mean, whose states a checkpoint carries
        (none with a fixed threshold and no alignment)."""
        return [part for part in (self.flex, self.align) if part is not None]

    def split_data(self, dataset: Dataset, split: Literal["train", "val", "test"]) -> Dataset:
        """The training split with the unlabeled images, ``mu`` to a labelled one; the others as built.

        Raises:
            TypeError: a labelled split not held in memory (an image folder without ``data.in_memory``).
        """
        if split != "train":
            return dataset
        if not isinstance(dataset, ArrayDataset):
            raise TypeError(f"FixMatch reads the labelled split from memory, not a {type(dataset).__name__}.")
        if self._unlabeled is None:
            self._unlabeled = self._read_unlabeled()
        if self.flex is not None:
            self.flex.bind(len(self._unlabeled))
        return SemiSupervisedStream(dataset, self._unlabeled, self.options.mu, seed=self.seed)

    def training_step(self, model: nn.Module, batch: Batch) -> StepOutput:
        labelled, labels, unlabeled, indices = batch
        unlabeled = unlabeled.flatten(0, 1)
        with torch.no_grad():
            weak_logits = model(self.views.weak(unlabeled))
        logits = model(torch.cat([self.views.weak(labelled), self.views.strong(unlabeled)]))
        labelled_logits, strong_logits = logits[: len(labels)], logits[len(labels):]
        options = self.options
        threshold: float | torch.Tensor = options.threshold
        probs = weak_logits.detach().float().softmax(dim=-1)
        if self.align is not None:
            probs = self.align.aligned(probs)
        if self.flex is not None:
            threshold = self.flex.thresholds(probs, indices.flatten(), threshold)
        loss = fixmatch_loss(labelled_logits, labels, weak_logits, strong_logits, threshold=threshold,
                             lambda_u=options.lambda_u, temperature=options.temperature, weak_probs=probs)
        metrics: dict[str, Any] = {
            "acc1": lambda: accuracy(labelled_logits.detach(), labels)[0],
            "loss_labelled": loss.supervised.detach(),
            "loss_unlabeled": loss.unsupervised.detach(),
            "mask_rate": loss.mask.mean(),
        }
        return StepOutput(loss.total, len(labels), metrics)
