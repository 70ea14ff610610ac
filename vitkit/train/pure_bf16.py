"""``trainer.precision: bf16-true``: the training steps run a bfloat16 copy of the model, while the
model itself stays float32 (its master weights).

Under ``bf16-mixed`` autocast casts every weight to bfloat16 in each forward and keeps the residual
stream in float32 (so LayerNorm runs on float32; on GPUs autocast also runs LayerNorm and softmax
in float32). The copy here holds bfloat16 weights, so its forward and
backward run in bfloat16 from end to end: no casts, half the memory traffic of the elementwise work.
What a run keeps is still float32, as mixed-precision training keeps master weights (Micikevicius
et al. 2018, arXiv 1710.03740): the optimiser's update, the EMA, gradient clipping, checkpoints and
the exported weights all see the float32 model. Each step the copy takes the model's weights
(:meth:`PureBf16.load_weights`, one cast), and the gradients of its backward are added to the
model's in float32 (:meth:`PureBf16.move_grads`, so accumulated micro-batches sum in float32).

An AdamW step on bfloat16 weights alone (Lightning's ``bf16-true``) drops every update smaller than
half a weight's last bit (1/256 of its size): late in a cosine schedule, most of them. Here no update
is lost, at the cost of one float32 copy of the weights beside the bfloat16 one.

BatchNorm layers (a convolutional stem's) keep float32 weights in the copy and share the model's
running statistics, which their forward updates in place (torch's CPU and CUDA kernels take a
bfloat16 input with float32 statistics).
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_map

#: The layers whose running statistics the copy shares with the model, kept float32.
STATISTICS_LAYERS = (nn.modules.batchnorm._NormBase,)


class PureBf16(nn.Module):
    """A bfloat16 copy of ``master`` that takes its weights and gives back its gradients.

    Args:
        master: the float32 model the optimiser updates. It is not a child of this module (its
            parameters are never seen twice); the copy, :attr:`model`, is.

    Calling this module runs the copy with autocast off: floating-point inputs (``[B, C, H, W]``
    images) are cast to bfloat16, floating-point outputs (logits, a tuple of them) back to float32,
    so a loss is computed in float32.
    """

    def __init__(self, master: nn.Module) -> None:
        super().__init__()
        self.__dict__["master"] = master
        self.model = copy.deepcopy(master).to(torch.bfloat16)
        for module in self.model.modules():
            if isinstance(module, STATISTICS_LAYERS):
                module.float()
        # Matched by name once (walking both models costs about 1 ms a step for a ViT-S); a move
        # to another device keeps the parameter and module objects.
        masters, copies = dict(master.named_modules()), dict(self.model.named_parameters())
        self.__dict__["_statistics"] = [
            (module, masters[name]) for name, module in self.model.named_modules() if isinstance(module, STATISTICS_LAYERS)
        ]
        self.__dict__["_all_pairs"] = [(param, copies[name]) for name, param in master.named_parameters()]
        self._share_statistics()

    def _share_statistics(self) -> None:
        """Point the copy's statistics layers at the model's buffers (the same tensors), which a
        move to another device replaces."""
        for copied, original in self._statistics:
            copied._buffers.update(original._buffers)

    def _pairs(self) -> list[tuple[nn.Parameter, nn.Parameter]]:
        """``(model parameter, copy parameter)`` of the same name, for the trainable ones (a
        fine-tuning schedule may unfreeze more)."""
        return [(param, copied) for param, copied in self._all_pairs if param.requires_grad]

    @torch.no_grad()
    def load_weights(self) -> None:
        """Copy the model's float32 weights into the bfloat16 copy (rounded to nearest)."""
        pairs = self._pairs()
        if pairs:
            torch._foreach_copy_([copied for _, copied in pairs], [param for param, _ in pairs])
        self._share_statistics()

    @torch.no_grad()
    def move_grads(self) -> None:
        """Add the copy's gradients to the model's, in float32, and clear the copy's."""
        pairs = [(param, copied) for param, copied in self._pairs() if copied.grad is not None]
        summed = [(param, copied) for param, copied in pairs if param.grad is not None]  # accumulated micro-batches
        if summed:
            torch._foreach_add_([param.grad for param, _ in summed], [copied.grad for _, copied in summed])
        for param, copied in pairs:
            if param.grad is None:
                param.grad = copied.grad.to(param.dtype)
        for _, copied in pairs:
            copied.grad = None

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        device = next(self.model.parameters()).device.type
        with torch.autocast(device, enabled=False):
            outputs = self.model(*tree_map(_to(torch.bfloat16), args), **tree_map(_to(torch.bfloat16), kwargs))
        return tree_map(_to(torch.float32), outputs)


def _to(dtype: torch.dtype) -> Any:
    """Casts a floating-point tensor to ``dtype``; leaves anything else as it is."""

    def cast(value: Any) -> Any:
        return value.to(dtype) if isinstance(value, torch.Tensor) and value.is_floating_point() else value

    return cast
