"""The format of vitkit's training checkpoints, apart from the module that writes them: where the
weight EMA's tensors go (:func:`save_ema` / :func:`load_ema`, the state-dict hooks of
:class:`~vitkit.train.ViTModule`), how the optimiser steps of Lightning's automatic and manual loops
are recorded (:func:`step_records`, :func:`completed_steps`, :func:`adopt_automatic_steps`), and
which tensors of a checkpoint are not finite (:func:`non_finite_tensors`). Read by the module and by
:mod:`vitkit.train.checkpoint` alike."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from ..io import EMA_PREFIX
from .lightning_compat import AUTOMATIC_STEPS, MANUAL_STEPS, fit_loop_state


def adopt_automatic_steps(checkpoint: dict[str, Any]) -> None:
    """Count, in a checkpoint whose optimiser steps Lightning's automatic loop took (vitkit's
    checkpoints before :meth:`ViTModule.training_step` took them itself), those steps as the
    manual loop's, where Lightning reads the global step of a module that steps itself: a resumed
    run goes on from the step it stopped at, not from 0. In place; other checkpoints unchanged."""
    automatic, manual = step_records(checkpoint)
    if (completed_steps(automatic) or 0) > (completed_steps(manual) or 0):
        fit_loop_state(checkpoint)[MANUAL_STEPS] = copy.deepcopy(automatic)


def step_records(checkpoint: dict[str, Any]) -> tuple[Any, Any]:
    """The automatic and the manual loop's step-progress records in ``checkpoint``'s fit-loop
    state (``None`` where absent; not checked, see :func:`completed_steps`)."""
    fit = fit_loop_state(checkpoint)
    if fit is None:
        return None, None
    automatic = fit.get(AUTOMATIC_STEPS)
    optimizer = automatic.get("optimizer") if isinstance(automatic, dict) else None
    return (optimizer.get("step") if isinstance(optimizer, dict) else None), fit.get(MANUAL_STEPS)


def completed_steps(progress: Any) -> int | None:
    """The steps a Lightning step-progress record counts (``{"total": {"ready": n, "completed": n},
    "current": {...}}``), or ``None`` if ``progress`` is not such a record."""
    parts = [progress.get(part) if isinstance(progress, dict) else None for part in ("total", "current")]
    counts = [part.get(key) if isinstance(part, dict) else None for part in parts for key in ("ready", "completed")]
    return counts[1] if all(isinstance(count, int) and count >= 0 for count in counts) else None


def save_ema(module: nn.Module, state_dict: dict[str, Any], prefix: str, local_metadata: dict[str, Any]) -> None:
    """State-dict post-hook: the EMA copy's tensors under :data:`~vitkit.io.EMA_PREFIX`
    (``ema.module.*``), where they were when the copy was a child of the module (checkpoints of
    either layout load into the other)."""
    module.ema.module.state_dict(destination=state_dict, prefix=f"{prefix}{EMA_PREFIX}")


def load_ema(
    module: nn.Module,
    state_dict: dict[str, Any],
    prefix: str,
    local_metadata: dict[str, Any],
    strict: bool,
    missing_keys: list[str],
    unexpected_keys: list[str],
    error_msgs: list[str],
) -> None:
    """Load-state-dict pre-hook: the :data:`~vitkit.io.EMA_PREFIX` entries taken out of ``state_dict``
    into the EMA copy; missing or unexpected ones are reported as the module's own would be."""
    head = f"{prefix}{EMA_PREFIX}"
    ema_state = {key[len(head):]: state_dict.pop(key) for key in [key for key in state_dict if key.startswith(head)]}
    result = module.ema.module.load_state_dict(ema_state, strict=False)
    missing_keys.extend(head + key for key in result.missing_keys)
    unexpected_keys.extend(head + key for key in result.unexpected_keys)


def non_finite_tensors(checkpoint: dict[str, Any]) -> list[str]:
    """Names (``state_dict/model.head.weight``, ``optimizer_states/0/state/3/exp_avg``) of the
    floating-point tensors with a NaN or infinite entry in a checkpoint's weights and optimiser state
    (of a sharded checkpoint: this rank's shards)."""
    sections = {key: checkpoint[key] for key in ("state_dict", "optimizer_states") if key in checkpoint}
    tensors = ((name, tensor.to_local() if isinstance(tensor, DTensor) else tensor) for name, tensor in _tensors(sections, ""))
    return [name for name, tensor in tensors if tensor.is_floating_point() and not tensor.isfinite().all()]


def _tensors(tree: Any, prefix: str) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor of a nested dict/list ``tree``, with its path (``state_dict/model.head.weight``)."""
    if isinstance(tree, torch.Tensor):
        yield prefix, tree
    elif isinstance(tree, dict):
        for key, value in tree.items():
            yield from _tensors(value, f"{prefix}/{key}" if prefix else str(key))
    elif isinstance(tree, (list, tuple)):
        for index, value in enumerate(tree):
            yield from _tensors(value, f"{prefix}/{index}")
