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

import yaml
from lightning.pytorch.strategies import StrategyRegistry

from ..data import DataConfig
from ..evaluation import TestTimeAugmentation
from ..files import atomic_write
from ..models import ViTConfig, model_config
from ..models.timm_interop import fix_overrides, timm_twin_lacks, twin_gaps_message
from ..recipe_files import find_recipe, shipped_recipes
from ..schema import (
    MAX_BATCH_SIZE,
    MAX_EPOCHS,
    Config,
    FieldError,
    RecipeError,
    bounds,
    build,
    describe,
    dotted_keys,
    load_yaml,
    merge,
    parse_overrides,
)
from ..tasks import Task
from .distill import DistillConfig
from .model_config import DATA_DRIVEN_FIELDS, ModelConfig
from .optim import OptimConfig
from .task_config import TaskConfig

Precision = Literal["32-true", "bf16-mixed", "bf16-true", "16-mixed"]

#: Generous but finite limits of the trainer section (its epochs and batch: :mod:`vitkit.schema`'s).
MAX_DEVICES = 1024
MAX_THREADS = 1024


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
            ``'bf16-mixed'``. One device, and a task whose step runs the model alone
            (:attr:`~vitkit.tasks.Task.pure_bf16`: ``classify``).
        accelerator: ``'auto'``, ``'cpu'``, ``'gpu'``, ``'cuda'`` or ``'mps'``.
        devices: device count, list of device ids, or ``'auto'``.
        num_nodes: machines (multi-node DDP).
        strategy: Lightning strategy (``'auto'``, ``'ddp'``, ``'fsdp'``, ...).
        seed: seeds Python, NumPy and torch (and dataloader workers).
        deterministic: ask torch for deterministic kernels (slower).
        log_every: log training metrics every this many steps.
        limit_train_batches / limit_val_batches / limit_test_batches: int batches or float fraction per epoch.
        checkpoint_every_n_steps: also write ``last.ckpt`` every this many steps (0: at epoch ends only).
        monitor: validation metric that selects ``best.ckpt`` (tested and exported), one the task
            logs (:attr:`~vitkit.tasks.Task.monitors`: classification's ``val/acc1``, ``val/acc5`` and
            ``val/loss``, maximised or minimised as the task says); ``null``: the task's own
            (:attr:`~vitkit.tasks.Task.monitor`). On a small validation set the loss ties less often.
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
    monitor: str | None = None
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
class OutputConfig(Config):
    """Where runs go: ``<dir>/<recipe name>/<timestamp>/``."""

    dir: str = "runs"


def labelled_options(config: RecipeConfig) -> list[str]:
    """The options ``config`` sets that only a task learning from labels uses (``optim.mixup=0.8``, ...)."""
    optim, trainer, model = config.optim, config.trainer, config.model
    found = [f"optim.{key}={getattr(optim, key):g}" for key in ("mixup", "cutmix", "label_smoothing") if getattr(optim, key) > 0]
    found += [f"distill.type={config.distill.type}"] if config.distill.type != "none" else []
    found += [f"trainer.{key}={getattr(trainer, key)}" for key in ("tta", "val_tta") if getattr(trainer, key) not in (None, "none")]
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
        task = self.task.task_class
        if self.trainer.monitor is None:  # the task's own metric; config.yaml records it
            self.trainer = dataclasses.replace(self.trainer, monitor=task.monitor)
        if self.trainer.precision == "bf16-true" and not task.pure_bf16:
            raise FieldError(
                "trainer.precision", f"is 'bf16-true', which runs the model's forward in bfloat16, but task.name is "
                f"{self.task.name!r}, whose own layers take the encoder's features: use trainer.precision=bf16-mixed."
            )
        self._check_task(task)
        if self.model.freeze != "none" and self.model.pretrained is None:  # frozen random weights would never learn
            raise FieldError(
                "model.freeze", "only applies to pretrained weights: set model.pretrained too (a model file or timm:NAME)."
            )

    def schedule_notes(self) -> list[str]:
        """One ``note:`` line for each schedule as long as the run (``trainer.max_epochs``) or longer:
        the learning rate's warm-up, and the task's own (:meth:`~vitkit.tasks.Task.notes`)."""
        epochs, optim = self.trainer.max_epochs, self.optim
        notes = [f"optim.warmup_epochs={optim.warmup_epochs:g} is as long as the run (trainer.max_epochs={epochs}) or "
                 f"longer: the learning rate rises all along (to optim.lr={optim.lr:g} at epoch {optim.warmup_epochs:g}) and never decays"] \
            if optim.warmup_epochs >= epochs else []
        notes += self.task.task_class.notes(self.task.options, epochs)
        return [f"note: {note}." for note in notes]

    def _check_task(self, task: type[Task]) -> None:
        """A metric the task logs for ``trainer.monitor``; no option the task cannot take: those only
        labels give meaning to, for a task that uses none, and the task's own refusals.

        Raises:
            FieldError: one line naming every such option, or the task's refusal.
        """
        monitor, allowed = self.trainer.monitor, (*task.monitors, "last")
        wrong_monitor = [] if monitor in allowed else [f"trainer.monitor={monitor} (use {' or '.join(allowed)})"]
        if task.uses_labels and wrong_monitor:
            raise FieldError("trainer.monitor", f"is {monitor!r}, which task {self.task.name!r} does not log: use "
                             f"{' or '.join(allowed)}.")
        found = (labelled_options(self) + wrong_monitor if not task.uses_labels else []) + task.conflicts(self.task.options, self)
        if found:
            why = "pre-trains without labels, but the recipe sets classification options" if not task.uses_labels \
                else "cannot train with"
            shipped = f"{self.task.name}_fashion_mnist"
            start = f" or start from a pre-training recipe (recipes/{shipped}.yaml)" if shipped in shipped_recipes() else ""
            raise FieldError(
                "task.name", f"is {self.task.name!r}, which {why}: {', '.join(found)}; remove them (they apply when "
                f"fine-tuning the encoder){start}."
            )
        task.check_recipe(self.task.options, self)

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
    try:  # a model sized from the images is checked by its task, built once the grid is known
        if not config.model.fit_to_images:
            config.task.task_class.check_model(config.task.options, vit_config)
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
