"""The recipe schema: :class:`RecipeConfig` with its ``model``, ``data``, ``optim``, ``trainer``
and ``output`` sections, and :func:`load_recipe` (YAML file or dict, plus dotted overrides).

The ``model`` section is generated from :class:`~vitkit.models.ViTConfig`: ``name`` (a variant
of :func:`vitkit.list_models`), ``grad_checkpointing``, and any ViTConfig field to override,
except ``img_size``, ``in_chans`` and ``num_classes``, which always come from the data.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from ..data import DataConfig
from ..io import atomic_write
from ..models import ViTConfig, model_config
from .schema import RecipeError, bounds, build, dotted_keys, merge, parse_overrides, to_plain

#: ViTConfig fields set from the dataset rather than the recipe.
DATA_DRIVEN_FIELDS = ("img_size", "in_chans", "num_classes")

Precision = Literal["32-true", "bf16-mixed", "16-mixed"]
ModelImpl = Literal["vitkit", "timm"]


def _model_section() -> type:
    """``ModelConfig``: ``name``, ``grad_checkpointing``, ``impl`` (``'vitkit'``, or ``'timm'`` to
    train timm's ``VisionTransformer`` of the same shape as a reference) and every ViTConfig field
    as an optional override (``None`` keeps the variant's value)."""
    vit_hints = typing.get_type_hints(ViTConfig)
    overrides = [
        (f.name, vit_hints[f.name] | None, field(default=None))
        for f in dataclasses.fields(ViTConfig)
        if f.name not in DATA_DRIVEN_FIELDS + ("extra",)
    ]

    def vit_overrides(self) -> dict[str, Any]:
        """The ViTConfig fields this recipe sets."""
        return {name: getattr(self, name) for name, _, _ in overrides if getattr(self, name) is not None}

    return dataclasses.make_dataclass(
        "ModelConfig",
        [("name", str, field(default="vit_cifar_tiny")), ("grad_checkpointing", bool, field(default=False)),
         ("impl", ModelImpl, field(default="vitkit")), *overrides],
        namespace={"vit_overrides": vit_overrides, "__module__": __name__,
                   "__doc__": "Which variant to build and the ViTConfig fields to override."},
    )


ModelConfig = _model_section()


@dataclass
class OptimConfig:
    """AdamW, a per-iteration linear-warmup + cosine schedule, and the loss's regularisers.

    Attributes:
        lr: peak learning rate (reached after warmup), for ``trainer.batch_size`` per device.
        weight_decay: AdamW decoupled decay; norms, biases, ``pos_embed`` and ``cls_token`` get none.
        betas: AdamW betas.
        eps: AdamW epsilon.
        warmup_epochs: linear warmup length (fractions allowed).
        min_lr: learning rate at the end of the cosine decay.
        clip_grad: max global gradient norm; ``null`` disables clipping.
        label_smoothing: target smoothing (also applied to mixed targets).
        mixup: Mixup alpha (0 disables); cutmix: CutMix alpha (0 disables).
        mixup_prob: probability of mixing a batch; mixup_switch_prob: of CutMix instead of Mixup.
        ema: keep an exponential moving average of the weights and evaluate/export it.
        ema_decay: EMA decay per step.
    """

    lr: float = field(default=1e-3, metadata=bounds(gt=0))
    weight_decay: float = field(default=0.05, metadata=bounds(ge=0))
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = field(default=1e-8, metadata=bounds(gt=0))
    warmup_epochs: float = field(default=0.0, metadata=bounds(ge=0))
    min_lr: float = field(default=1e-6, metadata=bounds(ge=0))
    clip_grad: float | None = field(default=1.0, metadata=bounds(gt=0))
    label_smoothing: float = field(default=0.0, metadata=bounds(ge=0, lt=1))
    mixup: float = field(default=0.0, metadata=bounds(ge=0))
    cutmix: float = field(default=0.0, metadata=bounds(ge=0))
    mixup_prob: float = field(default=1.0, metadata=bounds(ge=0, le=1))
    mixup_switch_prob: float = field(default=0.5, metadata=bounds(ge=0, le=1))
    ema: bool = False
    ema_decay: float = field(default=0.9998, metadata=bounds(gt=0, lt=1))

    def __post_init__(self) -> None:
        if not all(0.0 <= beta < 1.0 for beta in self.betas):
            raise ValueError(f"optim.betas must lie in [0, 1), got {list(self.betas)}.")
        if self.min_lr > self.lr:
            raise ValueError(f"optim.min_lr ({self.min_lr:g}) exceeds optim.lr ({self.lr:g}); lower min_lr.")

    @property
    def mixes(self) -> bool:
        """Whether batches are mixed (Mixup or CutMix)."""
        return (self.mixup > 0 or self.cutmix > 0) and self.mixup_prob > 0


@dataclass
class TrainerConfig:
    """Lightning ``Trainer`` options and the loop's own.

    Attributes:
        max_epochs: training epochs.
        batch_size: images per device per step (global batch = batch_size x devices x num_nodes).
        precision: ``'32-true'``, ``'bf16-mixed'`` (CPU and GPU) or ``'16-mixed'`` (GPU only).
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
        enable_progress_bar: Lightning's progress bar.
        num_sanity_val_steps: validation batches run before training to catch bugs early.
        num_threads: torch CPU threads (``torch.set_num_threads``); ``null`` keeps torch's default.
            Small models on a busy CPU train several times faster with 1 thread than with threads
            that wait for each other.
        compile: ``torch.compile`` the model (inductor; needs a C++ compiler on CPUs). The first
            steps pay the compilation (``first_step_s`` in ``summary.json``).
        max_time_minutes: stop training after this many minutes (Lightning's ``max_time``), then
            test as usual; ``null``: no limit.
    """

    max_epochs: int = field(default=10, metadata=bounds(ge=1))
    batch_size: int = field(default=128, metadata=bounds(ge=1))
    precision: Precision = "32-true"
    accelerator: Literal["auto", "cpu", "gpu", "cuda", "mps"] = "auto"
    devices: int | list[int] | str = "auto"
    num_nodes: int = field(default=1, metadata=bounds(ge=1))
    strategy: str = "auto"
    seed: int = 0
    deterministic: bool = False
    log_every: int = field(default=10, metadata=bounds(ge=1))
    limit_train_batches: int | float | None = field(default=None, metadata=bounds(gt=0))
    limit_val_batches: int | float | None = field(default=None, metadata=bounds(ge=0))
    limit_test_batches: int | float | None = field(default=None, metadata=bounds(gt=0))
    checkpoint_every_n_steps: int = field(default=500, metadata=bounds(ge=0))
    monitor: Literal["val/acc1", "val/acc5", "val/loss"] = "val/acc1"
    enable_progress_bar: bool = True
    num_sanity_val_steps: int = field(default=2, metadata=bounds(ge=0))
    num_threads: int | None = field(default=None, metadata=bounds(ge=1))
    compile: bool = False
    max_time_minutes: float | None = field(default=None, metadata=bounds(gt=0))

    def __post_init__(self) -> None:
        if isinstance(self.devices, str) and self.devices != "auto" and not self.devices.lstrip("-").isdigit():
            raise ValueError(f"trainer.devices must be 'auto', a count or a list of ids, got {self.devices!r}.")


@dataclass
class OutputConfig:
    """Where runs go: ``<dir>/<recipe name>/<timestamp>/``."""

    dir: str = "runs"


@dataclass
class RecipeConfig:
    """A whole training recipe. ``name`` defaults to the recipe file's stem."""

    name: str = "recipe"
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    output: OutputConfig = field(default_factory=OutputConfig)

    def __post_init__(self) -> None:
        if self.optim.mixes and self.trainer.batch_size % 2:
            raise ValueError(
                f"Mixup/CutMix pairs images within a batch, so trainer.batch_size must be even, "
                f"got {self.trainer.batch_size}."
            )

    def vit_config(self, **data_fields: Any) -> ViTConfig:
        """The model's :class:`ViTConfig`: variant + overrides + ``data_fields`` (img_size, in_chans,
        num_classes from the dataset)."""
        return model_config(self.model.name, **self.model.vit_overrides(), **data_fields)

    def to_dict(self) -> dict[str, Any]:
        """Plain nested dict (saved as the run's ``config.yaml`` and in checkpoints); model fields
        left unset are omitted."""
        values = to_plain(self)
        values["model"] = {key: value for key, value in values["model"].items() if value is not None}
        return values


def load_recipe(
    recipe: str | Path | dict[str, Any] | RecipeConfig, overrides: typing.Iterable[str] = ()
) -> RecipeConfig:
    """Read and validate a recipe before any work starts.

    Args:
        recipe: a YAML file, an equivalent dict, or a :class:`RecipeConfig`.
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
        path = Path(recipe)
        source = str(path)
        values = _read_yaml(path)
        values.setdefault("name", path.stem)
    updates, override_keys = parse_overrides(overrides)
    values = merge(values, updates)
    config = build(RecipeConfig, values, source=source, all_keys=dotted_keys(RecipeConfig), override_keys=override_keys)
    try:
        vit_config = config.vit_config(img_size=config.data.resolved_img_size(), in_chans=config.data.resolved_in_chans())
    except ValueError as error:
        raise RecipeError(f"invalid model section in {source}: {error}") from None
    if config.model.impl == "timm" and (vit_config.shifted_patches or vit_config.locality_attention):
        raise RecipeError(
            f"model.impl=timm in {source}: timm's VisionTransformer has no shifted patch tokenization or locality "
            "self-attention; also set model.shifted_patches=false model.locality_attention=false."
        )
    return config


def _read_yaml(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise RecipeError(
            f"recipe file {path} does not exist; recipes live in recipes/*.yaml (e.g. recipes/quickstart.yaml)."
        )
    try:
        values = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as error:
        raise RecipeError(f"recipe file {path} is not valid YAML: {error}") from None
    if not isinstance(values, dict):
        raise RecipeError(f"recipe file {path} must hold a mapping of sections (model, data, optim, trainer, output).")
    return values


def save_recipe(config: RecipeConfig, path: str | Path) -> None:
    """Write the resolved recipe as YAML (loadable again with :func:`load_recipe`)."""
    text = yaml.safe_dump(config.to_dict(), sort_keys=False)
    atomic_write(path, lambda tmp: Path(tmp).write_text(text))
