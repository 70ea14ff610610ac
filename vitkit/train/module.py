"""The LightningModule that trains a :class:`~vitkit.models.VisionTransformer` on any objective
(a :class:`~vitkit.tasks.Task`: classification, or self-supervised pre-training): AdamW with a
warmup-cosine schedule, gradient clipping, an optional weight EMA, checkpoints, and a stop on a
non-finite loss. What the objective computes lives in :mod:`vitkit.tasks`, not here."""

from __future__ import annotations

import copy
from collections import deque
from collections.abc import Callable
from typing import Any

import lightning as L
import torch
from timm.utils import ModelEmaV3
from torch import nn

from ..collective import seed_per_process
from ..errors import VitkitError
from ..io import EMA_PREFIX, FORMAT_KEY, FORMAT_VERSION, MODEL_PREFIX, RELEASED_KEY
from ..layers import has_lora, merge_lora
from ..models import VisionTransformer, ViTConfig, from_timm
from ..schema import FieldError, RecipeError
from ..tasks import Task, TaskSetup
from .checkpoint_format import adopt_automatic_steps, load_ema, non_finite_tensors, save_ema
from .config import RecipeConfig
from .distributed import clip_grad_norm, clip_grad_per_param, gather_into, is_sharded, meta_skeleton, shard
from .lightning_compat import HOOK_NAME_ATTRIBUTE, attached_trainer, batches_started, loggers_write_this_step
from .optim import Horizon, OptimConfig, WeightDecaySchedule, build_optimizer, refresh_lr, warmup_cosine
from .pure_bf16 import PureBf16

#: How many recent losses a non-finite-loss error reports.
LOSS_HISTORY = 8


class NonFiniteLossError(VitkitError, RuntimeError):
    """The training loss became NaN or infinite; the run stops, its last good checkpoint stays."""


def build_task(recipe: RecipeConfig, vit_config: ViTConfig, extra: dict[str, Any]) -> Task:
    """The registered task ``recipe.task`` names, built from its options (:meth:`~vitkit.tasks.Task.from_recipe`)
    for a model of ``vit_config`` (``extra``: the metadata exported with the model: the data's
    normalisation, class names).

    Raises:
        RecipeError: options the model cannot take (a crop size, a mask ratio that hides every patch).
    """
    task = recipe.task
    setup = TaskSetup(model=vit_config, extra=extra, recipe=recipe, epochs=recipe.trainer.max_epochs)
    try:
        return task.task_class.from_recipe(task.options, setup)
    except FieldError as error:
        raise RecipeError(f"{error.key} {error.problem}") from None


class ViTModule(L.LightningModule):
    """A ViT trained on an objective (:class:`~vitkit.tasks.Task`).

    Args:
        model: the model to train, built once by :func:`~vitkit.train.model_builder.build_model`
            (a vitkit :class:`VisionTransformer`, or timm's for ``model.impl: timm``).
        recipe: the resolved recipe; its ``optim`` section is used here, the rest by the task.
        vit_config: the model's :class:`ViTConfig` (the one ``model`` was built from).
        extra: metadata exported with the model (mean, std, img_size, class_names, ...).
        task: the objective; by default the one ``recipe.task`` names (:func:`build_task`).

    The recipe, ``vit_config`` and ``extra`` are saved as plain-dict hyper-parameters, so a
    checkpoint loads with ``torch.load(weights_only=True)`` and rebuilds its model without the
    recipe file (:func:`vitkit.load_model`).
    """

    def __init__(
        self, model: nn.Module, recipe: RecipeConfig, vit_config: ViTConfig, extra: dict[str, Any],
        task: Task | None = None,
    ) -> None:
        super().__init__()
        self.optim_config: OptimConfig = recipe.optim
        self.model = model  # saved under MODEL_PREFIX, the attribute's name
        self.task = task if task is not None else build_task(recipe, vit_config, extra)
        self.task.prepare(self.model)
        # The EMA copy is updated in place, never by gradients. Kept out of the module's children
        # (as the teacher), DDP and FSDP neither wrap nor shard it, the optimiser and clipping never
        # see it; it follows the module's device, dtype and train/eval mode (:meth:`_apply`,
        # :meth:`train`) and is saved under the same keys (EMA_PREFIX) as when it was a child.
        # The training-kernel chooser no longer sets its attention modules during training steps,
        # which never run it: it runs in evaluation, where every module is back to "auto" anyway.
        self.__dict__["ema"] = ModelEmaV3(self.model, decay=self.optim_config.ema_decay) if self.optim_config.ema else None
        if self.ema is not None:
            self.ema.train(self.training)  # timm leaves the copy in eval mode
            self.ema.requires_grad_(False)
            self.register_state_dict_post_hook(save_ema)
            self.register_load_state_dict_pre_hook(load_ema)
        self.save_hyperparameters({"recipe": recipe.to_dict(), "vit_config": vit_config.to_dict(), "extra": extra,
                                   FORMAT_KEY: FORMAT_VERSION, RELEASED_KEY: self.released_prefix()})
        #: ``trainer.precision: bf16-true``: the bfloat16 copy the training steps run, kept out of
        #: the children (no checkpoint, optimiser or strategy sees it); the model stays float32.
        self.__dict__["pure_bf16"] = PureBf16(self.model) if recipe.trainer.precision == "bf16-true" else None
        #: ``(step, loss)`` of the recent steps, on the device, for the divergence message.
        self._recent_losses: deque[tuple[int, torch.Tensor]] = deque(maxlen=LOSS_HISTORY)
        #: ``(step, loss)`` of the steps since the last check, on the device: they are checked
        #: together on logging steps and before a checkpoint (one host sync), so a steady step
        #: neither waits for the host nor queues any work of the check.
        self._unchecked: list[tuple[int, torch.Tensor]] = []
        #: The training loss of the latest logging step, for the progress bar.
        self.shown_loss: float | None = None
        self.horizon: Horizon | None = None  # the learning-rate schedule's (configure_optimizers)
        self.decay_schedule: WeightDecaySchedule | None = None  # optim.weight_decay_end's (configure_optimizers)
        self.automatic_optimization = False  # :meth:`training_step` takes the optimiser step itself
        #: Under FSDP, the model's structure taken before sharding, its weights on the meta device
        #: (no memory), which :meth:`export_model` fills on rank 0 with the gathered weights.
        self.__dict__["skeleton"] = None

    def __setattr__(self, name: str, value: Any) -> None:
        # Lightning sets HOOK_NAME_ATTRIBUTE (a hook's name, or None) before and after each of
        # the ~40 hook calls of a training step; nn.Module's ``__setattr__`` looks for parameters,
        # buffers and submodules first, about 1 us a call, a plain store a tenth of that.
        if name == HOOK_NAME_ATTRIBUTE:
            object.__setattr__(self, name, value)
            return
        super().__setattr__(name, value)

    def configure_model(self) -> None:
        """Under FSDP (:func:`~vitkit.train.distributed.shard`), shard the model once: one unit per
        encoder block, one for the rest of the model, one for each of the task's layers that hold
        weights. Lightning calls this before every fit, validation and test."""
        if self.skeleton is None and is_sharded(self.trainer.strategy):
            self.__dict__["skeleton"] = meta_skeleton(self.model)
            task_layers = [layer for layer in self.task.children() if any(True for _ in layer.parameters())]
            shard([*self.model.blocks, self.model, *task_layers], self.trainer.strategy.device_mesh["data_parallel"])

    def setup(self, stage: str) -> None:
        if self.pure_bf16 is not None and self.trainer.world_size > 1:
            raise RecipeError(
                f"trainer.precision=bf16-true trains on one device, but this run has {self.trainer.world_size} "
                "processes (its bfloat16 copy is outside what DDP and FSDP reduce); use trainer.precision=bf16-mixed, "
                "or trainer.devices=1."
            )

    def on_fit_start(self) -> None:
        # the processes were seeded alike for the same initial weights; from here each draws its own
        seed_per_process(self.hparams["recipe"]["trainer"]["seed"])
        self.task.on_fit_start(self.device)

    def train(self, mode: bool = True) -> ViTModule:
        """Train (or, ``mode=False``, eval) mode for the module, its EMA and its bfloat16 copy."""
        for copied in (self.ema, self.pure_bf16):
            if copied is not None:
                copied.train(mode)
        return super().train(mode)

    def _apply(self, fn: Callable[..., Any], recurse: bool = True) -> ViTModule:
        # .to(device), .cpu(), .to(dtype) (Lightning's device placement, precision plugins) reach the
        # EMA copy; device moves reach the bfloat16 copy too
        if self.ema is not None:
            self.ema._apply(fn, recurse)
        if self.pure_bf16 is not None:
            self.pure_bf16._apply(fn, recurse)
        return super()._apply(fn, recurse)

    @property
    def step_model(self) -> nn.Module:
        """The model the training steps run: :attr:`model`, or its bfloat16 copy under
        ``trainer.precision: bf16-true`` (which the attention-kernel and compile trials tune)."""
        return self.pure_bf16.model if self.pure_bf16 is not None else self.model

    @property
    def inference_model(self) -> nn.Module:
        """The weights to evaluate and export: the EMA when enabled, else the trained ones."""
        return self.ema.module if self.ema is not None else self.model

    def released_prefix(self) -> str:
        """The state-dict prefix of the model :meth:`export_model` releases, which a checkpoint
        names (:data:`~vitkit.io.RELEASED_KEY`) so that it reads as that model (:func:`vitkit.load_model`)."""
        released = self.task.exported_model(self.inference_model)
        if released is self.inference_model:
            return EMA_PREFIX if self.ema is not None else MODEL_PREFIX
        return next(f"{name}." for name, module in self.named_modules() if module is released)

    def export_model(self) -> VisionTransformer | None:
        """The model the task releases (:meth:`~vitkit.tasks.Task.exported_model` of
        :attr:`inference_model`: DINO's teacher) as a plain vitkit model on the CPU in eval mode
        (LoRA adapters merged, a timm reference converted, so every tool takes it). Under FSDP the
        shards are gathered on rank 0 only (a collective: every rank calls this); the other ranks
        get ``None``."""
        model = self.task.exported_model(self.inference_model)
        if self.skeleton is not None:  # this rank holds shards: rank 0 gathers the whole model
            model = gather_into(self.skeleton, self.trainer.model, prefix=MODEL_PREFIX)
            if model is None:
                return None
        if has_lora(model):  # a plain model for every tool: the adapters folded into the weights
            model = merge_lora(copy.deepcopy(model))
        if not isinstance(model, VisionTransformer):
            model = from_timm(model)
        return model.cpu().eval()

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """``[B, C, H, W]`` to ``[B, num_classes]`` logits of :attr:`inference_model`."""
        return self.inference_model(images)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        """One optimiser step, as Lightning's automatic loop takes it (the loss, the gradients
        zeroed, backward, clipping in :meth:`on_before_optimizer_step`, the step, the schedule),
        without that loop's closure and hook calls: about 0.15-0.2 ms less host work a step
        (``dev/host_overhead.py``), which a small model's step cannot hide. Returns the loss."""
        optimizer, scheduler = self.optimizers(), self.lr_schedulers()
        loss = self.training_loss(batch)
        # Lightning runs all of training_step in the precision's autocast, which only the forward
        # needs: outside it, as in the automatic loop, the backward, clipping and step operators
        # skip autocast's dispatch (~0.5 ms a step of the fast recipe's smallest model otherwise).
        with torch.autocast(self.device.type, enabled=False):
            optimizer.zero_grad(set_to_none=True)
            self.manual_backward(loss)  # float16: scaled; the pure-bf16 copy's gradients move in on_after_backward
            if self.decay_schedule is not None:  # the decay of the step the scheduler is at
                self.decay_schedule.apply(scheduler.last_epoch)
            optimizer.step()  # float16: unscaled, then clipped (the hook), then stepped unless not finite
            scheduler.step()
        return loss

    def training_loss(self, batch: Any) -> torch.Tensor:
        """The task's training loss on ``batch`` (a scalar with its graph), noted for the
        non-finite check and logged on logging steps; no gradient or optimiser work."""
        if self.pure_bf16 is not None:
            self.pure_bf16.load_weights()
        out = self.task.training_step(self.model if self.pure_bf16 is None else self.pure_bf16, batch)
        logging_step = self._check_finite(out.loss)
        # Logged on the steps whose metrics reach the loggers (``trainer.log_every``) only: each
        # ``self.log`` costs Lightning's bookkeeping (~0.1 ms of host time), which a small model's
        # step cannot hide, and the values of the other steps are never written. Not a progress-bar
        # metric either: Lightning would read it as a number every step (a host sync); the bar
        # shows the loss of the logging steps (LossProgressBar), read here with the check.
        if logging_step:
            self.shown_loss = float(out.loss.detach())
            self.log("train/loss", out.loss, batch_size=out.batch_size)
            for key, value in out.metrics.items():
                self.log(f"train/{key}", value() if callable(value) else value, batch_size=out.batch_size)
        return out.loss

    def on_after_backward(self) -> None:
        if self.pure_bf16 is not None:  # the float32 model's gradients, before clipping and the step
            self.pure_bf16.move_grads()

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.ema is not None:
            self.ema.update(self.model, step=self.global_step)
        self.task.after_optimizer_step(self.model, self.global_step, int(self.trainer.estimated_stepping_batches))

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self._evaluate(batch, "val")

    def test_step(self, batch: Any, batch_idx: int) -> None:
        self._evaluate(batch, "test")

    def build_optimizer(self, *, allow_fused: bool = True) -> torch.optim.AdamW:
        """AdamW over the model's parameters (:func:`~vitkit.train.optim.build_optimizer`) and the
        task's own (a decoder, a projection head), at the recipe's rate, without layer decay."""
        return build_optimizer(self.model, self.optim_config, extra=self.task, allow_fused=allow_fused)

    def configure_optimizers(self) -> dict[str, Any]:
        # float16 loss scaling unscales the gradients inside a fused step, after clipping would see them
        optimizer = self.build_optimizer(allow_fused=self.trainer.precision != "16-mixed")
        total_steps = int(self.trainer.estimated_stepping_batches)
        warmup_steps = round(self.optim_config.warmup_epochs * total_steps / max(1, self.trainer.max_epochs))
        self.horizon = Horizon(warmup_steps, total_steps, floor=self.optim_config.min_lr / self.optim_config.lr)
        scheduler = warmup_cosine(optimizer, self.horizon)
        end = self.optim_config.weight_decay_end
        if end is not None:
            self.decay_schedule = WeightDecaySchedule(optimizer, self.horizon, self.optim_config.weight_decay, end)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step", "name": "lr"}}

    def set_schedule(self, warmup_steps: int, total_steps: int, epochs: int) -> None:
        """Fit the learning-rate schedule (and the task's own, DINO's teacher) to a run of ``epochs``
        epochs and ``total_steps`` steps, once training has started (a time budget's plan): the steps
        taken keep the rates they had, the next one follows the new :attr:`horizon`."""
        self.horizon.warmup_steps, self.horizon.total_steps = warmup_steps, total_steps
        refresh_lr(self.lr_schedulers())
        self.task.set_epochs(epochs)

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        """Clip the gradients to ``optim.clip_grad`` by their global norm (or, with
        ``optim.clip_mode: per_param``, each parameter's gradient by its own norm), just before the
        step (float16's loss scale is already taken out: Lightning unscales before this hook).
        Under FSDP a norm is that of every rank's shards together (Lightning's FSDP plugin clips
        by value only)."""
        max_norm = self.optim_config.clip_grad
        if not max_norm:
            return
        if self.optim_config.clip_mode == "per_param":
            clip_grad_per_param(self.parameters(), max_norm, sharded=is_sharded(self.trainer.strategy))
        elif is_sharded(self.trainer.strategy):
            clip_grad_norm(self.parameters(), max_norm, sharded=True)
        else:
            torch.nn.utils.clip_grad_norm_(self.parameters(), max_norm)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        adopt_automatic_steps(checkpoint)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Refuse to write a checkpoint with non-finite weights or optimiser state (the weights can
        diverge a step before the loss does), or after a non-finite loss. Runs on every rank, so DDP
        processes stop together; under FSDP each rank checks its own shards and the ranks agree
        (an all-reduce) before any of them writes."""
        self.raise_if_diverged()
        bad = non_finite_tensors(checkpoint)
        if is_sharded(self.trainer.strategy):
            found = torch.tensor(float(len(bad)), device=self.device)
            torch.distributed.all_reduce(found)
            bad = bad or (["the shards of another rank"] if found.item() else [])
        if bad:
            shown = ", ".join(bad[:3]) + (f" and {len(bad) - 3} more" if len(bad) > 3 else "")
            raise NonFiniteLossError(
                f"the weights or optimiser state became non-finite at step {self.global_step} (epoch "
                f"{self.current_epoch}; {shown}), so no checkpoint was written for this step."
            )

    def _evaluate(self, batch: Any, stage: str) -> None:
        out = self.task.evaluation_step(self.inference_model, batch, stage)
        progress = self.task.progress_metric
        self.log(f"{stage}/loss", out.loss, sync_dist=True, batch_size=out.batch_size, prog_bar=progress == "loss")
        for key, value in out.metrics.items():
            self.log(f"{stage}/{key}", value, sync_dist=True, batch_size=out.batch_size, prog_bar=key == progress)
        if stage == "test":  # how many images the accuracy covers (trainer.limit_test_batches may cut it)
            self.log("test/images", float(out.batch_size), reduce_fx="sum", sync_dist=True, batch_size=out.batch_size)

    def _check_finite(self, loss: torch.Tensor) -> bool:
        """Note the loss (no tensor work); check the losses noted since the last check (a host
        sync) on the steps whose metrics Lightning logs (``trainer.log_every``). Returns whether
        this is such a logging step."""
        noted = (self.global_step, loss.detach())
        self._recent_losses.append(noted)
        self._unchecked.append(noted)
        logging_step = self._is_logging_step()
        if logging_step:
            self.raise_if_diverged()
        return logging_step

    def _is_logging_step(self) -> bool:
        """Whether Lightning writes this training step's metrics to the loggers: by its own rule
        (every ``log_every_n_steps`` optimiser steps, and the step on which the run stops), and at
        the end of an epoch or of ``max_steps``, where it writes the latest logged values again."""
        trainer = attached_trainer(self)
        if trainer is None:  # called outside a Trainer (a bare module): every step
            return True
        last_of_epoch = batches_started(trainer) >= trainer.num_training_batches
        last_step = trainer.max_steps != -1 and self.global_step + 1 >= trainer.max_steps
        return loggers_write_this_step(trainer) or bool(trainer.fast_dev_run) or last_of_epoch or last_step

    def raise_if_diverged(self) -> None:
        """Raise :class:`NonFiniteLossError` if a training loss so far was NaN or infinite (the
        losses not yet checked are checked now, together: one host sync)."""
        if not self._unchecked:
            return
        steps, values = zip(*self._unchecked)
        finite = torch.isfinite(torch.stack(values).float())
        if bool(finite.all()):
            self._unchecked.clear()
            return
        first = int((~finite).int().argmax())  # the first non-finite loss among the unchecked
        step, value = steps[first], float(values[first])
        recent = torch.stack([loss for _, loss in self._recent_losses]).float().tolist()
        history = ", ".join(f"{v:.4g}" for v in recent)
        raise NonFiniteLossError(
            f"training loss became {value} at step {step} (found at epoch {self.current_epoch}); "
            f"last {len(recent)} losses: [{history}]."
        )

    def on_train_end(self) -> None:
        self.raise_if_diverged()
