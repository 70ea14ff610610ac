"""Layer-wise relevance propagation for vitkit's ViTs: AttnLRP (Achtibat et al., ICML 2024,
arXiv 2402.05602) as its authors' ``lxt`` package applies it to vision transformers.

LRP redistributes the explained logit backwards, layer by layer, so that the relevances of a
layer's inputs add up to its outputs' (conservation). As in ``lxt``'s efficient implementation
(Arras et al. 2025, arXiv 2502.15886), each rule is written as a modified gradient, so one
backward pass gives relevance = input x gradient at every layer. The rules, installed by
:func:`lrp_rules` as forward hooks (nothing in the model is replaced or monkey-patched):

* LayerNorm (every one, q/k norms included): the identity rule, the standard deviation held
  constant in the backward pass (``lxt.efficient.patches.layer_norm_forward``).
* The MLP activation (GELU, quick-GELU, tanh-GELU): the identity rule, relevance passed through
  unchanged (``lxt``'s ``identity_rule_implicit``).
* Attention: ``"attnlrp"`` (default) propagates through the softmax (its gradient is AttnLRP's
  softmax rule) and splits each product's relevance evenly between its factors (the uniform
  rule: queries and keys a quarter each of the score's gradient, values half). ``"cp"`` holds
  the attention weights constant (CP-LRP, Ali et al. 2022, arXiv 2202.07304): queries and keys
  get no relevance, the values carry it all; ``lxt``'s patch of torchvision's ViT uses it.
* The patch projection and every linear layer outside the attention projections (MLP, head,
  attention-pool MLP): the generalised gamma rule (Montavon et al. 2019; ``zennit.rules.Gamma``,
  which ``lxt`` pairs with its rules for ViTs) with ``patch_gamma`` and ``linear_gamma``; ``0``
  gives LRP-0. The attention projections pass plain gradients (LRP-0), as they do under ``lxt``
  in torchvision's ViT, whose attention calls its projections functionally.

Biases (and the position embedding, class and register tokens) absorb their share of the
relevance, so the image's relevance adds up to the logit minus theirs; a model without biases
conserves exactly under ``"cp"`` (tested).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn as nn
import torch.nn.functional as F
from timm.layers import AttentionPoolLatent
from timm.layers import Mlp as TimmMlp

from ..layers import Mlp
from ..layers.attention import AttentionBase
from ..models import VisionTransformer
from .faithfulness import pool_per_patch
from .targets import HeadlessModelError, Target, resolve_targets

AttentionRule = Literal["cp", "attnlrp"]
ATTENTION_RULES: tuple[str, ...] = ("cp", "attnlrp")


@dataclass(frozen=True)
class LRPRules:
    """The rules' parameters (see the module's docstring).

    Attributes:
        attention: ``"cp"`` (attention weights held constant) or ``"attnlrp"`` (softmax and uniform rules).
        linear_gamma: gamma of the linear layers outside the attention (0: LRP-0).
        patch_gamma: gamma of the patch projection.
        stabilizer: added, with the denominator's sign, to the gamma rule's denominators.

    The defaults (AttnLRP, LRP-0 elsewhere) were the most faithful of the presets of
    :data:`~vitkit.explain.lrp_choice.LRP_PRESETS` on 7 of 8 models that chose nothing
    (docs/results.md, "lrp's rules on held-out models"); the gammas 0.25 / 1.0 with CP-LRP, swept on
    two models, were the least faithful there. :func:`~vitkit.explain.choose_lrp_rules` picks per model.
    """

    attention: AttentionRule = "attnlrp"
    linear_gamma: float = 0.0
    patch_gamma: float = 0.0
    stabilizer: float = 1e-6

    def __post_init__(self) -> None:
        if self.attention not in ATTENTION_RULES:
            raise ValueError(f"attention must be one of {ATTENTION_RULES}, got {self.attention!r}.")
        if self.linear_gamma < 0 or self.patch_gamma < 0:
            raise ValueError(f"gammas must be >= 0, got linear {self.linear_gamma} and patch {self.patch_gamma}.")


def _stabilize(values: torch.Tensor, epsilon: float) -> torch.Tensor:
    """``values`` moved away from 0 by ``epsilon`` with their sign (0 counts as positive)."""
    return values + epsilon * (values >= 0).to(values.dtype).mul(2).sub(1)


def _gamma_relevance(
    layer: Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor],
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    output: torch.Tensor,
    relevance: torch.Tensor,
    gamma: float,
    epsilon: float,
) -> torch.Tensor:
    """The generalised gamma rule: the input relevance (shape of ``x``) of ``layer(x, weight,
    bias)`` whose output relevance is ``relevance``. Outputs > 0 are redistributed along the
    positive contributions (positive inputs through ``w + gamma w+``, negative ones through
    ``w + gamma w-``), outputs < 0 along the negative ones; the bias takes its share."""
    positive, negative = x.clamp(min=0), x.clamp(max=0)
    w_up, w_down = weight + gamma * weight.clamp(min=0), weight + gamma * weight.clamp(max=0)
    b_up = None if bias is None else bias + gamma * bias.clamp(min=0)
    b_down = None if bias is None else bias + gamma * bias.clamp(max=0)
    total = torch.zeros_like(x)
    # (inputs, weights, bias) pairs whose outputs add up to the positive / negative denominators
    for sign, terms in ((1, ((positive, w_up, b_up), (negative, w_down, None))),
                        (-1, ((positive, w_down, b_down), (negative, w_up, None)))):
        with torch.enable_grad():
            inputs = [part.detach().requires_grad_(True) for part, _, _ in terms]
            outputs = [layer(inp, w, b) for inp, (_, w, b) in zip(inputs, terms)]
            denominator = _stabilize(outputs[0] + outputs[1], epsilon).detach()
            selected = (output > 0) if sign > 0 else (output < 0)
            scaled = relevance * selected / denominator
            gradients = torch.autograd.grad(outputs, inputs, grad_outputs=[scaled, scaled])
        total = total + sum(inp.detach() * grad for inp, grad in zip(inputs, gradients))
    return total


class _GammaRule(torch.autograd.Function):
    """Forward: the layer's output as computed; backward: the gamma rule's relevance divided by the
    input, so that input x gradient is the relevance (``lxt``'s patch of zennit's hooks)."""

    @staticmethod
    def forward(ctx, x, output, module, gamma, epsilon):  # type: ignore[override]
        ctx.save_for_backward(x, output)
        ctx.module, ctx.gamma, ctx.epsilon = module, gamma, epsilon
        return output.clone()

    @staticmethod
    def backward(ctx, gradient):  # type: ignore[override]
        x, output = ctx.saved_tensors
        module = ctx.module
        relevance = gradient * output
        if isinstance(module, nn.Linear):
            layer = F.linear
        else:  # nn.Conv2d
            def layer(inp: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
                return module._conv_forward(inp, w, b)
        weight = module.weight.detach()
        bias = None if module.bias is None else module.bias.detach()
        relevance_in = _gamma_relevance(layer, x, weight, bias, output, relevance, ctx.gamma, ctx.epsilon)
        return relevance_in / _stabilize(x, 1e-10), None, None, None, None


class _IdentityRule(torch.autograd.Function):
    """An element-wise function ``output = f(x)`` whose relevance passes through unchanged:
    gradient ``g * f(x) / x`` (``lxt``'s ``identity_rule_implicit``, same epsilon)."""

    @staticmethod
    def forward(ctx, x, output):  # type: ignore[override]
        ctx.save_for_backward(output / (x + 1e-10))
        return output.clone()

    @staticmethod
    def backward(ctx, gradient):  # type: ignore[override]
        (ratio,) = ctx.saved_tensors
        return gradient * ratio, None


class _ScaleGradient(torch.autograd.Function):
    """Identity forward; the gradient divided by ``factor`` (the uniform rule's split)."""

    @staticmethod
    def forward(ctx, x, factor):  # type: ignore[override]
        ctx.factor = factor
        return x.clone()

    @staticmethod
    def backward(ctx, gradient):  # type: ignore[override]
        return gradient / ctx.factor, None


def _layer_norm_hook(module: nn.LayerNorm, inputs: tuple[torch.Tensor, ...], output: torch.Tensor) -> torch.Tensor:
    """LayerNorm with its standard deviation constant in the backward pass; the value is the output's."""
    x = inputs[0]
    mean = x.mean(dim=-1, keepdim=True)
    std = (x.var(dim=-1, unbiased=False, keepdim=True) + module.eps).sqrt()
    linear = (x - mean) / std.detach()
    if module.weight is not None:
        linear = linear * module.weight
    if module.bias is not None:
        linear = linear + module.bias
    return output.detach() + (linear - linear.detach())


def _identity_hook(module: nn.Module, inputs: tuple[torch.Tensor, ...], output: torch.Tensor) -> torch.Tensor:
    return _IdentityRule.apply(inputs[0], output)


def _gamma_hook(gamma: float, epsilon: float) -> Callable[..., torch.Tensor]:
    def hook(module: nn.Module, inputs: tuple[torch.Tensor, ...], output: torch.Tensor) -> torch.Tensor:
        return _GammaRule.apply(inputs[0], output, module, gamma, epsilon)
    return hook


def _attention_hook(rule: AttentionRule, parts: int) -> Callable[..., torch.Tensor]:
    """On a projection whose output is ``parts`` equal chunks ``[q, k, v]`` (or ``[k, v]``, or
    ``[q]``): ``cp`` detaches queries and keys; ``attnlrp`` scales their gradient by 1/4 and the
    values' by 1/2. With ``parts == 1`` the chunk is a query."""
    def hook(module: nn.Module, inputs: tuple[torch.Tensor, ...], output: torch.Tensor) -> torch.Tensor:
        chunks = output.chunk(parts, dim=-1)
        kinds = ("q", "k", "v")[3 - parts:] if parts > 1 else ("q",)
        ruled = []
        for kind, chunk in zip(kinds, chunks):
            if rule == "cp":
                ruled.append(chunk if kind == "v" else chunk.detach())
            else:
                ruled.append(_ScaleGradient.apply(chunk, 2.0 if kind == "v" else 4.0))
        return torch.cat(ruled, dim=-1)
    return hook


@contextmanager
def lrp_rules(model: VisionTransformer, rules: LRPRules | None = None) -> Iterator[None]:
    """Within the block, ``model``'s backward pass propagates relevance: for any input or
    activation ``a`` that requires grad, ``a * a.grad`` after ``logit.backward()`` is its LRP
    relevance (``rules``: :class:`LRPRules`' defaults when ``None``). The hooks are removed on
    exit. Modules outside vitkit's ``Mlp``, attention, LayerNorm and linear layers (a registered
    custom part's own operations) pass plain gradients.
    """
    rules = rules or LRPRules()
    handles = []
    attention_projections: set[nn.Module] = set()
    for module in model.modules():
        if isinstance(module, AttentionBase):
            attention_projections |= {module.qkv, module.proj}
            if isinstance(module.qkv, nn.Linear):
                handles.append(module.qkv.register_forward_hook(_attention_hook(rules.attention, 3)))
        elif isinstance(module, AttentionPoolLatent):
            attention_projections |= {module.q, module.kv, module.proj}
            handles.append(module.q.register_forward_hook(_attention_hook(rules.attention, 1)))
            handles.append(module.kv.register_forward_hook(_attention_hook(rules.attention, 2)))
    patch_projection = getattr(model.patch_embed, "proj", None)
    for module in model.modules():
        if isinstance(module, nn.LayerNorm):
            handles.append(module.register_forward_hook(_layer_norm_hook))
        elif isinstance(module, (Mlp, TimmMlp)):
            handles.append(module.act.register_forward_hook(_identity_hook))
        if module is patch_projection and isinstance(module, (nn.Linear, nn.Conv2d)):
            handles.append(module.register_forward_hook(_gamma_hook(rules.patch_gamma, rules.stabilizer)))
        elif isinstance(module, nn.Linear) and module not in attention_projections:
            handles.append(module.register_forward_hook(_gamma_hook(rules.linear_gamma, rules.stabilizer)))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def scaled_relevance(relevance: torch.Tensor) -> torch.Tensor:
    """Relevance maps ``[B, ...]`` scaled per image from their smallest (0) to their largest (1)
    value, the order kept, for display beside the other maps (which lie in ``[0, 1]``)."""
    flat = relevance.flatten(1)
    low, high = flat.amin(dim=-1, keepdim=True), flat.amax(dim=-1, keepdim=True)
    return ((flat - low) / (high - low).clamp_min(torch.finfo(flat.dtype).tiny)).view_as(relevance)


@dataclass(frozen=True)
class Relevance:
    """LRP relevance of images for their target classes.

    Attributes:
        pixels: ``[B, H, W]`` relevance per pixel (summed over channels), in the images' dtype.
        logits: ``[B, K]`` logits of the unperturbed images, in the model's dtype or float32 if
            that is wider.
        targets: ``[B]`` explained class per image.
    """

    pixels: torch.Tensor
    logits: torch.Tensor
    targets: torch.Tensor

    def per_patch(self, patch_size: tuple[int, int]) -> torch.Tensor:
        """``[B, gh, gw]``: the relevance summed over each patch."""
        return pool_per_patch(self.pixels, patch_size)


def lrp_relevance(
    model: VisionTransformer,
    images: torch.Tensor,
    target: Target = None,
    rules: LRPRules | None = None,
) -> Relevance:
    """AttnLRP relevance of ``images`` ``[B, C, H, W]`` for class ``target`` (``None``: each
    image's prediction; an int; or ``[B]`` indices), in one forward and one backward pass.

    The model is used as it is (call ``model.eval()``), in its own dtype; the pixels' relevance is
    summed in that dtype or float32 if that is wider, and returned in ``images``' dtype (a float64
    model's relevance is float64 throughout). Parameter gradients are neither computed nor
    touched. Raises :class:`~vitkit.explain.HeadlessModelError` for a model without classifier.
    """
    if model.config.num_classes == 0:
        raise HeadlessModelError("lrp explains a class's logit, and this model has no classifier (num_classes=0).")
    parameter = next(model.parameters())
    given, work = images.dtype, torch.promote_types(parameter.dtype, torch.float32)
    images = images.detach().to(device=parameter.device, dtype=parameter.dtype).requires_grad_(True)
    with torch.enable_grad(), lrp_rules(model, rules):
        logits = model(images)
        targets = resolve_targets(target, logits.detach())
        (gradient,) = torch.autograd.grad(logits.gather(1, targets[:, None]).sum(), images)
    pixels = (images.detach().to(work) * gradient.to(work)).sum(dim=1).to(given)
    return Relevance(pixels=pixels, logits=logits.detach().to(work), targets=targets)
