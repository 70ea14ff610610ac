"""Distribution alignment of FixMatch's pseudo-labels (``task.fixmatch.dist_align``; Berthelot et al.
2019, "ReMixMatch", arXiv 1911.09785).

A model that favours some classes on the unlabeled images hands that bias back to itself through
its pseudo-labels, and with few labels it grows: a class the model under-predicts seldom reaches the
threshold, so it is seldom learnt. Alignment rescales each weak view's class probabilities ``p`` by
the ratio of a target class distribution to a running mean of the model's own predictions on the
unlabeled images, then renormalises each row:

    p_model <- m * p_model + (1 - m) * mean over the batch of p      (the first batch: its mean)
    p_aligned = normalise(p * (1/K + eps) / (p_model + eps)),          eps = 1e-6, m = 0.999

The target is uniform (``1/K``: ``data.train_per_class`` draws a balanced labelled split). The
threshold and the pseudo-label then read ``p_aligned``, and so do FlexMatch's thresholds when on.
This is USB's ``DistAlignEMAHook`` (microsoft/Semi-supervised-learning) with ``p_target_type:
uniform`` and its default momentum.

In a multi-device run the batch mean is taken over every process's weak views (USB gathers them),
so each process keeps the same running mean. The running mean is a Lightning callback's state, so a checkpoint carries it and a resumed run goes
on with it.
"""

from __future__ import annotations

from typing import Any

import torch
from lightning.pytorch.callbacks import Callback

from ..collective import all_reduce

#: USB's ``DistAlignEMAHook`` defaults: the running mean's momentum and the ratio's guard.
MOMENTUM, EPS = 0.999, 1e-6


class DistributionAlignment(Callback):
    """The running mean of the model's class probabilities on the unlabeled images, and the
    alignment it gives (see the module docstring).

    Args:
        num_classes: the classes ``K``.

    Attributes:
        p_model: ``float32 [K]`` the running mean, or ``None`` before the first batch.
    """

    def __init__(self, num_classes: int) -> None:
        self.num_classes = num_classes
        self.p_model: torch.Tensor | None = None

    @torch.no_grad()
    def aligned(self, probs: torch.Tensor) -> torch.Tensor:
        """Update the running mean with a batch's weak views, then align them.

        Args:
            probs: ``[U, K]`` the weak views' class probabilities.

        Returns:
            ``[U, K]`` the aligned probabilities, each row summing to 1.
        """
        totals = torch.cat([probs.float().sum(dim=0), probs.new_full((1,), len(probs), dtype=torch.float32)])
        all_reduce(totals)  # the mean over every process's batch, as USB gathers them first
        mean = totals[:-1] / totals[-1]
        self.p_model = mean if self.p_model is None else self.p_model.to(mean.device) * MOMENTUM + mean * (1 - MOMENTUM)
        scaled = probs.float() * ((1.0 / self.num_classes + EPS) / (self.p_model + EPS))
        return scaled / scaled.sum(dim=-1, keepdim=True)

    def state_dict(self) -> dict[str, Any]:
        return {"p_model": torch.empty(0) if self.p_model is None else self.p_model.cpu()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore a checkpoint's running mean (a resumed run).

        Raises:
            ValueError: a running mean of another number of classes, or not one.
        """
        p_model = state_dict.get("p_model")
        if not (isinstance(p_model, torch.Tensor) and p_model.shape in ((0,), (self.num_classes,))):
            raise ValueError(f"the checkpoint's distribution-alignment mean does not fit {self.num_classes} classes.")
        self.p_model = p_model.float() if len(p_model) else None
