"""Model-level attention maps: run a ViT, capture its attention (and gradients), build image maps.

``capture_attention`` runs ``model.forward_intermediates(images, return_attention=True)`` and the
head once and, when asked, one backward pass from the target logits to the attention tensors and
the AttnLRP relevance (:mod:`.lrp`); ``patch_maps`` turns the capture into rollout, gradient-rollout,
Chefer et al. relevance, AttnLRP or per-head maps over the patches and ``maps_from_capture`` puts
them on the image's pixel grid, so the kinds can share one forward pass. ``explain`` does both in
one call. Every attention map is read out as the model pools (class token or average of the patch
tokens, see :func:`~vitkit.explain.rollout.read_out`). A model that merges tokens
(:func:`vitkit.merge_tokens`) has its attention, and the gradients, put back on the patches through
ToMe's source matrix (:func:`~vitkit.layers.token_merging.unmerge_attention`), so every map is on
the full patch grid.

A model without a classifier (``num_classes=0``, a feature extractor such as timm's DINOv2) has
rollout and per-head maps, which read its attention as it pools, but no gradient or LRP maps:
those explain one class's logit, and a headless model has none (:class:`HeadlessModelError`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..layers.token_merging import unmerge_attention, unmerge_gradient
from ..method_names import CLASS_METHODS, GRADIENT_METHODS, METHODS, Method
from ..models import VisionTransformer
from .lrp import LRPRules, lrp_relevance, scaled_relevance
from .rollout import HeadFusion, Pooling, attention_rollout, chefer_relevance, grad_rollout, per_head_maps
from .targets import HeadlessModelError, Target, resolve_targets


@dataclass
class AttentionCapture:
    """What one forward (and backward) pass of a ViT yields for explanation.

    Attributes:
        logits: ``[B, num_classes]`` float32 (``[B, 0]`` for a model without a classifier).
        targets: ``[B]`` class explained per image (given, or the predicted one); ``None`` for a
            model without a classifier.
        attentions: one ``[B, H_l, N, N]`` detached tensor per block, in forward order; a model
            that merges tokens has its attention over merged tokens put back on the ``N``
            tokens of the first block (:func:`~vitkit.layers.token_merging.unmerge_attention`).
        gradients: ∂(target logit)/∂attention per block, same shapes (merged tokens' put back by
            :func:`~vitkit.layers.token_merging.unmerge_gradient`), or ``None``.
        relevance: AttnLRP relevance of the targets summed per patch ``[B, gh, gw]``
            (:func:`~vitkit.explain.lrp.lrp_relevance`), or ``None``.
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
    relevance: torch.Tensor | None = None

    @property
    def probabilities(self) -> torch.Tensor:
        """``[B]`` softmax probability of each image's target class."""
        if self.targets is None:
            raise HeadlessModelError("the model has no classifier (num_classes=0): its images have no class probability.")
        return self.logits.softmax(dim=-1).gather(1, self.targets[:, None]).squeeze(1)


def capture_attention(
    model: VisionTransformer,
    images: torch.Tensor,
    target: Target = None,
    with_gradients: bool = False,
    with_relevance: bool = False,
    rules: LRPRules | None = None,
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
        with_relevance: also compute the targets' AttnLRP relevance with ``rules`` (a second
            forward and backward pass).

    Raises:
        HeadlessModelError: ``target``, ``with_gradients`` or ``with_relevance`` for a model without a classifier.
    """
    headless = model.config.num_classes == 0
    if headless and (target is not None or with_gradients or with_relevance):
        raise HeadlessModelError(
            "the model has no classifier (num_classes=0), so there is no class to explain: the methods that explain "
            f"one ({', '.join(CLASS_METHODS)}) and a target class need one; rollout and heads read its attention."
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
        targets = None if headless else resolve_targets(target, logits.detach())
        gradients = None
        if with_gradients:
            selected = logits.gather(1, targets[:, None]).sum()
            # A block with every head pruned returns an empty tensor outside the graph: no gradient.
            in_graph = [a for a in attentions if a.requires_grad]
            grads = iter(torch.autograd.grad(selected, in_graph) if in_graph else ())
            gradients = [next(grads).detach() if a.requires_grad else torch.zeros_like(a) for a in attentions]
    attentions = [a.detach() for a in attentions]
    if run.sources is not None:  # merged tokens back on the patches they hold
        attentions = [unmerge_attention(a, source) for a, source in zip(attentions, run.sources)]
        if gradients is not None:
            gradients = [unmerge_gradient(g, source) for g, source in zip(gradients, run.sources)]
    relevance = None
    if with_relevance:
        patch_size = tuple(images.shape[2 + axis] // grid[axis] for axis in range(2))
        relevance = lrp_relevance(model, images, targets, rules).per_patch(patch_size)
    return AttentionCapture(
        logits=logits.detach().float(),
        targets=targets,
        attentions=attentions,
        gradients=gradients,
        grid=grid,
        image_size=(images.shape[2], images.shape[3]),
        num_prefix_tokens=model.num_prefix_tokens,
        pooling=model_read_out(model),
        relevance=relevance,
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


def patch_maps(
    capture: AttentionCapture,
    method: Method = "rollout",
    *,
    layer: int = -1,
    head_fusion: HeadFusion = "mean",
    discard_ratio: float = 0.0,
    pooling: Pooling | None = None,
) -> torch.Tensor:
    """Maps over the patch tokens ``[B, gh*gw]`` (row-major): ``rollout`` / ``grad_rollout`` /
    ``chefer`` each in ``[0, 1]``, ``lrp`` the signed relevance summed per patch, and
    ``[B, heads, gh*gw]`` raw attention of block ``layer`` for ``heads``. ``pooling`` names another
    read-out than the capture's (``'token'``: a distilled model's class token alone)."""
    prefix, pooling = capture.num_prefix_tokens, pooling or capture.pooling
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}.")
    if method in GRADIENT_METHODS and capture.gradients is None:
        raise ValueError(f"{method} needs gradients: capture with capture_attention(..., with_gradients=True).")
    if method == "lrp" and capture.relevance is None:
        raise ValueError("lrp needs the relevance: capture with capture_attention(..., with_relevance=True).")
    if method == "rollout":
        return attention_rollout(capture.attentions, head_fusion, discard_ratio, prefix, pooling)
    if method == "grad_rollout":
        return grad_rollout(capture.attentions, capture.gradients, discard_ratio, prefix, pooling)
    if method == "chefer":
        return chefer_relevance(capture.attentions, capture.gradients, prefix, pooling)
    if method == "lrp":
        return capture.relevance.flatten(1)
    return per_head_maps(capture.attentions, layer, prefix, pooling)


def maps_from_capture(
    capture: AttentionCapture,
    method: Method = "rollout",
    *,
    layer: int = -1,
    head_fusion: HeadFusion = "mean",
    discard_ratio: float = 0.0,
    pooling: Pooling | None = None,
) -> torch.Tensor:
    """:func:`patch_maps` at image resolution (bilinear): ``[B, H, W]`` each in ``[0, 1]``
    (``lrp`` scaled from its smallest to its largest patch relevance per image), ``[B, heads, H, W]``
    for ``heads``."""
    maps = patch_maps(
        capture, method, layer=layer, head_fusion=head_fusion, discard_ratio=discard_ratio, pooling=pooling
    )
    return image_maps(capture, method, maps)


def image_maps(capture: AttentionCapture, method: Method, maps: torch.Tensor) -> torch.Tensor:
    """``method``'s :func:`patch_maps` of ``capture`` at image resolution, as :func:`maps_from_capture`
    gives them: for a caller that also uses the patch maps themselves and computes them once."""
    if method == "lrp":
        maps = scaled_relevance(maps)
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
        method: ``"rollout"``, ``"grad_rollout"``, ``"chefer"`` or ``"lrp"`` (the last three for
            class ``target``) or ``"heads"``.
        target: the gradient methods' class: ``None`` = predicted, an int, or ``[B]`` indices.
        layer: block shown by ``heads``.
        head_fusion, discard_ratio: rollout options (see :func:`attention_rollout`).
        pooling: the read-out (``None``: the one that explains the prediction, :func:`model_read_out`).
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}.")
    capture = capture_attention(
        model, images, target, with_gradients=method in GRADIENT_METHODS, with_relevance=method == "lrp"
    )
    return maps_from_capture(
        capture, method, layer=layer, head_fusion=head_fusion, discard_ratio=discard_ratio, pooling=pooling
    )
