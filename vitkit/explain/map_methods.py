"""Attribution methods as one kind of callable, for measuring them side by side: each takes a model,
images ``[B, C, H, W]`` and target classes ``[B]`` and returns one relevance per patch ``[B, gh, gw]``
(higher = more relevant). vitkit's methods are built in by name; any other (a peer library's
method pooled per patch) is a :data:`MapMethod` too.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..errors import VitkitError
from ..method_names import BUILTIN_METHODS
from ..models import VisionTransformer
from .faithfulness import pool_per_patch
from .gradients import integrated_gradients
from .lrp import LRPRules
from .maps import GRADIENT_METHODS, capture_attention, patch_maps
from .rollout import per_head_maps


class NoAttentionError(VitkitError, ValueError):
    """A method that reads attention, asked of a model whose every head was pruned."""


#: ``(model, images [B, C, H, W], targets [B]) -> [B, gh, gw]``.
MapMethod = Callable[[VisionTransformer, torch.Tensor, torch.Tensor], torch.Tensor]

def _capture_method(method: str, rules: LRPRules | None) -> MapMethod:
    def run(model: VisionTransformer, images: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        capture = capture_attention(
            model, images, None if method == "rollout" else targets,
            with_gradients=method in GRADIENT_METHODS, with_relevance=method == "lrp", rules=rules,
        )
        return patch_maps(capture, method).view(len(images), *capture.grid)
    return run


def _last_layer_attention(model: VisionTransformer, images: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    capture = capture_attention(model, images)
    attended = [index for index, heads in enumerate(model.heads_per_layer()) if heads > 0]
    if not attended:
        raise NoAttentionError("every head of every layer was pruned: the model has no attention to read.")
    heads = per_head_maps(capture.attentions, attended[-1], capture.num_prefix_tokens, capture.pooling)
    return heads.mean(dim=1).view(len(images), *capture.grid)


def _integrated_gradients(model: VisionTransformer, images: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    attribution = integrated_gradients(model, images, targets).sum(dim=1)
    return pool_per_patch(attribution, tuple(model.config.patch_size))


class RandomMap:
    """Uniform random relevance per patch from a seeded generator: the chance level of every test."""

    def __init__(self, seed: int = 0) -> None:
        self.generator = torch.Generator().manual_seed(seed)

    def __call__(self, model: VisionTransformer, images: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        grid = model.token_positions(images).grid
        return torch.rand(len(images), *grid, generator=self.generator)


def map_method(name: str, *, seed: int = 0, rules: LRPRules | None = None) -> MapMethod:
    """The built-in method ``name`` (:data:`vitkit.method_names.BUILTIN_METHODS`); ``seed`` seeds ``random``, ``rules``
    configures ``lrp``."""
    if name == "random":
        return RandomMap(seed)
    if name == "attention":
        return _last_layer_attention
    if name == "integrated_gradients":
        return _integrated_gradients
    if name in BUILTIN_METHODS:
        return _capture_method(name, rules)
    raise ValueError(f"method must be one of {BUILTIN_METHODS} or a (name, callable) pair, got {name!r}.")
