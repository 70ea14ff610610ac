"""What the benchmarks time: one inference forward or one AdamW training step of a model, on a
random batch, and its FLOPs; a vitkit model and its timm twin with the same weights."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from ..models import create_model, merge_tokens, to_timm

PRECISIONS = ("fp32", "bf16")


DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


#: ``--merge-tokens``: ``(r, schedule)`` for :func:`vitkit.merge_tokens`.
MergeTokens = tuple[int | list[int], str]
#: Where a table hands each row once it is measured (``vitkit benchmark``: stderr, as it goes), or ``None``.
Progress = Callable[[str], object] | None


def autocast(precision: str) -> torch.autocast:
    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16")


def make_step(
    model: nn.Module, images: torch.Tensor, labels: torch.Tensor, mode: str, precision: str, fused: bool = True
) -> Callable[[], None]:
    """A closure running one inference forward or one AdamW training step (fused AdamW, as vitkit's
    training uses, unless ``fused`` is False: torch's foreach implementation). ``precision``:
    ``"fp32"``, ``"bf16"`` (autocast) or, for training, ``"bf16-true"`` (``trainer.precision:
    bf16-true``: the step runs a :class:`~vitkit.train.pure_bf16.PureBf16` copy and AdamW updates
    the float32 model)."""
    if mode == "forward":
        model.eval()

        def forward() -> None:
            with torch.inference_mode(), autocast(precision):
                model(images)

        return forward
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=fused or None)
    pure = None
    if precision == "bf16-true":
        from ..train.pure_bf16 import PureBf16  # Lightning's import only where it is used

        pure = PureBf16(model)

    def train_step() -> None:
        optimizer.zero_grad(set_to_none=True)
        if pure is not None:
            pure.load_weights()
        with autocast(precision):
            loss = F.cross_entropy((model if pure is None else pure)(images), labels)
        loss.backward()
        if pure is not None:
            pure.move_grads()
        optimizer.step()

    return train_step


def twins(name: str, merge: MergeTokens | None = None, **overrides: int | bool) -> tuple[nn.Module, nn.Module | None]:
    """A vitkit model (variant ``name`` with ``ViTConfig`` ``overrides``) and the timm model with
    the same weights (``None`` where timm has no equivalent: shifted patches, locality attention);
    with ``merge``, the vitkit model merges tokens (:func:`vitkit.merge_tokens`) and timm's does not."""
    torch.manual_seed(0)
    model = create_model(name, **overrides)
    try:
        twin = to_timm(model)
    except ValueError:
        twin = None
    return (model if merge is None else merge_tokens(model, *merge)), twin


def batch_for(model: nn.Module, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    config = model.config
    images = torch.randn(batch_size, config.in_chans, *config.img_size)
    return images, torch.randint(0, config.num_classes, (batch_size,))


def step_flops(model: nn.Module, images: torch.Tensor, labels: torch.Tensor, mode: str) -> int:
    """FLOPs of one forward (``mode="forward"``) or forward + backward, counted by
    ``torch.utils.flop_counter`` with the explicit kernel (its matmuls are counted on every
    device; a fused SDPA call on the CPU may not be), so the count does not depend on the kernel."""
    policies = [block.attn.attn_impl for block in model.blocks]
    for block in model.blocks:
        block.attn.attn_impl = "explicit"
    try:
        with FlopCounterMode(display=False) as counter:
            with torch.set_grad_enabled(mode == "train"):
                loss = F.cross_entropy(model(images), labels)
            if mode == "train":
                loss.backward()
        model.zero_grad(set_to_none=True)
    finally:
        for block, policy in zip(model.blocks, policies):
            block.attn.attn_impl = policy
    return counter.get_total_flops()
