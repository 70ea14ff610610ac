"""Choosing ``lrp``'s rules per model: named presets, and :func:`choose_lrp_rules`, which measures
each preset's deletion and insertion on a few images the model was not evaluated on (a validation
split) and keeps the most faithful.

No setting of LRP's rules is the most faithful on every model: a sweep on two models picks a
setting that fits those two (on 8 models that chose nothing, the setting swept on two others was
the least faithful of three presets; docs/results.md). Choosing per model on held-out
images of that model costs one ``lrp`` pass and one perturbation test per preset and image.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..models import VisionTransformer
from .faithfulness import Baseline
from .faithfulness_report import faithfulness
from .lrp import LRPRules
from .map_methods import map_method

#: The rule presets ``--lrp-rules`` names. ``attnlrp``: AttnLRP (softmax and uniform rules in the
#: attention, LRP-0 outside it; :class:`~vitkit.explain.lrp.LRPRules`' defaults); ``cp``: attention
#: weights held constant, LRP-0 elsewhere (``lxt``'s patch of torchvision's ViT with gammas 0);
#: ``cp-gamma``: attention weights held constant with gamma 0.25 on the linear layers and 1 on the
#: patch projection (the most faithful of 24 settings on the two models of docs/results.md, which chose it).
LRP_PRESETS: dict[str, LRPRules] = {
    "attnlrp": LRPRules(attention="attnlrp", linear_gamma=0.0, patch_gamma=0.0),
    "cp": LRPRules(attention="cp", linear_gamma=0.0, patch_gamma=0.0),
    "cp-gamma": LRPRules(attention="cp", linear_gamma=0.25, patch_gamma=1.0),
}
#: Perturbation steps of the choice: enough to rank presets, a fraction of a full test's cost.
CHOICE_STEPS = 16


@dataclass(frozen=True)
class LRPChoice:
    """The preset :func:`choose_lrp_rules` kept.

    Attributes:
        name: the preset's name (a key of the candidates).
        rules: its rules.
        scores: per preset, mean insertion minus mean deletion area on the choice's images (higher
            is more faithful), in the candidates' order.
        num_images: images the choice was made on.
    """

    name: str
    rules: LRPRules
    scores: dict[str, float]
    num_images: int

    def describe(self) -> str:
        """One line: the preset kept and every preset's score."""
        ranked = ", ".join(f"{name} {score:+.3f}" for name, score in self.scores.items())
        return (f"lrp rules: {self.name}, the most faithful preset on {self.num_images} validation images "
                f"(insertion minus deletion: {ranked})")


def choose_lrp_rules(
    model: VisionTransformer,
    images: torch.Tensor,
    *,
    candidates: dict[str, LRPRules] | None = None,
    baseline: Baseline = "mean",
    steps: int | None = CHOICE_STEPS,
    batch_size: int = 32,
) -> LRPChoice:
    """Measure each of ``candidates`` (default :data:`LRP_PRESETS`) as ``lrp``'s rules on
    ``images`` ``[N, C, H, W]`` (normalised; images the choice may fit, so not those a result is
    reported on) and keep the one with the highest insertion minus deletion area; ties go to the
    earlier candidate.

    Args:
        model: a vitkit ``VisionTransformer`` with a classifier, in eval mode.
        steps: perturbation steps over the patch grid (at most one patch per step; ``None``: one).

    Raises:
        ValueError: no candidates or no images.
    """
    candidates = LRP_PRESETS if candidates is None else candidates
    if not candidates:
        raise ValueError("candidates must name at least one LRPRules.")
    if len(images) == 0:
        raise ValueError("choosing lrp rules needs at least one image.")
    rows, columns = model.patch_embed.grid_size(*images.shape[2:])
    methods = [(name, map_method("lrp", rules=rules)) for name, rules in candidates.items()]
    report = faithfulness(model, images, None, methods, baseline=baseline,
                          steps=None if steps is None else min(steps, rows * columns), batch_size=batch_size, sanity=False)
    scores = {name: report.result(name).mean("insertion") - report.result(name).mean("deletion") for name in candidates}
    best = max(scores, key=lambda name: (scores[name], -list(candidates).index(name)))
    return LRPChoice(best, candidates[best], scores, report.num_images)
