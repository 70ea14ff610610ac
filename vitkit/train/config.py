"""The recipe schema: :class:`RecipeConfig` with its ``model``, ``data``, ``optim``, ``trainer``
and ``output`` sections, and :func:`load_recipe` (YAML file or dict, plus dotted overrides).

The ``model`` section names a variant of :func:`vitkit.list_models`, ``grad_checkpointing``,
``impl``, and any :class:`~vitkit.models.ViTConfig` field to override, except ``img_size``,
``in_chans`` and ``num_classes``, which always come from the data. Every section is built and
checked by :mod:`vitkit.schema` (types, ranges, closest key for a typo) before anything runs;
the ranges are in each field's metadata.
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import timm
import yaml
from lightning.pytorch.strategies import StrategyRegistry

from ..data import DataConfig
from ..evaluation import TestTimeAugmentation
from ..files import atomic_write
from ..layers import LoraConfig
from ..models import ViTConfig, model_config
from ..models.config import MAX_DEPTH, MAX_PARAMETERS, MAX_TOKENS
from ..models.timm_interop import fix_overrides, timm_twin_lacks, twin_gaps_message
from ..recipe_files import find_recipe, shipped_recipes
from ..schema import Config, FieldError, bounds, build, describe, dotted_keys, load_yaml, merge, parse_overrides
from ..tasks.dino import head_weights
from ..tasks.mae import check_encoder, decoder_weights, patch_pixels
from .finetune import check_freeze
from .schema import RecipeError

#: ViTConfig fields set from the dataset rather than the recipe.
DATA_DRIVEN_FIELDS = ("img_size", "in_chans", "num_classes")
#: ModelConfig fields that choose the model rather than override a ViTConfig field.
MODEL_CHOICE_FIELDS = (
    "name", "grad_checkpointing", "impl", "pretrained", "pretrained_file", "pretrained_kwargs", "reset_head", "freeze",
    "lora", "pretrained_weights", "fit_to_images",
)
#: The variant a recipe without ``model.name`` or ``model.pretrained`` builds.
DEFAULT_VARIANT = "vit_cifar_tiny"

Precision = Literal["32-true", "bf16-mixed", "bf16-true", "16-mixed"]
ModelImpl = Literal["vitkit", "timm"]

#: Generous but finite limits of the trainer section.
MAX_EPOCHS = 1_000_000
MAX_BATCH_SIZE = 1 << 20
MAX_DEVICES = 1024
MAX_THREADS = 1024


@dataclass
class _ModelChoice(Config):
    name: str | None = None
    grad_checkpointing: bool = False
    impl: ModelImpl = "vitkit"
    pretrained: str | None = None
    pretrained_file: str | None = None
    pretrained_kwargs: dict[str, Any] = field(default_factory=dict)
    reset_head: bool | None = None
    freeze: str = "none"
    lora: LoraConfig | None = None
    pretrained_weights: bool = True
    fit_to_images: bool = False

    def validate(self) -> None:
        """``pretrained_file`` and ``pretrained_kwargs`` come with a timm name, ``reset_head`` with
        weights; the files themselves are read by :func:`~vitkit.train.model_builder.load_starting_weights`
        (a resumed run reads its checkpoint instead). ``freeze`` is checked against the depth when
        the model is built."""
        check_freeze(self.freeze, MAX_DEPTH)
        if self.lora is not None and self.freeze not in ("none", "backbone"):
            raise FieldError(
                "freeze", f"is {self.freeze!r}, but with model.lora every weight but the adapters and the classifier is "
                "frozen already: leave model.freeze unset.",
            )
        if self.pretrained is not None and self.fit_to_images:
            raise FieldError("fit_to_images", "sizes a new encoder to the images, but model.pretrained fixes the model: "
                             "remove one of them.")
        if not self.pretrained_weights and (self.freeze != "none" or self.lora is not None):
            raise FieldError("pretrained_weights", "is false (fresh weights), so model.freeze / model.lora would hold "
                             "random weights still: remove them for the from-scratch baseline.")
        if self.pretrained is None:
            given = [key for key in ("pretrained_file", "pretrained_kwargs", "reset_head") if getattr(self, key) not in (None, {})]
            given += ["pretrained_weights"] if not self.pretrained_weights else []
            if given:  # model.freeze alone: RecipeConfig.validate, once a pre-training task has refused it
                key = given[0]
                raise FieldError(key, "only applies to pretrained weights: set model.pretrained too (a model file or timm:NAME).")
            return
        if self.pretrained.startswith("timm:"):
            reserved = {"pretrained", "num_classes", "pretrained_cfg_overlay"} & set(self.pretrained_kwargs)
            if reserved:
                raise FieldError(
                    "pretrained_kwargs", f"may not set {', '.join(sorted(reserved))}: the weights and the data decide them."
                )
            return
        if self.pretrained_file is not None or self.pretrained_kwargs:
            raise FieldError(
                "pretrained_file" if self.pretrained_file is not None else "pretrained_kwargs",
                f"belongs to a timm model, but model.pretrained={self.pretrained!r} names no timm model: give "
                "model.pretrained=timm:<timm model name>, or model.pretrained=<a vitkit model file> alone.",
            )

    @property
    def variant(self) -> str:
        """The variant to build from scratch: ``name``, or :data:`DEFAULT_VARIANT`."""
        return self.name or DEFAULT_VARIANT

    def vit_overrides(self) -> dict[str, Any]:
        """The ViTConfig fields this recipe sets."""
        return {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if f.name not in MODEL_CHOICE_FIELDS and getattr(self, f.name) is not None
        }


def _vit_overrides_fields() -> list[tuple[str, Any, Any]]:
    """Every recipe-settable :class:`ViTConfig` field, optional: its type ``| None``, default ``None``."""
    hints = typing.get_type_hints(ViTConfig)
    return [
        (f.name, hints[f.name] | None, field(default=None))
        for f in dataclasses.fields(ViTConfig)
        if f.name not in DATA_DRIVEN_FIELDS
    ]


ModelConfig = dataclasses.make_dataclass("ModelConfig", _vit_overrides_fields(), bases=(_ModelChoice,))
ModelConfig.__module__ = __name__
ModelConfig.__doc__ = """Which variant to build, how, and the :class:`ViTConfig` fields to override.

    Attributes:
        name: a variant of :func:`vitkit.list_models` (``None``: ``vit_cifar_tiny``, or with
            ``pretrained`` the weights' own architecture).
        grad_checkpointing: recompute block activations in the backward pass (less memory).
        impl: ``'vitkit'``, or ``'timm'`` to train timm's ``VisionTransformer`` of the same shape
            as a reference.
        pretrained: weights to start from (fine-tuning): a vitkit model file or training checkpoint
            (``model.safetensors``, ``checkpoints/best.ckpt``, a pruned model), or ``timm:NAME``
            (``timm:deit_small_patch16_224``; a tag such as ``.augreg_in21k`` selects timm's
            ``pretrained_cfg``). The weights fix the architecture (see
            :mod:`vitkit.train.model_builder`).
        pretrained_file: the timm model's weights on disk (a state dict as ``.safetensors``, or a
            ``.pth``/``.bin`` read with ``weights_only``); without it timm downloads them.
        pretrained_kwargs: more ``timm.create_model`` arguments of that timm model (timm's
            ``--model-kwargs``), for weights of a model built with them (``{depth: 6}``).
        reset_head: re-initialise the classifier (``None``: when the data's class count differs
            from the weights').
        freeze: ``'none'``, ``'backbone'`` (a linear probe: only ``head``, ``head_dist`` and
            ``fc_norm`` train) or ``'blocks:N'`` (the embeddings and the first N blocks stay as
            loaded); frozen parameters get no gradient, optimiser state or weight decay
            (:mod:`vitkit.train.finetune`).
        lora: low-rank adapters (:class:`~vitkit.layers.LoraConfig`: ``rank``, ``alpha``,
            ``dropout``, ``targets``); the adapters and the classifier train, every other weight
            stays as loaded, and the exported model has the adapters merged into its weights.
        pretrained_weights: ``false`` builds ``pretrained``'s architecture and preprocessing with
            fresh weights: the from-scratch baseline of a fine-tuning run, the same model.
        fit_to_images: an image-folder recipe's image size and encoder keys left unset come from the
            images' size (:mod:`vitkit.train.sizing`; the ``*_imagefolder`` pre-training recipes).

    Every other field is generated from the :class:`ViTConfig` field of the same name (except the
    data-driven ``img_size``, ``in_chans`` and ``num_classes``), typed ``ViTConfig``'s type or
    ``None``; ``None`` keeps the variant's value. Their ranges are ViTConfig's, checked when
    :func:`load_recipe` builds the model's config.
    """


@dataclass
class OptimConfig(Config):
    """AdamW, a per-iteration linear-warmup + cosine schedule, and the loss's regularisers.

    Attributes:
        lr: peak learning rate (reached after warmup), for ``trainer.batch_size`` per device.
        weight_decay: AdamW decoupled decay; norms, biases, ``pos_embed`` and ``cls_token`` get none.
        betas: AdamW betas.
        eps: AdamW epsilon.
        warmup_epochs: linear warmup length (fractions allowed).
        min_lr: learning rate at the end of the cosine decay.
        layer_decay: layer-wise learning-rate decay for fine-tuning (BEiT's, as timm's
            ``param_groups_layer_decay``): a parameter of layer ``i`` learns at
            ``lr * layer_decay ** (depth + 1 - i)``, with the embeddings at layer 0, block ``k`` at
            layer ``k + 1`` (the final norm with the last block) and the head at ``depth + 1``
            (scale 1); ``min_lr`` is scaled alike. Typical values 0.65-0.75; ``null``: one learning
            rate for every layer. Mixed-RoPE frequencies are each block's own parameters and decay
            with their block (BEiT's rule, as freezing ``blocks:N`` freezes them with it); timm's
            Eva keeps them in one model-level tensor that learns at scale 1, up to
            ``layer_decay ** -depth`` times faster.
        clip_grad: max global gradient norm; ``null`` disables clipping.
        label_smoothing: target smoothing (also applied to mixed targets).
        mixup: Mixup alpha (0 disables); cutmix: CutMix alpha (0 disables).
        mixup_prob: probability of mixing a batch; mixup_switch_prob: of CutMix instead of Mixup.
        ema: keep an exponential moving average of the weights and evaluate/export it.
        ema_decay: EMA decay per step.
    """

    lr: float = field(default=1e-3, metadata=bounds(gt=0))
    weight_decay: float = field(default=0.05, metadata=bounds(ge=0))
    betas: tuple[float, float] = field(default=(0.9, 0.999), metadata=bounds(ge=0, lt=1))
    eps: float = field(default=1e-8, metadata=bounds(gt=0))
    warmup_epochs: float = field(default=0.0, metadata=bounds(ge=0))
    min_lr: float = field(default=1e-6, metadata=bounds(ge=0))
    layer_decay: float | None = field(default=None, metadata=bounds(gt=0, le=1))
    clip_grad: float | None = field(default=1.0, metadata=bounds(gt=0))
    label_smoothing: float = field(default=0.0, metadata=bounds(ge=0, lt=1))
    mixup: float = field(default=0.0, metadata=bounds(ge=0))
    cutmix: float = field(default=0.0, metadata=bounds(ge=0))
    mixup_prob: float = field(default=1.0, metadata=bounds(ge=0, le=1))
    mixup_switch_prob: float = field(default=0.5, metadata=bounds(ge=0, le=1))
    ema: bool = False
    ema_decay: float = field(default=0.9998, metadata=bounds(gt=0, lt=1))

    def validate(self) -> None:
        """``min_lr`` at most ``lr``."""
        if self.min_lr > self.lr:
            raise ValueError(f"optim.min_lr ({self.min_lr:g}) exceeds optim.lr ({self.lr:g}); lower min_lr.")

    @property
    def mixes(self) -> bool:
        """Whether batches are mixed (Mixup or CutMix)."""
        return (self.mixup > 0 or self.cutmix > 0) and self.mixup_prob > 0


@dataclass
class TrainerConfig(Config):
    """Lightning ``Trainer`` options and the loop's own.

    Attributes:
        max_epochs: training epochs.
        batch_size: images per device per step (global batch = batch_size x devices x num_nodes).
        precision: ``'32-true'``, ``'bf16-mixed'`` (CPU and GPU), ``'bf16-true'`` or ``'16-mixed'``
            (GPU only). ``'bf16-true'``: the training steps run a bfloat16 copy of the model (no
            autocast casts; :mod:`~vitkit.train.pure_bf16`) while the weights the optimiser updates,
            the EMA, checkpoints and the exported model stay float32; evaluation runs as under
            ``'bf16-mixed'``. One device, and the ``classify`` task only.
        accelerator: ``'auto'``, ``'cpu'``, ``'gpu'``, ``'cuda'`` or ``'mps'``.
        devices: device count, list of device ids, or ``'auto'``.
        num_nodes: machines (multi-node DDP).
        strategy: Lightning strategy (``'auto'``, ``'ddp'``, ``'fsdp'``, ...).
        seed: seeds Python, NumPy and torch (and dataloader workers).
        deterministic: ask torch for deterministic kernels (slower).
        log_every: log training metrics every this many steps.
        limit_train_batches / limit_val_batches / limit_test_batches: int batches or float fraction per epoch.
        checkpoint_every_n_steps: also write ``last.ckpt`` every this many steps (0: at epoch ends only).
        monitor: validation metric that selects ``best.ckpt`` (tested and exported): accuracies are
            maximised, the loss minimised. On a small validation set the loss ties less often.
            ``last``: the last epoch's weights (set by the run for an image folder too small to hold
            images out: validation then shows the training images).
        enable_progress_bar: Lightning's progress bar.
        num_sanity_val_steps: validation batches run before training to catch bugs early.
        num_threads: torch CPU threads (``torch.set_num_threads``); ``null`` keeps torch's default.
            Small models on a busy CPU train several times faster with 1 thread than with threads
            that wait for each other.
        compile: ``true``: ``torch.compile`` the model (inductor; needs a C++ compiler on CPUs).
            The first steps pay the compilation (``first_step_s`` in ``summary.json``).
            ``auto``: time compiled and eager training steps side by side once the attention
            kernel is chosen, and keep the faster (:mod:`vitkit.train.compile_trial`;
            ``summary.json`` ``compile``); eager under ``trainer.deterministic``.
        max_time_minutes: stop training after this many minutes (Lightning's ``max_time``), then
            test as usual; ``null``: no limit. A schedule it cuts short is noted at the end
            (``summary.json``'s ``schedule_note``): the learning rate had not decayed.
        time_budget_minutes: fit the run to this many minutes, all of it (setting up, training,
            the end-of-run test, k-NN and export): the first training steps are timed, then the
            epochs (whole ones) are planned so that the warm-up and the cosine schedule end with
            training, in place of ``max_epochs`` (:mod:`~vitkit.train.time_budget`; the plan is
            printed, kept in checkpoints for a resumed run and in ``summary.json``'s ``time_budget``).
            Not with ``max_time_minutes``.
        tta: test-time augmentation of validation and test (:data:`~vitkit.evaluation.TestTimeAugmentation`):
            ``'hflip'`` averages the class probabilities of each image and its mirror (twice the
            evaluation cost; needs a model trained with ``data.augment.hflip``); ``'hflip_shift'``
            adds both moved one pixel up, down, left and right (10 views; also needs
            ``data.augment.crop='pad'``). It is saved with the model, and ``vitkit evaluate`` and
            ``vitkit predict`` score that way too.
        val_tta: the test-time augmentation of validation alone (which picks ``best.ckpt``, every
            epoch); ``null``: ``tta``. A cheaper one keeps the epochs short when ``tta`` is
            ``'hflip_shift'``.
    """

    max_epochs: int = field(default=10, metadata=bounds(ge=1, le=MAX_EPOCHS))
    batch_size: int = field(default=128, metadata=bounds(ge=1, le=MAX_BATCH_SIZE))
    precision: Precision = "32-true"
    accelerator: Literal["auto", "cpu", "gpu", "cuda", "mps"] = "auto"
    devices: int | list[int] | Literal["auto"] = "auto"
    num_nodes: int = field(default=1, metadata=bounds(ge=1, le=MAX_DEVICES))
    strategy: str = "auto"
    seed: int = field(default=0, metadata=bounds(ge=0, le=2**32 - 1))
    deterministic: bool = False
    log_every: int = field(default=10, metadata=bounds(ge=1))
    limit_train_batches: int | float | None = field(default=None, metadata=bounds(gt=0))
    limit_val_batches: int | float | None = field(default=None, metadata=bounds(ge=0))
    limit_test_batches: int | float | None = field(default=None, metadata=bounds(gt=0))
    checkpoint_every_n_steps: int = field(default=500, metadata=bounds(ge=0))
    monitor: Literal["val/acc1", "val/acc5", "val/loss", "last"] = "val/acc1"
    enable_progress_bar: bool = True
    num_sanity_val_steps: int = field(default=2, metadata=bounds(ge=0))
    num_threads: int | None = field(default=None, metadata=bounds(ge=1, le=MAX_THREADS))
    compile: bool | Literal["auto"] = False
    max_time_minutes: float | None = field(default=None, metadata=bounds(gt=0))
    time_budget_minutes: float | None = field(default=None, metadata=bounds(gt=0))
    tta: TestTimeAugmentation = "none"
    val_tta: TestTimeAugmentation | None = None

    @property
    def lightning_precision(self) -> str:
        """The precision of Lightning's ``Trainer``: ``bf16-true`` runs under ``bf16-mixed``, whose
        autocast its evaluation and a teacher use (its training steps turn autocast off)."""
        return "bf16-mixed" if self.precision == "bf16-true" else self.precision

    def validate(self) -> None:
        """``devices``: a count in [1, MAX_DEVICES] or distinct ids in [0, MAX_DEVICES); what Lightning
        accepts for the batch limits (a fraction in (0, 1] or a count) and the strategy (its registry)."""
        if self.time_budget_minutes is not None and self.max_time_minutes is not None:
            raise FieldError(
                "time_budget_minutes", f"({self.time_budget_minutes:g}) and trainer.max_time_minutes "
                f"({self.max_time_minutes:g}) both limit the time: the budget plans the schedule to end in time, "
                "max_time cuts it wherever it is; keep one (trainer.max_time_minutes=null)."
            )
        for key in ("limit_train_batches", "limit_val_batches", "limit_test_batches"):
            value = getattr(self, key)
            if isinstance(value, float) and value > 1.0:
                raise FieldError(key, f"must be a fraction of the epoch in (0, 1] or a whole number of batches, got {value:g}.")
        strategies = ("auto", *StrategyRegistry.available_strategies())
        if self.strategy not in strategies:
            close = difflib.get_close_matches(self.strategy, strategies, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise FieldError(
                "strategy", f"must be a Lightning strategy ('auto', 'ddp', 'fsdp', ...), got {describe(self.strategy)}.{hint}"
            )
        if self.strategy.startswith("fsdp") and self.strategy != "fsdp":
            raise FieldError(
                "strategy", f"must be 'fsdp' to shard, got {self.strategy!r}: Lightning's FSDP1 variant, which "
                "vitkit does not train with; use trainer.strategy=fsdp (torch's FSDP2, sharded checkpoints, CPUs and GPUs)."
            )
        several = (isinstance(self.devices, int) and self.devices > 1) or (isinstance(self.devices, list) and len(self.devices) > 1)
        if self.precision == "bf16-true" and (self.strategy != "auto" or self.num_nodes > 1 or several):
            raise FieldError(
                "precision", f"is 'bf16-true', which trains on one device (its bfloat16 copy of the model is outside "
                f"what DDP and FSDP reduce), but trainer.strategy={self.strategy!r}, trainer.devices={self.devices!r} and "
                f"trainer.num_nodes={self.num_nodes}; use trainer.precision=bf16-mixed to train on several."
            )
        if self.strategy == "fsdp" and self.precision == "16-mixed":
            raise FieldError(
                "precision", "cannot be '16-mixed' with trainer.strategy=fsdp (Lightning's ModelParallelStrategy "
                "has no float16 loss scaling); use trainer.precision=bf16-mixed or 32-true."
            )
        devices = self.devices
        count_ok = isinstance(devices, int) and 1 <= devices <= MAX_DEVICES
        ids_ok = isinstance(devices, list) and 0 < len(set(devices)) == len(devices)
        if not (devices == "auto" or count_ok or (ids_ok and all(0 <= i < MAX_DEVICES for i in devices))):
            raise FieldError(
                "devices", f"must be 'auto', a device count in [1, {MAX_DEVICES}] or a list of distinct device ids "
                f"in [0, {MAX_DEVICES - 1}], got {describe(devices)}."
            )


@dataclass
class TeacherConfig(Config):
    """The teacher of a distilling run: a timm model trained first by the same command, a timm
    model with trained weights from a file, or a vitkit model file.

    Attributes:
        model: a timm model name (``resnet18``), built for the data (``pretrained=False``,
            ``in_chans`` and ``num_classes`` from the dataset) and trained for ``epochs`` first.
        model_kwargs: more keyword arguments of ``timm.create_model`` (timm's ``--model-kwargs``), e.g.
            ``{layers: [1, 1, 1, 1], channels: [16, 32, 64, 128], stem_width: 16}`` for a narrow ResNet-10.
        small_input_stem: replace a ResNet's stem (``conv1`` 7x7 stride 2, then ``maxpool``) with one
            3x3 stride-1 convolution and no pooling, as He et al.'s CIFAR ResNets (arXiv 1512.03385,
            section 4.2): a 28-pixel image then reaches the last stage at 4x4, not 1x1.
        file: a vitkit model file (``save_model``, e.g. another run's ``model.safetensors``); with
            ``model``, the weights of that timm teacher (another run's ``teacher.safetensors``), so
            several students distil from one teacher trained once.
        epochs: training epochs of a ``model`` teacher (AdamW, one-epoch warmup, cosine decay).
        lr: its peak learning rate.
        weight_decay: its AdamW weight decay.
        batch_size: its batch size.
    """

    model: str | None = None
    model_kwargs: dict[str, Any] = field(default_factory=dict)
    small_input_stem: bool = False
    file: str | None = None
    epochs: int = field(default=5, metadata=bounds(ge=1, le=MAX_EPOCHS))
    lr: float = field(default=2e-3, metadata=bounds(gt=0))
    weight_decay: float = field(default=0.05, metadata=bounds(ge=0))
    batch_size: int = field(default=128, metadata=bounds(ge=1, le=MAX_BATCH_SIZE))

    def validate(self) -> None:
        """A timm name timm knows, a file that exists."""
        if self.model is not None and not timm.is_model(self.model):
            close = difflib.get_close_matches(self.model, timm.list_models(), n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise FieldError("model", f"is no timm model: {describe(self.model)}.{hint}")
        if self.file is not None and not Path(self.file).is_file():
            raise FieldError("file", f"does not exist: {describe(self.file)}.")
        if self.file is not None and self.model is None and (self.model_kwargs or self.small_input_stem):
            raise FieldError(
                "file", "alone is a finished vitkit model: model_kwargs and small_input_stem only shape a timm teacher "
                "(give teacher.model too, to load a timm teacher's weights from the file)."
            )
        reserved = {"pretrained", "num_classes", "in_chans"} & set(self.model_kwargs)
        if reserved:
            raise FieldError(
                "model_kwargs", f"may not set {', '.join(sorted(reserved))}: the teacher is built untrained for the data."
            )


@dataclass
class DistillConfig(Config):
    """DeiT distillation (Touvron et al. 2020, arXiv 2012.12877; :mod:`vitkit.train.distill`).

    Attributes:
        type: ``'none'``, ``'hard'`` (the teacher's argmax as a second label) or ``'soft'``
            (KL divergence to the teacher's tempered softmax).
        alpha: weight of the distillation term; the label loss gets ``1 - alpha``.
        tau: softmax temperature of ``soft`` distillation.
        teacher: where the teacher comes from (:class:`TeacherConfig`); unused with ``type: none``.
    """

    type: Literal["none", "hard", "soft"] = "none"
    alpha: float = field(default=0.5, metadata=bounds(ge=0, le=1))
    tau: float = field(default=1.0, metadata=bounds(gt=0))
    teacher: TeacherConfig = field(default_factory=TeacherConfig)

    def validate(self) -> None:
        """A distilling run names its teacher."""
        if self.type != "none" and self.teacher.model is None and self.teacher.file is None:
            raise FieldError(
                "teacher",
                f"must name teacher.model (a timm model name), teacher.file (a vitkit model file) or both (a timm "
                f"teacher with another run's teacher.safetensors) "
                f"for distill.type={self.type!r}.",
            )


@dataclass
class OutputConfig(Config):
    """Where runs go: ``<dir>/<recipe name>/<timestamp>/``."""

    dir: str = "runs"


TaskName = Literal["classify", "dino", "mae"]
#: The lowest softmax temperature of DINO. The head's logits lie in [-1, 1] (an L2-normalised
#: feature through a last layer of unit-norm rows, as ``norm_last_layer`` keeps them and as they
#: start otherwise), so at 1e-3 they are at most 1,000 after division: finite in float16, and 40x
#: sharper than the paper's sharpest (0.04). Far below it 1/temperature overflows (1e-45 gives inf)
#: and the first loss is NaN.
MIN_TEMPERATURE = 1e-3


@dataclass
class DinoConfig(Config):
    """DINO self-distillation (Caron et al. 2021, arXiv 2104.14294; :mod:`vitkit.tasks.dino`);
    defaults are facebookresearch/dino's, except the head's sizes and the crops' (small images).

    Attributes:
        out_dim: the head's output dimension (the paper's 65536 for ImageNet).
        hidden_dim, bottleneck_dim, head_layers: the head's MLP (DINO's 2048, 256, 3).
        norm_last_layer: the head's last layer keeps weight norms of 1.
        teacher_momentum: the teacher's EMA momentum at the first step, raised to 1 on a cosine.
        student_temp: the student's temperature (every temperature at least :data:`MIN_TEMPERATURE`).
        teacher_temp: the teacher's temperature after its warm-up (0.04 to 0.07 work in the paper).
        warmup_teacher_temp, warmup_teacher_temp_epochs: its temperature at the start and the
            epochs of the linear warm-up (0: none).
        center_momentum: the EMA momentum of the teacher outputs' centre.
        freeze_last_layer_epochs: epochs in which the head's last layer does not learn.
        local_crops: local crops per image (besides the 2 global ones; 0: global crops only).
        global_size, local_size: sides of the crops in pixels (``null`` global: the data's
            ``img_size``); a size other than the model's needs ``model.dynamic_img_size``.
        global_scale, local_scale: ranges of the crops' area as a fraction of the image's.
    """

    out_dim: int = field(default=4096, metadata=bounds(ge=2, le=1 << 20))
    hidden_dim: int = field(default=2048, metadata=bounds(ge=1, le=1 << 16))
    bottleneck_dim: int = field(default=256, metadata=bounds(ge=1, le=1 << 16))
    head_layers: int = field(default=3, metadata=bounds(ge=1, le=16))
    norm_last_layer: bool = True
    teacher_momentum: float = field(default=0.996, metadata=bounds(ge=0, le=1))
    student_temp: float = field(default=0.1, metadata=bounds(ge=MIN_TEMPERATURE))
    teacher_temp: float = field(default=0.04, metadata=bounds(ge=MIN_TEMPERATURE))
    warmup_teacher_temp: float = field(default=0.04, metadata=bounds(ge=MIN_TEMPERATURE))
    warmup_teacher_temp_epochs: int = field(default=0, metadata=bounds(ge=0, le=MAX_EPOCHS))
    center_momentum: float = field(default=0.9, metadata=bounds(ge=0, le=1))
    freeze_last_layer_epochs: int = field(default=1, metadata=bounds(ge=0, le=MAX_EPOCHS))
    local_crops: int = field(default=6, metadata=bounds(ge=0, le=64))
    global_size: int | None = field(default=None, metadata=bounds(ge=1, le=8192))
    local_size: int = field(default=16, metadata=bounds(ge=1, le=8192))
    global_scale: tuple[float, float] = field(default=(0.4, 1.0), metadata=bounds(gt=0, le=1))
    local_scale: tuple[float, float] = field(default=(0.05, 0.4), metadata=bounds(gt=0, le=1))

    def validate(self) -> None:
        """Ordered scale ranges."""
        for key in ("global_scale", "local_scale"):
            low, high = getattr(self, key)
            if low > high:
                raise FieldError(key, f"must be a range (low, high) with low <= high, got ({low:g}, {high:g}).")

    def crop_sizes(self, model: ViTConfig) -> dict[str, int]:
        """The side of each crop the model sees, by option: ``global_size`` (``null``: the model's
        ``img_size``, which is the data's) and, with local crops, ``local_size``."""
        global_size = self.global_size or model.img_size[0]
        return {"global_size": global_size, **({"local_size": self.local_size} if self.local_crops else {})}

    def check_model(self, model: ViTConfig) -> None:
        """Crops the model can take (a multiple of its patch size, within :data:`MAX_TOKENS`
        patches, its own ``img_size`` unless ``dynamic_img_size``), and a student and teacher
        (backbone and head each) within :data:`MAX_PARAMETERS`.

        Raises:
            FieldError: keyed by the recipe key (``task.dino.*``).
        """
        for key, size in self.crop_sizes(model).items():
            if any(size % p for p in model.patch_size):
                raise FieldError(f"task.dino.{key}", f"is {size}, not a multiple of the model's patch size {model.patch_size[0]}.")
            tokens = (size // model.patch_size[0]) * (size // model.patch_size[1])
            if tokens > MAX_TOKENS:
                raise FieldError(
                    f"task.dino.{key}", f"is {size}: {tokens:,} patches of {model.patch_size[0]} pixels, more than the "
                    f"limit of {MAX_TOKENS:,}; use smaller crops or a larger model.patch_size."
                )
            if (size, size) != tuple(model.img_size) and not model.dynamic_img_size:
                raise FieldError(
                    f"task.dino.{key}", f"is {size}, not the model's img_size {model.img_size[0]}: set "
                    "model.dynamic_img_size=true (the position embedding is resampled to each crop's grid)."
                )
        head = head_weights(model.embed_dim, self.out_dim, hidden_dim=self.hidden_dim, bottleneck_dim=self.bottleneck_dim,
                            layers=self.head_layers)
        if 2 * (head + model.num_weights()) > MAX_PARAMETERS:
            last_layer = (self.bottleneck_dim + 1) * self.out_dim
            key = "out_dim" if 2 * last_layer > head else "hidden_dim"  # the option behind most of the weights
            raise FieldError(
                f"task.dino.{key}", f"is {getattr(self, key)} (out_dim {self.out_dim}, hidden_dim {self.hidden_dim}, "
                f"bottleneck_dim {self.bottleneck_dim}, head_layers {self.head_layers}): a head of about {head:.3g} weights, which "
                f"twice (student and teacher) with the backbone's exceeds the limit of {MAX_PARAMETERS:.3g}; shrink "
                "the head (DINO's is 2048 hidden, 256 bottleneck, 3 layers)."
            )


@dataclass
class MaeConfig(Config):
    """Masked-autoencoder pre-training (He et al. 2021, arXiv 2111.06377; :mod:`vitkit.tasks.mae`).

    Attributes:
        mask_ratio: share of each image's patches hidden from the encoder (the paper's 0.75).
        decoder_depth: blocks of the decoder (the paper's 8 for ViT-L; a light one suffices).
        decoder_dim: width of the decoder's tokens (divisible by 4 and by ``decoder_heads``).
        decoder_heads: attention heads of the decoder.
        norm_pix_loss: predict each patch's pixels normalised by its own mean and variance.
    """

    mask_ratio: float = field(default=0.75, metadata=bounds(gt=0, lt=1))
    decoder_depth: int = field(default=2, metadata=bounds(ge=1, le=MAX_DEPTH))
    decoder_dim: int = field(default=128, metadata=bounds(ge=4, le=65536))
    decoder_heads: int = field(default=4, metadata=bounds(ge=1, le=4096))
    norm_pix_loss: bool = True

    def validate(self) -> None:
        """A width the heads and the sin-cos embedding divide."""
        if self.decoder_dim % 4 or self.decoder_dim % self.decoder_heads:
            raise FieldError(
                "decoder_dim", f"must be divisible by 4 (its sin-cos position embedding) and by decoder_heads "
                f"({self.decoder_heads}), got {self.decoder_dim}."
            )

    def check_model(self, model: ViTConfig) -> None:
        """What these options need of the encoder ``model`` (:func:`~vitkit.tasks.mae.check_encoder`),
        and a decoder that, with the encoder, stays within :data:`~vitkit.models.config.MAX_PARAMETERS`.

        Raises:
            FieldError: keyed by the recipe key (``model.patch_embed``, ``task.mae.*``).
        """
        try:
            check_encoder(model, self.norm_pix_loss)
        except FieldError as error:
            raise FieldError(f"task.mae.{error.key}" if error.key == "norm_pix_loss" else f"model.{error.key}",
                             error.problem) from None
        decoder = decoder_weights(model.embed_dim, patch_pixels(model), dim=self.decoder_dim, depth=self.decoder_depth)
        if decoder + model.num_weights() > MAX_PARAMETERS:
            raise FieldError(
                "task.mae.decoder_dim", f"is {self.decoder_dim} with decoder_depth {self.decoder_depth}: a decoder of "
                f"about {decoder:.3g} weights, which with the encoder's exceeds the limit of {MAX_PARAMETERS:.3g}; "
                "lower task.mae.decoder_dim or decoder_depth (MAE's light decoders have a few million)."
            )


@dataclass
class TaskConfig(Config):
    """The training objective (:mod:`vitkit.tasks`).

    Attributes:
        name: ``classify``: supervised classification on the data's labels (with the ``optim``
            section's Mixup, CutMix and label smoothing and the ``distill`` section's teacher);
            ``dino``: DINO self-distillation of a headless encoder, labels unused (``dino``);
            ``mae``: masked-autoencoder pre-training of a headless encoder, labels unused (``mae``).
        dino: the ``dino`` task's options (:class:`DinoConfig`).
        mae: the ``mae`` task's options (:class:`MaeConfig`).
        knn_every: a pre-training task also measures the weighted k-NN accuracy of the encoder's
            features (:mod:`vitkit.train.pretraining`) every this many epochs (``null``: at the end only).
        linear_probe: a pre-training task also fits a linear classifier on the encoder's frozen
            features at the end (``summary.json``'s ``linear_probe_acc1``; seconds, labels used for it only).
        knn_root: a labelled image folder (class folders) for those measurements instead of the
            training data's labels: a flat folder of unlabelled images gets a quality number too.
    """

    name: TaskName = "classify"
    dino: DinoConfig = field(default_factory=DinoConfig)
    mae: MaeConfig = field(default_factory=MaeConfig)
    knn_every: int | None = field(default=None, metadata=bounds(ge=1, le=MAX_EPOCHS))
    linear_probe: bool = False
    knn_root: str | None = None

    def check_model(self, model: ViTConfig) -> None:
        """What the task's options need of the model it trains (built from the recipe's
        ``model`` section and the data).

        Raises:
            FieldError: keyed by the recipe key to change.
        """
        if self.name == "mae":
            self.mae.check_model(model)
        elif self.name == "dino":
            self.dino.check_model(model)

    @property
    def pretrains(self) -> bool:
        """Whether the task learns without labels (its model is a headless encoder)."""
        return self.name != "classify"

    def validate(self) -> None:
        """Options of a task the recipe does not run would be ignored: refused.

        Raises:
            FieldError: one line naming them.
        """
        unused = [f"task.{key}" for key, default in (("dino", DinoConfig()), ("mae", MaeConfig()))
                  if key != self.name and getattr(self, key) != default]
        if not self.pretrains:
            unused += [f"task.{key}" for key in ("knn_every", "linear_probe", "knn_root") if getattr(self, key) not in (None, False)]
        if unused:
            raise FieldError(
                "name", f"is {self.name!r}, which does not read {', '.join(unused)}: remove those options, or set "
                "task.name to the task they configure."
            )


def classification_options(config: RecipeConfig) -> list[str]:
    """The options ``config`` sets that only a classification task uses (``optim.mixup=0.8``, ...)."""
    optim, trainer, model = config.optim, config.trainer, config.model
    found = [f"optim.{key}={getattr(optim, key):g}" for key in ("mixup", "cutmix", "label_smoothing") if getattr(optim, key) > 0]
    found += [f"distill.type={config.distill.type}"] if config.distill.type != "none" else []
    found += [f"trainer.{key}={getattr(trainer, key)}" for key in ("tta", "val_tta") if getattr(trainer, key) not in (None, "none")]
    found += [f"trainer.monitor={trainer.monitor} (use val/loss or last)"] if trainer.monitor not in ("val/loss", "last") else []
    found += [f"model.reset_head={model.reset_head}"] if model.reset_head is not None else []
    found += ["model.lora"] if model.lora is not None else []
    found += [f"model.freeze={model.freeze}"] if model.freeze != "none" else []
    return found


@dataclass
class RecipeConfig(Config):
    """A whole training recipe. ``name`` defaults to the recipe file's stem."""

    name: str = "recipe"
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    output: OutputConfig = field(default_factory=OutputConfig)
    distill: DistillConfig = field(default_factory=DistillConfig)
    task: TaskConfig = field(default_factory=TaskConfig)

    def validate(self) -> None:
        """The name is one folder name (runs stay inside ``output.dir``); Mixup pairs need an even
        batch; mirrored test views need a model trained on mirrored images; no weight EMA under FSDP."""
        if not self.name or self.name in (".", "..") or "/" in self.name or "\\" in self.name:
            raise FieldError(
                "name", f"must be a single folder name (the run goes to output.dir/<name>/), got {describe(self.name)}."
            )
        if self.optim.mixes and self.trainer.batch_size % 2:
            raise ValueError(
                f"Mixup/CutMix pairs images within a batch, so trainer.batch_size must be even, "
                f"got {self.trainer.batch_size}."
            )
        for key in ("tta", "val_tta"):
            self._check_tta_was_trained(key, getattr(self.trainer, key))
        if self.optim.ema and self.trainer.strategy.startswith("fsdp"):
            raise FieldError(
                "optim.ema",
                f"cannot be used with trainer.strategy={self.trainer.strategy}: the average would be a whole, "
                "unsharded copy of the model on every rank, which FSDP is there to avoid; train with "
                "trainer.strategy=ddp to keep the EMA, or set optim.ema=false.",
            )
        if self.trainer.precision == "bf16-true" and self.task.name != "classify":
            raise FieldError(
                "trainer.precision", f"is 'bf16-true', which runs the classifier's forward in bfloat16, but task.name is "
                f"{self.task.name!r}, whose own layers take the encoder's features: use trainer.precision=bf16-mixed."
            )
        if self.task.pretrains:
            self._check_pretraining()
        if self.model.freeze != "none" and self.model.pretrained is None:  # frozen random weights would never learn
            raise FieldError(
                "model.freeze", "only applies to pretrained weights: set model.pretrained too (a model file or timm:NAME)."
            )

    def schedule_notes(self) -> list[str]:
        """One ``note:`` line for each schedule as long as the run (``trainer.max_epochs``) or longer:
        the learning rate's warm-up, and DINO's frozen last layer and teacher-temperature warm-up."""
        epochs, optim, dino = self.trainer.max_epochs, self.optim, self.task.dino
        notes = [f"optim.warmup_epochs={optim.warmup_epochs:g} is as long as the run (trainer.max_epochs={epochs}) or "
                 f"longer: the learning rate rises all along (to optim.lr={optim.lr:g} at epoch {optim.warmup_epochs:g}) and never decays"] \
            if optim.warmup_epochs >= epochs else []
        if self.task.name == "dino" and dino.freeze_last_layer_epochs >= epochs:
            notes.append(f"task.dino.freeze_last_layer_epochs={dino.freeze_last_layer_epochs} is as long as the run "
                         f"(trainer.max_epochs={epochs}) or longer: the head's last layer never learns")
        if self.task.name == "dino" and dino.warmup_teacher_temp_epochs > epochs:
            notes.append(f"task.dino.warmup_teacher_temp_epochs={dino.warmup_teacher_temp_epochs} is longer than the run "
                         f"(trainer.max_epochs={epochs}): the teacher never reaches teacher_temp={dino.teacher_temp:g}")
        return [f"note: {note}." for note in notes]

    def _check_pretraining(self) -> None:
        """A pre-training task sets no classification option, and MAE runs on vitkit's own model.

        Raises:
            FieldError: one line naming every such option.
        """
        found = dino_conflicts(self) if self.task.name == "dino" else classification_options(self)
        if found:
            raise FieldError(
                "task.name", f"is {self.task.name!r}, which pre-trains without labels, but the recipe sets "
                f"classification options: {', '.join(found)}; remove them (they apply when fine-tuning the encoder) or "
                f"start from a pre-training recipe (recipes/{self.task.name}_fashion_mnist.yaml)."
            )
        if self.task.name == "dino" and self.data.augment.enabled:
            raise FieldError(
                "data.augment.enabled", "is true, but DINO trains on its own multi-crop views, never on data.augment's: "
                "set data.augment.enabled=false, and shape the views with task.dino's local_crops, global_size, "
                "local_size, global_scale and local_scale."
            )
        if self.task.name == "mae" and self.trainer.strategy == "fsdp":
            raise FieldError(
                "trainer.strategy", "is 'fsdp', but MAE encodes through forward_features, and FSDP gathers a "
                "sharded model's weights for its forward only; pre-train with trainer.strategy=ddp."
            )
        if self.task.name == "mae" and self.model.impl != "vitkit":
            raise FieldError(
                "model.impl", f"is {self.model.impl!r}, but MAE runs the encoder on the visible patches only, which "
                "vitkit's model does (forward_features(keep=)): set model.impl=vitkit."
            )

    def _check_tta_was_trained(self, key: str, tta: TestTimeAugmentation | None) -> None:
        """``trainer.<key>`` scores only views the recipe's augmentation trains on.

        Raises:
            FieldError: it scores mirrors the model never saw, or moved copies without ``crop='pad'``.
        """
        if tta in (None, "none"):
            return
        data = self.data.resolved()
        if not (data.augment.enabled and data.augment.hflip):
            raise FieldError(
                f"trainer.{key}",
                f"is {tta!r}, which scores each image with its mirror, but this recipe trains {data.name} without mirrored "
                "images (data.augment.hflip is 0 or augmentation is off), so the mirror is an image the model "
                f"never saw: set data.augment.hflip=0.5, or trainer.{key}=none.",
            )
        if tta == "hflip_shift" and not (data.augment.crop == "pad" and data.augment.padding >= 1):
            raise FieldError(
                f"trainer.{key}",
                f"is 'hflip_shift', which scores copies moved by one pixel, but this recipe trains {data.name} "
                f"without shifted images (data.augment.crop is {data.augment.crop!r}, padding {data.augment.padding}): "
                f"set data.augment.crop=pad with data.augment.padding of 1 or more, or trainer.{key}=hflip.",
            )

    def vit_config(self, **data_fields: Any) -> ViTConfig:
        """The model's :class:`ViTConfig`: variant + overrides + ``data_fields`` (img_size, in_chans,
        num_classes from the dataset)."""
        return model_config(self.model.variant, **self.model.vit_overrides(), **data_fields)

    def to_dict(self) -> dict[str, Any]:
        """Plain nested dict (saved as the run's ``config.yaml`` and in checkpoints); model fields
        left unset are omitted."""
        values = super().to_dict()
        values["model"] = {key: value for key, value in values["model"].items() if value is not None}
        return values


def dino_conflicts(config: RecipeConfig) -> list[str]:
    """The options ``config`` sets that a ``dino`` task cannot take (``optim.mixup=0.8``, ...):
    classification's, and those DINO's teacher makes pointless or impossible."""
    optim, trainer, model = config.optim, config.trainer, config.model
    found = classification_options(config)
    found += ["optim.ema=true (the teacher is the average DINO keeps and releases)"] if optim.ema else []
    found += [f"model.impl={model.impl} (DINO trains vitkit's model)"] if model.impl != "vitkit" else []
    found += ["trainer.strategy=fsdp (the teacher is not sharded)"] if trainer.strategy.startswith("fsdp") else []
    return found


def timm_twin_overrides(config: RecipeConfig) -> list[str]:
    """The recipe overrides (``model.patch_embed=linear``, ...) that turn the recipe's model into
    one timm's twin expresses exactly (:func:`~vitkit.models.timm_twin_lacks`); empty when it
    already is. A recipe starting from pretrained weights has its architecture from them: empty."""
    if config.model.pretrained is not None:
        return []
    vit_config = config.vit_config(img_size=config.data.resolved_img_size(), in_chans=config.data.resolved_in_chans())
    return fix_overrides(timm_twin_lacks(vit_config), "model.")


def load_recipe(
    recipe: str | Path | dict[str, Any] | RecipeConfig, overrides: typing.Iterable[str] = ()
) -> RecipeConfig:
    """Read and validate a recipe before any work starts.

    Args:
        recipe: a YAML file, the name of a shipped recipe (``"quickstart"``,
            :func:`~vitkit.recipe_files.find_recipe`), an equivalent dict, or a :class:`RecipeConfig`.
        overrides: dotted ``key=value`` strings applied on top (``trainer.max_epochs=5``).

    Raises:
        RecipeError: a missing/unreadable file, an unknown key (with the closest valid one),
            a wrong type, an out-of-range value or an inconsistent model.
    """
    if isinstance(recipe, RecipeConfig):
        recipe = recipe.to_dict()
    if isinstance(recipe, dict):
        source, values = "the recipe dict", recipe
    else:
        path = find_recipe(recipe)
        source = str(path)
        values = _read_yaml(path)
        values.setdefault("name", path.stem)
    updates, override_keys = parse_overrides(overrides, error=RecipeError)
    values = epochs_over_budget(merge(values, updates), override_keys)
    config = build(RecipeConfig, values, source=source, all_keys=dotted_keys(RecipeConfig),
                   override_keys=override_keys, error=RecipeError)
    if config.model.pretrained is not None:  # the weights fix the model: checked as it is built (model_builder)
        return config
    try:
        vit_config = config.vit_config(img_size=config.data.resolved_img_size(), in_chans=config.data.resolved_in_chans())
    except FieldError as error:  # a ViTConfig range: name the recipe key that set it
        key = f"{'data' if error.key in DATA_DRIVEN_FIELDS else 'model'}.{error.key}"
        origin = "a command-line override" if key in override_keys else source
        raise RecipeError(f"{key} in {origin} {error.problem}") from None
    except ValueError as error:
        raise RecipeError(f"invalid model section in {source}: {error}") from None
    try:
        config.task.check_model(vit_config)
    except FieldError as error:
        origin = "a command-line override" if error.key in override_keys else source
        raise RecipeError(f"{error.key} in {origin} {error.problem}") from None
    gaps = timm_twin_lacks(vit_config) if config.model.impl == "timm" else []
    if gaps:
        raise RecipeError(f"model.impl=timm in {source}: {twin_gaps_message(vit_config, gaps, 'model.')}.")
    return config


def epochs_over_budget(values: dict[str, Any], override_keys: typing.Collection[str]) -> dict[str, Any]:
    """``values`` (a recipe with its command line merged) with the recipe's time budget switched off,
    with a note, when the command line sets ``trainer.max_epochs``: as in Lightning, the line's epochs
    are the run's. Both on the line are refused (the budget would replace the epochs).

    Raises:
        RecipeError: ``trainer.max_epochs`` and ``trainer.time_budget_minutes`` both given on the line.
    """
    trainer = values.get("trainer") or {}
    budget = trainer.get("time_budget_minutes")
    if "trainer.max_epochs" not in override_keys or budget is None:
        return values
    if "trainer.time_budget_minutes" in override_keys:
        raise RecipeError(f"trainer.max_epochs={trainer['max_epochs']} and trainer.time_budget_minutes={budget} both "
                          "set the run's length (the budget plans the epochs); give one.")
    logging.getLogger(__name__).warning(
        "note: trainer.max_epochs=%s on the command line: the recipe's trainer.time_budget_minutes=%s is switched off "
        "(set trainer.time_budget_minutes on the line instead to plan the epochs to a budget).", trainer["max_epochs"], budget)
    return merge(values, {"trainer": {"time_budget_minutes": None}})


def _read_yaml(path: Path) -> dict[str, Any]:
    """The recipe file's mapping; refuses a missing, unreadable, empty, non-YAML or absurdly large file."""
    if not path.is_file():
        names = shipped_recipes()
        close = difflib.get_close_matches(path.stem, names, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise RecipeError(
            f"recipe file {path} does not exist; give a YAML file or a shipped recipe's name ({', '.join(names)}; "
            f"vitkit recipes describes them).{hint}"
        )
    try:
        values = load_yaml(path.read_text(encoding="utf-8"), source=f"recipe file {path}", error=RecipeError)
    except UnicodeDecodeError:
        raise RecipeError(f"recipe file {path} is not UTF-8 text; is it really a YAML recipe?") from None
    except (yaml.YAMLError, RecursionError) as error:
        reason = "is nested too deeply" if isinstance(error, RecursionError) else f"is not valid YAML: {_yaml_problem(error)}"
        raise RecipeError(f"recipe file {path} {reason}") from None
    if values is None:
        raise RecipeError(
            f"recipe file {path} is empty; give at least the sections to change (e.g. 'trainer: {{max_epochs: 5}}'), "
            "or start from a shipped recipe (vitkit recipes lists them)."
        )
    if not isinstance(values, dict):
        raise RecipeError(f"recipe file {path} must hold a mapping of sections (model, data, optim, trainer, output).")
    return values


def _yaml_problem(error: yaml.YAMLError) -> str:
    """PyYAML's error on one line: what is wrong and where (its own message quotes the line, on four)."""
    if isinstance(error, yaml.MarkedYAMLError) and error.problem:
        mark = error.problem_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        return f"{error.problem}{where}" + (" (recipes are plain YAML: no tags such as !!python/object)"
                                            if "constructor for the tag" in error.problem else "")
    return " ".join(str(error).split())


def save_recipe(config: RecipeConfig, path: str | Path) -> None:
    """Write the resolved recipe as YAML (loadable again with :func:`load_recipe`)."""
    text = yaml.safe_dump(config.to_dict(), sort_keys=False)
    atomic_write(path, lambda tmp: Path(tmp).write_text(text))
