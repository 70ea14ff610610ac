"""FlexMatch's class-wise flexible thresholds (``task.fixmatch.threshold_mode: flex``; Zhang et al.
2021, "FlexMatch: Boosting Semi-Supervised Learning with Curriculum Pseudo Labeling", arXiv 2110.08263).

FixMatch's fixed threshold ``tau`` masks out most unlabeled images while the model is unsure, and
those of the harder classes longest. FlexMatch scales the threshold per class by how far that class
is learnt, estimated from the unlabeled images themselves: each image keeps the class it was last
predicted with confidence ``>= tau`` (none until then). With ``sigma_c`` the images kept as class
``c`` and ``n_none`` those kept as none (the threshold warm-up), a class's learning effect and an
image's threshold, for its weak view's top class ``c``, are

    beta_c = sigma_c / max(max_k sigma_k, n_none),    threshold = tau * beta_c / (2 - beta_c)

(the paper's convex mapping ``M(x) = x / (2 - x)``). At the start every ``beta`` is 0 and every
pseudo-label counts; as the images get kept, the thresholds rise towards ``tau``. This is USB's
``FlexMatchThresholdingHook`` (microsoft/Semi-supervised-learning) with ``thresh_warmup: true``:
the thresholds of a batch are read before its confident images update the record, and the record
is unchanged while one value (none, at the start) holds every image.

The record is a Lightning callback's state, so a checkpoint carries it and a resumed run goes on
with it.
"""

from __future__ import annotations

from typing import Any

import torch
from lightning.pytorch.callbacks import Callback

from ..collective import all_reduce


class FlexThresholds(Callback):
    """The record of FlexMatch's class-wise thresholds (see the module docstring).

    Args:
        num_classes: the classes ``K``.

    Attributes:
        kept: ``long [N]`` per unlabeled image, the class last predicted with confidence ``>= tau``,
            or -1; empty until :meth:`bind` gives ``N``.
        learning_effect: ``float32 [K]`` each class's ``beta``.
    """

    def __init__(self, num_classes: int) -> None:
        self.kept = torch.empty(0, dtype=torch.long)
        self.learning_effect = torch.zeros(num_classes)

    def bind(self, num_unlabeled: int) -> None:
        """Size the record for ``num_unlabeled`` images: all -1, unless a restored record has that size."""
        if len(self.kept) != num_unlabeled:
            self.kept = torch.full((num_unlabeled,), -1, dtype=torch.long)
            self.learning_effect = torch.zeros_like(self.learning_effect)

    @torch.no_grad()
    def thresholds(self, probs: torch.Tensor, indices: torch.Tensor, tau: float) -> torch.Tensor:
        """The ``[U]`` thresholds of a batch's weak views, then its confident images update the record.

        Args:
            probs: ``[U, K]`` the weak views' class probabilities.
            indices: ``long [U]`` the images' places among the ``N`` unlabeled images.
            tau: the fixed threshold (``task.fixmatch.threshold``), the thresholds' ceiling.
        """
        if not len(self.kept):
            raise RuntimeError("FlexThresholds.bind was not called: the number of unlabeled images is unknown.")
        self.kept = self.kept.to(probs.device)
        self.learning_effect = self.learning_effect.to(probs.device)
        confidence, guess = probs.max(dim=-1)
        beta = self.learning_effect[guess]
        thresholds = tau * (beta / (2.0 - beta))
        # no host read (a GPU step would wait on it): the record and the effects change by torch.where
        # every process's confident images update the record (USB gathers them), so each keeps the same
        # record: the processes read different images (SemiSupervisedStream's shares), and the largest
        # of -1 (not confident or not read here) and the class each process wrote is the one written
        update = torch.full_like(self.kept, -1)
        update[indices.to(probs.device)] = torch.where(confidence.ge(tau), guess, -1)
        all_reduce(update, op="max")
        self.kept = torch.where(update.ge(0), update, self.kept)
        counts = torch.bincount(self.kept + 1, minlength=len(self.learning_effect) + 1)
        most = counts.max()
        effect = (counts[1:].double() / most).float()
        self.learning_effect = torch.where(most < len(self.kept), effect, self.learning_effect)
        return thresholds

    def state_dict(self) -> dict[str, Any]:
        return {"kept": self.kept.cpu(), "learning_effect": self.learning_effect.cpu()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore a checkpoint's record (a resumed run).

        Raises:
            ValueError: a record of another number of classes, or not a record.
        """
        kept, effect = state_dict.get("kept"), state_dict.get("learning_effect")
        if not (isinstance(kept, torch.Tensor) and isinstance(effect, torch.Tensor) and kept.ndim == 1
                and effect.shape == self.learning_effect.shape):
            raise ValueError(f"the checkpoint's FlexMatch record does not fit {len(self.learning_effect)} classes.")
        self.kept, self.learning_effect = kept.long(), effect.float()
