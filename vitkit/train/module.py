"""The LightningModule: a :class:`~vitkit.models.VisionTransformer` classifier with AdamW, a
warmup-cosine schedule, Mixup/CutMix and label smoothing (timm), an optional weight EMA, DeiT
distillation from a frozen teacher, top-1/top-5 metrics and a stop on a non-finite loss."""

from __future__ import annotations

import copy
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import lightning as L
import torch
from timm.data import Mixup
from timm.loss import LabelSmoothingCrossEntropy, SoftTargetCrossEntropy
from timm.utils import ModelEmaV3, accuracy
from torch import nn

from ..errors import VitkitError
from ..evaluation import TestTimeAugmentation, average_views, batch_metrics, black_level, predict_views
from ..io import FORMAT_KEY, FORMAT_VERSION
from ..layers import has_lora, merge_lora
from ..models import VisionTransformer, ViTConfig, from_timm
from .config import OptimConfig, RecipeConfig
from .distill import DistillationLoss
from .distributed import clip_grad_norm, is_sharded, load_gathered
from .optim import build_optimizer, warmup_cosine

#: How many recent losses a non-finite-loss error reports.
LOSS_HISTORY = 8


class NonFiniteLossError(VitkitError, RuntimeError):
    """The training loss became NaN or infinite; the run stops, its last good checkpoint stays."""


class ViTClassifier(L.LightningModule):
    """Image classification with a ViT.

    Args:
        model: the model to train, built once by :func:`~vitkit.train.model_builder.build_model`
            (a vitkit :class:`VisionTransformer`, or timm's for ``model.impl: timm``).
        recipe: the resolved recipe; its ``optim``, ``distill`` and ``trainer.tta`` sections are used here.
        vit_config: the model's :class:`ViTConfig` (the one ``model`` was built from).
        extra: metadata exported with the model (mean, std, img_size, class_names, ...).

    The recipe, ``vit_config`` and ``extra`` are saved as plain-dict hyper-parameters, so a
    checkpoint loads with ``torch.load(weights_only=True)`` and rebuilds its model without the
    recipe file (:func:`vitkit.load_model`).
    """

    def __init__(self, model: nn.Module, recipe: RecipeConfig, vit_config: ViTConfig, extra: dict[str, Any]) -> None:
        super().__init__()
        self.save_hyperparameters({"recipe": recipe.to_dict(), "vit_config": vit_config.to_dict(), "extra": extra,
                                   FORMAT_KEY: FORMAT_VERSION})
        self.optim_config: OptimConfig = recipe.optim
        self.tta: TestTimeAugmentation = recipe.trainer.tta
        self.val_tta: TestTimeAugmentation = recipe.trainer.val_tta or self.tta
        #: ``[C]`` normalised black, the border of ``'hflip_shift'``'s moved views.
        self.fill = black_level(extra["mean"], extra["std"]) if "mean" in extra and "std" in extra else None
        self.model = model
        self.mixup, self.train_criterion = build_criterion(self.optim_config, vit_config.num_classes)
        distill = recipe.distill
        self.distill_loss = (
            None if distill.type == "none"
            else DistillationLoss(self.train_criterion, distill.type, distill.alpha, distill.tau)
        )
        if self.distill_loss is not None and hasattr(self.model, "set_distilled_training"):
            self.model.set_distilled_training(True)  # a distillation token's head gets the teacher's term
        self.teacher: nn.Module | None = None
        # The EMA copy is updated in place, never by gradients. Kept out of the module's children
        # (as the teacher), DDP and FSDP neither wrap nor shard it, the optimiser and clipping never
        # see it; it follows the module's device, dtype and train/eval mode (:meth:`_apply`,
        # :meth:`train`) and is saved under the same ``ema.module.*`` keys as when it was a child.
        # The training-kernel chooser no longer sets its attention modules during training steps,
        # which never run it: it runs in evaluation, where every module is back to "auto" anyway.
        self.__dict__["ema"] = ModelEmaV3(self.model, decay=self.optim_config.ema_decay) if self.optim_config.ema else None
        if self.ema is not None:
            self.ema.train(self.training)  # timm leaves the copy in eval mode
            self.ema.requires_grad_(False)
            self.register_state_dict_post_hook(_save_ema)
            self.register_load_state_dict_pre_hook(_load_ema)
        self._recent_losses: deque[torch.Tensor] = deque(maxlen=LOSS_HISTORY)
        #: Under FSDP, an unsharded CPU copy of the model taken before sharding, which
        #: :meth:`export_model` fills with the gathered weights (outside the children, as the EMA).
        self.__dict__["unsharded"] = None

    def configure_model(self) -> None:
        if self.unsharded is None and is_sharded(self.trainer.strategy):  # Lightning calls this before it shards
            self.__dict__["unsharded"] = copy.deepcopy(self.model).cpu()

    def attach_teacher(self, teacher: nn.Module) -> None:
        """Distil from ``teacher`` (frozen, see :func:`~vitkit.train.distill.freeze`). It is kept
        out of the module's children, so it is neither checkpointed nor switched to train mode."""
        self.__dict__["teacher"] = teacher

    def on_fit_start(self) -> None:
        if self.distill_loss is not None:
            if self.teacher is None:
                raise RuntimeError("distillation is configured but no teacher was attached (attach_teacher).")
            self.teacher.to(self.device)

    def train(self, mode: bool = True) -> ViTClassifier:
        """Train (or, ``mode=False``, eval) mode for the module and its EMA copy."""
        if self.ema is not None:
            self.ema.train(mode)
        return super().train(mode)

    def _apply(self, fn: Callable[..., Any], recurse: bool = True) -> ViTClassifier:
        # .to(device), .cpu(), .to(dtype) (Lightning's device placement, precision plugins) reach the EMA copy
        if self.ema is not None:
            self.ema._apply(fn, recurse)
        return super()._apply(fn, recurse)

    @property
    def inference_model(self) -> nn.Module:
        """The weights to evaluate and export: the EMA when enabled, else the trained ones."""
        return self.ema.module if self.ema is not None else self.model

    def export_model(self) -> VisionTransformer:
        """:attr:`inference_model` as a plain vitkit model on the CPU in eval mode (LoRA adapters
        merged, a timm reference converted, so every tool takes it)."""
        model = self.inference_model
        if self.unsharded is not None:  # this rank holds shards: every rank gathers the whole model
            model = load_gathered(self.unsharded, self.trainer.model, prefix="model.")
        if has_lora(model):  # a plain model for every tool: the adapters folded into the weights
            model = merge_lora(copy.deepcopy(model))
        if not isinstance(model, VisionTransformer):
            model = from_timm(model)
        return model.cpu().eval()

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """``[B, C, H, W]`` to ``[B, num_classes]`` logits of :attr:`inference_model`."""
        return self.inference_model(images)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        images, targets = batch
        soft_targets = targets
        if self.mixup is not None:
            images, soft_targets = self.mixup(images, targets)
        outputs = self.model(images)
        # (class, distillation) logits from a model with a distillation token; else one set for both, as DeiT
        logits, dist_logits = outputs if isinstance(outputs, tuple) else (outputs, outputs)
        if self.distill_loss is not None:
            with torch.no_grad():
                teacher_logits = self.teacher(images)
            loss = self.distill_loss(logits, dist_logits, soft_targets, teacher_logits)
        else:
            loss = self.train_criterion(logits, soft_targets)
        self._check_finite(loss)
        self.log("train/loss", loss, prog_bar=True, batch_size=len(targets))
        if self.mixup is None:
            self.log("train/acc1", accuracy(logits.detach(), targets)[0], batch_size=len(targets))
        return loss

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.ema is not None:
            self.ema.update(self.model, step=self.global_step)

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        self._evaluate(batch, "val")

    def test_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        self._evaluate(batch, "test")

    def configure_optimizers(self) -> dict[str, Any]:
        # float16 loss scaling unscales the gradients inside a fused step, after clipping would see them
        optimizer = build_optimizer(self.model, self.optim_config, allow_fused=self.trainer.precision != "16-mixed")
        total_steps = int(self.trainer.estimated_stepping_batches)
        warmup_steps = round(self.optim_config.warmup_epochs * total_steps / max(1, self.trainer.max_epochs))
        scheduler = warmup_cosine(
            optimizer,
            warmup_steps=warmup_steps,
            total_steps=total_steps,
            lr=self.optim_config.lr,
            min_lr=self.optim_config.min_lr,
        )
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step", "name": "lr"}}

    def configure_gradient_clipping(
        self, optimizer: torch.optim.Optimizer, gradient_clip_val: float | None = None, gradient_clip_algorithm: str | None = None
    ) -> None:
        """Clip by norm. Lightning's mixed-precision plugin refuses to clip for a fused optimizer
        (it assumes the step unscales float16 gradients itself); under bf16 and float32 there is no
        scaler, so the gradients are clipped here as they are. Its FSDP plugin refuses to clip by
        norm: under FSDP the gradients are clipped by the global norm of every rank's shards."""
        if is_sharded(self.trainer.strategy):
            if gradient_clip_val:
                clip_grad_norm(self.parameters(), gradient_clip_val, sharded=True)
            return
        if optimizer.defaults.get("fused") and gradient_clip_val:
            torch.nn.utils.clip_grad_norm_(self.parameters(), gradient_clip_val)  # the trainer's algorithm is "norm"
            return
        super().configure_gradient_clipping(optimizer, gradient_clip_val, gradient_clip_algorithm)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Refuse to write a checkpoint with non-finite weights or optimiser state (the weights can
        diverge a step before the loss does). Runs on every rank, so DDP processes stop together."""
        bad = non_finite_tensors(checkpoint)
        if bad:
            shown = ", ".join(bad[:3]) + (f" and {len(bad) - 3} more" if len(bad) > 3 else "")
            raise NonFiniteLossError(
                f"the weights or optimiser state became non-finite at step {self.global_step} (epoch "
                f"{self.current_epoch}; {shown}), so no checkpoint was written for this step."
            )

    def _evaluate(self, batch: tuple[torch.Tensor, torch.Tensor], stage: str) -> None:
        images, targets = batch
        views = predict_views(self.inference_model, images, self.val_tta if stage == "val" else self.tta, self.fill)
        loss, acc1, acc5 = batch_metrics(average_views(views), targets)
        self.log_dict({f"{stage}/loss": loss, f"{stage}/acc5": acc5}, sync_dist=True, batch_size=len(targets))
        self.log(f"{stage}/acc1", acc1, sync_dist=True, batch_size=len(targets), prog_bar=True)
        if stage == "test":  # how many images the accuracy covers (trainer.limit_test_batches may cut it)
            self.log("test/images", float(len(targets)), reduce_fx="sum", sync_dist=True, batch_size=len(targets))
        if len(views) > 1:  # the images alone, beside the averaged views, so that the gain is measured
            single = accuracy(views[0], targets)[0]
            self.log(f"{stage}/acc1_one_view", single, sync_dist=True, batch_size=len(targets))
        if len(views) > 2:  # and the image with its mirror ('hflip'), so that the moved views' gain is too
            mirrored = accuracy(average_views(views[:2]), targets)[0]
            self.log(f"{stage}/acc1_mirrored", mirrored, sync_dist=True, batch_size=len(targets))

    def _check_finite(self, loss: torch.Tensor) -> None:
        self._recent_losses.append(loss.detach())
        if not torch.isfinite(loss):
            history = ", ".join(f"{value:.4g}" for value in torch.stack(list(self._recent_losses)).float().tolist())
            raise NonFiniteLossError(
                f"training loss became {loss.item()} at step {self.global_step} (epoch {self.current_epoch}); "
                f"last {len(self._recent_losses)} losses: [{history}]."
            )


def _save_ema(module: ViTClassifier, state_dict: dict[str, Any], prefix: str, local_metadata: dict[str, Any]) -> None:
    """State-dict post-hook: the EMA copy's tensors under ``ema.module.*``, where they were when the
    copy was a child of the module (checkpoints of either layout load into the other)."""
    module.ema.state_dict(destination=state_dict, prefix=f"{prefix}ema.")


def _load_ema(
    module: ViTClassifier,
    state_dict: dict[str, Any],
    prefix: str,
    local_metadata: dict[str, Any],
    strict: bool,
    missing_keys: list[str],
    unexpected_keys: list[str],
    error_msgs: list[str],
) -> None:
    """Load-state-dict pre-hook: the ``ema.module.*`` entries taken out of ``state_dict`` into the
    EMA copy; missing or unexpected ones are reported as the module's own would be."""
    head = f"{prefix}ema."
    ema_state = {key[len(head):]: state_dict.pop(key) for key in [key for key in state_dict if key.startswith(head)]}
    result = module.ema.load_state_dict(ema_state, strict=False)
    missing_keys.extend(head + key for key in result.missing_keys)
    unexpected_keys.extend(head + key for key in result.unexpected_keys)


def non_finite_tensors(checkpoint: dict[str, Any]) -> list[str]:
    """Names (``state_dict/model.head.weight``, ``optimizer_states/0/state/3/exp_avg``) of the
    floating-point tensors with a NaN or infinite entry in a checkpoint's weights and optimiser state."""
    sections = {key: checkpoint[key] for key in ("state_dict", "optimizer_states") if key in checkpoint}
    tensors = _tensors(sections, "")
    return [name for name, tensor in tensors if tensor.is_floating_point() and not tensor.isfinite().all()]


def _tensors(tree: Any, prefix: str) -> Iterator[tuple[str, torch.Tensor]]:
    if isinstance(tree, torch.Tensor):
        yield prefix, tree
    elif isinstance(tree, dict):
        for key, value in tree.items():
            yield from _tensors(value, f"{prefix}/{key}" if prefix else str(key))
    elif isinstance(tree, (list, tuple)):
        for index, value in enumerate(tree):
            yield from _tensors(value, f"{prefix}/{index}")


def build_criterion(config: OptimConfig, num_classes: int) -> tuple[Mixup | None, nn.Module]:
    """The batch mixer (``None`` without Mixup/CutMix) and the training loss: soft-target
    cross-entropy after mixing (targets already smoothed), label-smoothing or plain cross-entropy."""
    if config.mixes:
        mixup = Mixup(
            mixup_alpha=config.mixup,
            cutmix_alpha=config.cutmix,
            prob=config.mixup_prob,
            switch_prob=config.mixup_switch_prob,
            label_smoothing=config.label_smoothing,
            num_classes=num_classes,
        )
        return mixup, SoftTargetCrossEntropy()
    if config.label_smoothing > 0:
        return None, LabelSmoothingCrossEntropy(smoothing=config.label_smoothing)
    return None, nn.CrossEntropyLoss()

