"""Model-level attention maps: run a ViT, capture its attention (and gradients), build image maps.

``capture_attention`` runs ``model.forward_intermediates(images, return_attention=True)`` and the
head once and, when asked, one backward pass from the target logits to the attention tensors;
``maps_from_capture`` turns the capture into rollout, gradient-rollout, Chefer et al. relevance or
per-head maps on the image's pixel grid, so the kinds can share one forward pass. ``explain`` does both in one call. Every map
is read out as the model pools (class token or average of the patch tokens, see
:func:`~vitkit.explain.rollout.read_out`).

A model without a classifier (``num_classes=0``, a feature extractor such as timm's DINOv2) has
rollout and per-head maps, which read its attention as it pools, but no gradient maps: those
explain one class's logit, and a headless model has none (:class:`HeadlessModelError`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

import torch
import torch.nn.functional as F

from ..errors import VitkitError
from ..models import VisionTransformer
from .rollout import HeadFusion, Pooling, attention_rollout, chefer_relevance, grad_rollout, per_head_maps

Method = Literal["rollout", "grad_rollout", "chefer", "heads"]
METHODS: tuple[str, ...] = get_args(Method)
#: Methods that need the gradients of the target logit with respect to the attention.
GRADIENT_METHODS: tuple[str, ...] = ("grad_rollout", "chefer")
Target = int | torch.Tensor | None


class HeadlessModelError(VitkitError, ValueError):
    """A class to explain was asked of a model without a classifier (``num_classes=0``)."""


@dataclass
class AttentionCapture:
    """What one forward (and backward) pass of a ViT yields for explanation.

    Attributes:
        logits: ``[B, num_classes]`` float32 (``[B, 0]`` for a model without a classifier).
        targets: ``[B]`` class explained per image (given, or the predicted one); ``None`` for a
            model without a classifier.
        attentions: one ``[B, H_l, N, N]`` detached tensor per block, in forward order.
        gradients: ∂(target logit)/∂attention per block, same shapes, or ``None``.
        grid: patch grid ``(gh, gw)`` with ``gh * gw = N - num_prefix_tokens``.
        image_size: ``(H, W)`` of the input images.
        num_prefix_tokens: tokens before the patches.
        pooling: the read-out of the model's prediction: ``'distilled'`` for a distilled model
            (class and distillation rows averaged, as its two heads' logits are), else what
            ``global_pool`` implies: ``'token'``, or ``'avg'`` (the mean of the patch tokens'
            rows) for ``'avg'`` and ``'map'`` pooling.
    """

    logits: torch.Tensor
    targets: torch.Tensor | None
    attentions: list[torch.Tensor]
    gradients: list[torch.Tensor] | None
    grid: tuple[int, int]
    image_size: tuple[int, int]
    num_prefix_tokens: int
    pooling: Pooling = "token"

    @property
    def probabilities(self) -> torch.Tensor:
        """``[B]`` softmax probability of each image's target class."""
        if self.targets is None:
            raise HeadlessModelError("the model has no classifier (num_classes=0): its images have no class probability.")
        return self.logits.softmax(dim=-1).gather(1, self.targets[:, None]).squeeze(1)


def _resolve_targets(target: Target, logits: torch.Tensor) -> torch.Tensor:
    """``[B]`` class indices: the argmax when ``target`` is None, else ``target`` broadcast."""
    batch, num_classes = logits.shape
    if target is None:
        return logits.argmax(dim=-1)
    targets = torch.as_tensor(target, dtype=torch.long, device=logits.device).reshape(-1).expand(batch)
    if targets.min() < 0 or targets.max() >= num_classes:
        raise ValueError(f"target class {target} is out of range for a model with {num_classes} classes.")
    return targets.clone()


def capture_attention(
    model: VisionTransformer, images: torch.Tensor, target: Target = None, with_gradients: bool = False
) -> AttentionCapture:
    """Run ``model`` on ``images`` and keep its attention weights (and their gradients).

    The model is used as it is: call ``model.eval()`` first so dropout does not perturb the maps.
    Works for float32 and bfloat16 models and under ``torch.autocast``; images are cast to the
    model's parameter dtype and device. Parameter gradients are neither computed nor touched.

    Args:
        model: a vitkit ``VisionTransformer``.
        images: ``[B, C, H, W]`` normalised as for training.
        target: class to explain: ``None`` (each image's prediction), an int, or ``[B]`` indices.
        with_gradients: also compute ∂(target logit)/∂(attention of each block).

    Raises:
        HeadlessModelError: ``target`` or ``with_gradients`` for a model without a classifier.
    """
    headless = model.config.num_classes == 0
    if headless and (target is not None or with_gradients):
        raise HeadlessModelError(
            "the model has no classifier (num_classes=0), so there is no class to explain: the gradient methods "
            f"({', '.join(GRADIENT_METHODS)}) and a target class need one; rollout and heads read its attention."
        )
    parameter = next(model.parameters())
    images = images.to(device=parameter.device, dtype=parameter.dtype)
    grid = model.token_positions(images).grid
    with torch.set_grad_enabled(with_gradients):
        if with_gradients:  # a leaf that requires grad keeps the graph without weight gradients
            images = images.detach().requires_grad_(True)
        run = model.forward_intermediates(images, output_fmt="NLC", return_attention=True)
        attentions = run.attentions
        # A headless model's forward_head gives its pooled features, not logits.
        logits = run.features.new_zeros(len(images), 0) if headless else model.forward_head(run.features)
        targets = None if headless else _resolve_targets(target, logits.detach())
        gradients = None
        if with_gradients:
            selected = logits.gather(1, targets[:, None]).sum()
            # A block with every head pruned returns an empty tensor outside the graph: no gradient.
            in_graph = [a for a in attentions if a.requires_grad]
            grads = iter(torch.autograd.grad(selected, in_graph) if in_graph else ())
            gradients = [next(grads).detach() if a.requires_grad else torch.zeros_like(a) for a in attentions]
    return AttentionCapture(
        logits=logits.detach().float(),
        targets=targets,
        attentions=[a.detach() for a in attentions],
        gradients=gradients,
        grid=grid,
        image_size=(images.shape[2], images.shape[3]),
        num_prefix_tokens=model.num_prefix_tokens,
        pooling=model_read_out(model),
    )


def model_read_out(model: VisionTransformer) -> Pooling:
    """The read-out that explains ``model``'s prediction (see :attr:`AttentionCapture.pooling`)."""
    if model.config.distilled:
        return "distilled"
    # SigLIP's attention pool, like the mean, reads the patch tokens only: read out as 'avg'.
    return "token" if model.config.global_pool == "token" else "avg"


def to_image_grid(maps: torch.Tensor, grid: tuple[int, int], image_size: tuple[int, int]) -> torch.Tensor:
    """Patch-token maps ``[..., gh*gw]`` (row-major) to ``[..., H, W]`` by bilinear upsampling."""
    lead = maps.shape[:-1]
    patches = maps.reshape(-1, 1, *grid)
    upsampled = F.interpolate(patches, size=image_size, mode="bilinear", align_corners=False)
    return upsampled.reshape(*lead, *image_size)


def maps_from_capture(
    capture: AttentionCapture,
    method: Method = "rollout",
    *,
    layer: int = -1,
    head_fusion: HeadFusion = "mean",
    discard_ratio: float = 0.0,
    pooling: Pooling | None = None,
) -> torch.Tensor:
    """Maps at image resolution: ``[B, H, W]`` for ``rollout`` / ``grad_rollout`` / ``chefer``
    (each in ``[0, 1]``), ``[B, heads, H, W]`` raw attention of block ``layer`` for ``heads``.
    ``pooling`` names another read-out than the capture's (``'token'``: a distilled model's class
    token alone)."""
    prefix, pooling = capture.num_prefix_tokens, pooling or capture.pooling
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}.")
    if method in GRADIENT_METHODS and capture.gradients is None:
        raise ValueError(f"{method} needs gradients: capture with capture_attention(..., with_gradients=True).")
    if method == "rollout":
        maps = attention_rollout(capture.attentions, head_fusion, discard_ratio, prefix, pooling)
    elif method == "grad_rollout":
        maps = grad_rollout(capture.attentions, capture.gradients, discard_ratio, prefix, pooling)
    elif method == "chefer":
        maps = chefer_relevance(capture.attentions, capture.gradients, prefix, pooling)
    else:
        maps = per_head_maps(capture.attentions, layer, prefix, pooling)
    return to_image_grid(maps, capture.grid, capture.image_size)


def explain(
    model: VisionTransformer,
    images: torch.Tensor,
    method: Method = "rollout",
    target: Target = None,
    *,
    layer: int = -1,
    head_fusion: HeadFusion = "mean",
    discard_ratio: float = 0.0,
    pooling: Pooling | None = None,
) -> torch.Tensor:
    """Attention maps of ``images`` at image resolution (see :func:`maps_from_capture`).

    Args:
        model: a vitkit ``VisionTransformer`` in eval mode; without a classifier, ``rollout``
            and ``heads`` only.
        images: ``[B, C, H, W]``, any size the model accepts (non-square grids included).
        method: ``"rollout"``, ``"grad_rollout"`` or ``"chefer"`` (both for class ``target``) or ``"heads"``.
        target: the gradient methods' class: ``None`` = predicted, an int, or ``[B]`` indices.
        layer: block shown by ``heads``.
        head_fusion, discard_ratio: rollout options (see :func:`attention_rollout`).
        pooling: the read-out (``None``: the one that explains the prediction, :func:`model_read_out`).
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}.")
    capture = capture_attention(model, images, target, with_gradients=method in GRADIENT_METHODS)
    return maps_from_capture(
        capture, method, layer=layer, head_fusion=head_fusion, discard_ratio=discard_ratio, pooling=pooling
    )
