"""``train(recipe, overrides, resume)``: a whole run, from recipe to exported model.

Validates the recipe, builds data, model and Lightning ``Trainer``, fits (resuming from a
checkpoint if asked), tests the best checkpoint, then writes the run directory's artefacts
(see :mod:`.artifacts`). Works unchanged under multi-GPU / multi-node DDP: every process runs this
function, rank 0 claims the run directory and writes the files; the processes Lightning launches
learn the directory from the environment.

Nothing is written before the recipe and a checkpoint to resume are checked; a diverged run names
its newest finite checkpoint; a run stopped by SIGTERM or Ctrl-C saves ``last.ckpt`` and says how to resume.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import logging
import os
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger, Logger, TensorBoardLogger
from lightning.pytorch.strategies import Strategy
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.exceptions import SIGTERMException
from torch import nn

from ..data import DataInfo, folder_sample, settle_unset
from ..errors import VitkitError
from ..files import write_json
from ..io import save_model
from ..kernels import autotune_report
from ..models import VisionTransformer, count_parameters
from ..output_dirs import hold
from ..pretrained import PretrainedWeights
from ..schema import MAX_EPOCHS, RecipeError
from .artifacts import (
    CONFIG_FILE,
    RUN_DIR_ENV,
    adopted_run_dir,
    is_global_rank_zero,
    merge_metrics,
    point_latest,
    resolve_run_dir,
    save_part,
)
from .callbacks import (
    CtrlCStops,
    LastCheckpoint,
    LossProgressBar,
    RuntimeCudaCheck,
    SigtermStopsEveryRank,
    Throughput,
    sigterm_stops_at_once,
)
from .checkpoint import (
    AtomicCheckpointIO,
    CheckpointError,
    check_recipe_unchanged,
    check_resumable,
    is_sharded_checkpoint,
    newest_finite_checkpoint,
    remove_orphan_temp_files,
)
from .compile_trial import CompileChooser
from .config import RecipeConfig, TrainerConfig, load_recipe, save_recipe
from .datamodule import ViTDataModule
from .distill import build_teacher, prepare_teacher
from .distributed import ShardedStrategy
from .hook_dispatch import skip_idle_step_hooks
from .kernel_trial import TrainingKernelChooser
from .model_builder import build_model, load_starting_weights, pretrained_data, weights_geometry
from .module import NonFiniteLossError, ViTModule
from .plots import plot_curves
from .pretraining import finetune_command, pretraining_callbacks, pretraining_summary
from .sizing import fit_to_images
from .threads import other_load, thread_advice, usable_cores
from .time_budget import budget_summary, cut_short_note, time_budget_callback

#: Exit status of a run stopped by SIGTERM (128 + the signal's number, as shells report it).
SIGTERM_EXIT = 143


class RunStoppedError(VitkitError):
    """The run was stopped by SIGTERM; ``last.ckpt`` holds its last step."""

    exit_status = SIGTERM_EXIT


class RunInterruptedError(RunStoppedError):
    """The run was stopped by Ctrl-C (SIGINT), as by SIGTERM; exit status 130 (128 + SIGINT)."""

    exit_status = 130


@dataclass
class RunResult:
    """What :func:`train` returns: the run directory, its ``summary.json`` content, the trained
    model (best checkpoint, EMA weights when enabled) on the CPU in eval mode (``None`` on the ranks
    other than 0 of an FSDP run, which never hold the whole model), and whether this
    process is global rank 0 (the one that writes the run's files and reports it)."""

    run_dir: Path
    summary: dict[str, Any]
    model: VisionTransformer | None
    primary: bool = True


def train(
    recipe: str | os.PathLike | dict[str, Any] | RecipeConfig,
    overrides: list[str] | tuple[str, ...] = (),
    resume: str | os.PathLike | None = None,
    callbacks: list[L.Callback] | tuple[L.Callback, ...] = (),
) -> RunResult:
    """Train a ViT as ``recipe`` says.

    Args:
        recipe: a YAML recipe file (``recipes/quickstart.yaml``), an equivalent dict or a
            :class:`RecipeConfig`.
        overrides: dotted ``key=value`` changes (``['trainer.max_epochs=5', 'model.depth=4']``).
        resume: a ``last.ckpt`` (or any checkpoint of this recipe) to continue from; loaded with
            ``weights_only=True``. Inside a run directory, the run continues there.
        callbacks: extra Lightning callbacks (e.g. a benchmark's periodic test evaluation).

    Raises:
        RecipeError: invalid recipe or overrides (before any work starts).
        NonFiniteLossError: the loss, weights or optimiser state diverged; the message names the
            newest finite checkpoint (none with non-finite values is ever written).
        UnsafeCheckpointError: ``resume`` holds pickled code.
        CheckpointError: ``resume`` is unreadable or was trained with another model or data.
        RunStoppedError: SIGTERM (or Ctrl-C: :class:`RunInterruptedError`) stopped the run; ``last.ckpt`` was saved.
    """
    started = time.perf_counter()
    config = load_recipe(recipe, overrides)
    check_precision(config.trainer)
    if resume is not None and Path(resume).is_dir() and not is_sharded_checkpoint(resume):
        raise CheckpointError(f"checkpoint to resume {resume} is a directory; give its checkpoints/last.ckpt.")
    if resume is not None and not Path(resume).exists():
        raise FileNotFoundError(f"checkpoint to resume {resume} does not exist.")
    with _torch_threads(config.trainer.num_threads):
        return _prepare_and_fit(config, resume, callbacks, started)


@contextlib.contextmanager
def _torch_threads(threads: int | None) -> Iterator[None]:
    """torch's CPU threads set to ``threads`` (``None``: left as they are) for the run, and put
    back after it: a script or notebook that trains and then goes on keeps its own."""
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _prepare_and_fit(
    config: RecipeConfig,
    resume: str | os.PathLike | None,
    callbacks: list[L.Callback] | tuple[L.Callback, ...],
    started: float,
) -> RunResult:
    """Everything :func:`train` does once the recipe is read and the threads are set."""
    if config.trainer.accelerator in ("cpu", "auto") and not torch.cuda.is_available():
        advice = thread_advice(torch.get_num_threads(), usable_cores(), other_load())
        if advice:
            rank_zero_info(advice)
    if config.trainer.precision == "bf16-true":  # Lightning's next line announces the autocast of evaluation only
        rank_zero_info("note: trainer.precision=bf16-true: the training steps run a bfloat16 copy of the model, whose "
                       "float32 weights take the updates; validation and test run under bf16 autocast.")
    for note in config.schedule_notes():
        rank_zero_info(note)
    L.seed_everything(config.trainer.seed, workers=True, verbose=False)
    config = settle_pretrained_path(config)
    weights = load_starting_weights(config.model, resume)
    sample = folder_sample(config.data)  # an image folder's channels and size, read once
    config, sized = fit_to_images(config, sample)
    data, notes = settle_unset(config.data, sample, *weights_geometry(weights))
    config = dataclasses.replace(config, data=data)  # config.yaml records the channels and size chosen
    for note in [sized, *notes]:
        if note is not None:
            rank_zero_info(note)
    filled: set[str] = set()  # data keys left unset by the recipe and filled from the weights
    if weights is not None:
        data, note = pretrained_data(config.data, weights)
        filled = {f"data.{key}" for key in ("mean", "std", "interpolation")
                  if getattr(config.data, key) is None and getattr(data, key) is not None}
        config = dataclasses.replace(config, data=data)  # the run's config.yaml records what was used
        rank_zero_info(note)
    datamodule = ViTDataModule(config.data, config.trainer.batch_size)
    if (note := datamodule.fit_batch()) is not None:  # config.yaml records the batch used
        config = dataclasses.replace(config, trainer=dataclasses.replace(config.trainer, batch_size=datamodule.batch_size))
        rank_zero_info(note)
    if not datamodule.bundle.held_out and config.trainer.monitor != "last":  # the data layer said why
        config = dataclasses.replace(config, trainer=dataclasses.replace(config.trainer, monitor="last"))
    if (note := datamodule.fit_workers(usable_cores())) is not None:
        config = dataclasses.replace(config, data=datamodule.config)
        rank_zero_info(note)
    datamodule.check_batch()  # before a run directory is claimed (each DDP process checks again at fit)
    if config.task.knn_root is not None:  # a labelled folder the end of the run would refuse, refused now
        datamodule.labelled_folder(config.task.knn_root)
    module = build_module(config, datamodule.info, weights)
    datamodule.task_data = module.task.split_data  # DINO's crops, a dense task's targets
    if resume is not None:  # before anything is written, so a refused resume leaves the run as it was
        check_resumable(resume, module, datamodule.info.name, sharded=config.trainer.strategy == "fsdp")
        check_recipe_unchanged(config, adopted_run_dir(resume), filled)
    teacher = build_teacher(config.distill.teacher, datamodule.info) if config.distill.type != "none" else None
    check_hardware(config.trainer)
    run_dir = resolve_run_dir(config, resume)
    with _own_run_dir(run_dir, adopted=run_dir == adopted_run_dir(resume)):
        return _fit(config, datamodule, module, teacher, run_dir, resume, callbacks, started)


def settle_pretrained_path(config: RecipeConfig) -> RecipeConfig:
    """``config`` with a ``model.pretrained`` file given through links (``runs/<recipe>/latest/...``,
    which the next run moves) replaced by the file itself, so that config.yaml, summary.json and the
    model file record the weights this run started from."""
    pretrained = config.model.pretrained
    if pretrained is None or pretrained.startswith("timm:") or not Path(pretrained).exists():
        return config  # timm weights, or a missing file that load_starting_weights names
    return dataclasses.replace(config, model=dataclasses.replace(config.model, pretrained=str(Path(pretrained).resolve())))


def _fit(
    config: RecipeConfig,
    datamodule: ViTDataModule,
    module: ViTModule,
    teacher: nn.Module | None,
    run_dir: Path,
    resume: str | os.PathLike | None,
    callbacks: list[L.Callback] | tuple[L.Callback, ...],
    started: float,
) -> RunResult:
    """Fit, test and export into ``run_dir`` (see :func:`train`)."""
    teacher_report = _attach_teacher(config, datamodule, module, teacher, run_dir)
    best, last, throughput = _callbacks(config, run_dir)
    monitor_lr = LearningRateMonitor(logging_interval="step")
    # First, so that its step timing ends before other callbacks' batch-end work; a deterministic run times nothing.
    kernels = TrainingKernelChooser(pin="sdpa" if config.trainer.deterministic else None)
    # compiled once the attention kernel is chosen; auto times it first, and is eager under
    # determinism (timings would decide the run's rounding)
    always, auto = config.trainer.compile is True, config.trainer.compile == "auto" and not config.trainer.deterministic
    compiling = [CompileChooser(kernels, always=always)] if always or auto else []
    ctrl_c = CtrlCStops()
    every_rank = SigtermStopsEveryRank()
    bar = [LossProgressBar()] if config.trainer.enable_progress_bar else []
    pretraining = [*pretraining_callbacks(config, run_dir), *module.task.callbacks()]  # k-NN, figures, the task's own
    budget = time_budget_callback(config, datamodule, started, time.perf_counter)  # none without a time budget
    ours = [kernels, *compiling, *budget, best, last, every_rank, throughput, monitor_lr, ctrl_c, RuntimeCudaCheck(),
            *bar, *pretraining]
    trainer = build_trainer(config, run_dir, callbacks=[*ours, *callbacks])
    # the run's own callbacks (and those Lightning adds), not the caller's, skip their no-op step hooks
    skip_idle_step_hooks([cb for cb in trainer.callbacks if not any(cb is given for given in callbacks)], module)
    if trainer.is_global_zero:  # known from the launch environment before fit (multi-node too)
        save_recipe(config, run_dir / CONFIG_FILE)

    with _shared_run_dir(run_dir), _quiet_third_party_warnings():
        try:
            trainer.fit(module, datamodule=datamodule, ckpt_path=resume, weights_only=True)
            if (schedule_note := cut_short_note(trainer, module, config.trainer.max_time_minutes)) is not None:
                rank_zero_info(f"note: {schedule_note}")
            best_path = best.best_model_path or None
            with sigterm_stops_at_once(enabled=trainer.world_size == 1):
                tested = trainer.test(module, datamodule=datamodule, ckpt_path=best_path, weights_only=True, verbose=False)
                validated = trainer.validate(module, datamodule=datamodule, verbose=False)  # the best weights, now loaded
        except NonFiniteLossError as error:
            raise _diverged(error, config, last) from None
        except SIGTERMException:
            raise _stopped(trainer, ctrl_c.interrupted, last, run_dir) from None

    model = module.export_model()
    summary = {
        "recipe": config.name,
        "dataset": datamodule.info.name,
        "model": describe_model(config),
        "num_parameters": count_parameters(model) if model is not None else None,
        **module.task.summary(lambda key: _metric(tested if key.startswith("test/") else validated, key)),
        "held_out": datamodule.bundle.held_out,  # false: validation and test showed the training images
        # [images the test accuracy covers, images of the test split]; fewer with trainer.limit_test_batches
        "test_images": [round(_metric(tested, "test/images") or 0), len(datamodule.bundle.test)],
        "epochs": trainer.current_epoch,
        "global_steps": trainer.global_step,
        "wall_time_s": round(time.perf_counter() - started, 2),
        "train_images_per_s": round(throughput.images_per_second, 1),
        "first_step_s": round(throughput.first_step_seconds, 2),
        "compiled": bool(compiling) and compiling[0].choice == "compiled",
        **({"compile": compiling[0].report()} if compiling else {}),
        "precision": config.trainer.precision,
        "world_size": trainer.world_size,
        "resumed_from": str(resume) if resume is not None else None,
        "best_checkpoint": str(best_path) if best_path else None,
        # what attn_impl="auto" chose: on the run's own training steps, and by synthetic measurement elsewhere
        "attention_kernels": {"training_steps": kernels.report(), "synthetic": autotune_report()},
        **teacher_report,
        **pretraining_summary(pretraining),
        **budget_summary(budget, schedule_note),
        **_encoder_commands(config, run_dir / "model.safetensors", model),
    }
    if trainer.is_global_zero:
        _write_outputs(config, module, model, run_dir, summary)
    return RunResult(run_dir=run_dir, summary=summary, model=model, primary=trainer.is_global_zero)


def _encoder_commands(config: RecipeConfig, encoder: Path, model: VisionTransformer | None) -> dict[str, str]:
    """For a task that releases an encoder (``encoder``, the exported ``model``): the commands that
    fine-tune it and train the same model from fresh weights (:func:`finetune_command`)."""
    if not config.task.task_class.releases_encoder or model is None:
        return {}
    depth = model.config.depth
    return {"finetune_command": finetune_command(config, encoder, depth),
            "scratch_command": finetune_command(config, encoder, depth, fresh=True)}


def _attach_teacher(
    config: RecipeConfig, datamodule: ViTDataModule, module: ViTModule, teacher: nn.Module | None, run_dir: Path
) -> dict[str, Any]:
    """Train (or load) a distillation ``teacher`` first (it counts in the run's wall time) and hand it
    to the task; ``summary.json``'s teacher entries (none without a teacher)."""
    if teacher is None:
        return {}
    report = prepare_teacher(
        teacher, config.distill, datamodule, run_dir, config.trainer.lightning_precision, config.trainer.enable_progress_bar
    )
    module.task.attach_teacher(teacher)
    return report


def _diverged(error: NonFiniteLossError, config: RecipeConfig, last: LastCheckpoint) -> NonFiniteLossError:
    """``error`` with the advice against divergence and the newest finite checkpoint beside ``last``."""
    kept = newest_finite_checkpoint(Path(last.path).parent)
    note = f" The last good checkpoint is {kept}." if kept else " No finite checkpoint had been written yet."
    return NonFiniteLossError(f"{error} {divergence_advice(config)}{note}")


def _stopped(trainer: L.Trainer, interrupted: bool, last: LastCheckpoint, run_dir: Path) -> RunStoppedError:
    """The error of a run stopped by SIGTERM (or Ctrl-C, ``interrupted``): where it stopped, what
    ``last`` holds and the command that resumes it."""
    kept = Path(last.path).is_file() or is_sharded_checkpoint(last.path)  # a file, or fsdp's folder
    saved = f"{last.path} holds step {trainer.global_step}" if kept else "no checkpoint"
    error, how = (RunInterruptedError, "Ctrl-C") if interrupted else (RunStoppedError, "SIGTERM")
    return error(
        f"stopped by {how} at step {trainer.global_step} (epoch {trainer.current_epoch}); {saved}. "
        f"Resume with: vitkit train {run_dir / CONFIG_FILE} --resume {last.path}"
    )


def _write_outputs(config: RecipeConfig, module: ViTModule, model: nn.Module, run_dir: Path, summary: dict[str, Any]) -> None:
    """The run's files (by global rank 0): the model, the parts the task releases beside it, the
    curves, ``summary.json``, and the ``latest`` link."""
    save_model(model, run_dir / "model.safetensors", extra=module.hparams["extra"])
    for name, part in module.task.released_parts().items():  # a task's own trained parts, beside the model
        save_part(part, run_dir / f"{name}.safetensors", task=config.task.name)
    plot_curves(merge_metrics(run_dir), run_dir / "curves.png")
    write_json(run_dir / "summary.json", summary)
    point_latest(run_dir)


def build_module(config: RecipeConfig, info: DataInfo, weights: PretrainedWeights | None = None) -> ViTModule:
    """The LightningModule for ``config``, its model built once (:func:`build_model`: a fresh
    variant sized by the dataset, or ``weights`` fitted to it), with the ``extra`` metadata
    (normalisation, classes, dataset and recipe names, data options, test-time augmentation,
    where the weights came from) to export."""
    extra = {**info.to_extra(), "recipe": config.name, "data_config": config.data.to_dict(), "tta": config.trainer.tta}
    if config.task.task_class.releases_encoder:  # a headless encoder: the data's labels name none of its (no) classes
        extra["class_names"] = []
    if weights is not None:
        extra["pretrained"] = weights.record
    model, vit_config = build_model(config, info, weights)
    return ViTModule(model, config, vit_config, extra)


def divergence_advice(config: RecipeConfig) -> str:
    """What to change against a diverged run, leaving out what the recipe already does."""
    changes = ["lower optim.lr", "lengthen optim.warmup_epochs"]
    if config.optim.clip_grad is None:
        changes.append("set optim.clip_grad (e.g. 1.0)")
    if config.trainer.precision != "32-true":
        changes.append("train with trainer.precision=32-true")
    return f"To fix it: {', '.join(changes[:-1])} or {changes[-1]}."


def check_precision(config: TrainerConfig) -> None:
    """Refuse ``16-mixed`` where training would run on the CPU (it needs a GPU's float16 units)."""
    on_cpu = config.accelerator == "cpu" or (config.accelerator == "auto" and not torch.cuda.is_available())
    if config.precision == "16-mixed" and on_cpu:
        raise RecipeError(
            "trainer.precision='16-mixed' (float16 autocast with loss scaling) needs a GPU, but this run "
            "trains on the CPU; use trainer.precision=bf16-mixed (fast on CPUs with bfloat16 support) or 32-true."
        )


def check_hardware(config: TrainerConfig) -> None:
    """Refuse, before a run directory is claimed, what Lightning would refuse at ``fit``: an
    accelerator this machine lacks, device ids it does not have, a strategy it cannot run. Lightning
    itself decides (a throwaway ``Trainer`` with the recipe's hardware options, which writes nothing)."""
    quiet = logging.getLogger("lightning.pytorch")
    level = quiet.level
    quiet.setLevel(logging.WARNING)  # the real Trainer prints the device summary once
    try:
        L.Trainer(
            accelerator=config.accelerator,
            devices=config.devices,
            num_nodes=config.num_nodes,
            strategy=training_strategy(config),
            precision=config.lightning_precision,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
        )
    except (MisconfigurationException, ValueError, TypeError, RuntimeError) as error:
        raise RecipeError(
            f"trainer options accelerator={config.accelerator!r}, devices={config.devices!r}, "
            f"strategy={config.strategy!r}, num_nodes={config.num_nodes} cannot run on this machine: "
            f"{_first_sentence(error)}"
        ) from None
    finally:
        quiet.setLevel(level)


def _first_sentence(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return text if len(text) <= 300 else text[:297] + "..."


def build_trainer(config: RecipeConfig, run_dir: Path, callbacks: list[L.Callback]) -> L.Trainer:
    """A Lightning ``Trainer`` from the recipe's ``trainer`` and ``optim`` sections:
    atomic, ``weights_only`` checkpoint IO; CSV logs (TensorBoard too when installed)."""
    options = config.trainer
    loggers: list[Logger] = [CSVLogger(run_dir, name="logs")]
    if importlib.util.find_spec("tensorboard") is not None:
        loggers.append(TensorBoardLogger(run_dir, name="tensorboard"))
    with _without_lightning_tips():
        return _trainer(config, options, run_dir, callbacks, loggers, training_strategy(options))


def training_strategy(config: TrainerConfig) -> str | Strategy:
    """``trainer.strategy`` for Lightning: ``fsdp`` as vitkit's :class:`ShardedStrategy` (FSDP2,
    sharded checkpoints), any other by its name in Lightning's registry."""
    if config.strategy == "fsdp":
        return ShardedStrategy()
    return config.strategy


def _trainer(
    config: RecipeConfig,
    options: TrainerConfig,
    run_dir: Path,
    callbacks: list[L.Callback],
    loggers: list[Logger],
    strategy: str | Strategy,
) -> L.Trainer:
    """:func:`build_trainer`'s ``Trainer`` (built while Lightning's tips are filtered out)."""
    return L.Trainer(
        accelerator=options.accelerator,
        devices=options.devices,
        num_nodes=options.num_nodes,
        strategy=strategy,
        precision=options.lightning_precision,
        max_epochs=MAX_EPOCHS if options.time_budget_minutes else options.max_epochs,  # until the budget's plan
        max_time=timedelta(minutes=options.max_time_minutes) if options.max_time_minutes else None,
        log_every_n_steps=options.log_every,
        limit_train_batches=options.limit_train_batches,
        limit_val_batches=options.limit_val_batches,
        limit_test_batches=options.limit_test_batches,
        num_sanity_val_steps=options.num_sanity_val_steps,
        deterministic=options.deterministic,
        enable_progress_bar=options.enable_progress_bar,
        enable_model_summary=False,  # its "Total Flops 0" (no example input); summary.json counts the parameters
        callbacks=callbacks,
        logger=loggers,
        default_root_dir=run_dir,
        plugins=[AtomicCheckpointIO()],
    )


def _callbacks(config: RecipeConfig, run_dir: Path) -> tuple[ModelCheckpoint, LastCheckpoint, Throughput]:
    """``best.ckpt`` by ``trainer.monitor``, ``last.ckpt`` every N steps and epoch, throughput."""
    checkpoints, monitor = run_dir / "checkpoints", config.trainer.monitor
    best = ModelCheckpoint(
        dirpath=checkpoints,
        filename="best",
        monitor=None if monitor == "last" else monitor,  # None: the latest epoch's weights
        mode=config.task.task_class.monitors.get(monitor, "min"),
        save_top_k=1,
        auto_insert_metric_name=False,
        enable_version_counter=False,
    )
    last = LastCheckpoint(checkpoints / "last.ckpt", config.trainer.checkpoint_every_n_steps)
    return best, last, Throughput()


def describe_model(config: RecipeConfig) -> str:
    """The variant a recipe builds (or the weights it starts from) and the fields it overrides
    (``summary.json``'s ``model``)."""
    model = config.model
    start = f"fine-tuned from {model.pretrained}" if model.pretrained is not None else model.variant
    overrides = model.vit_overrides()
    if not overrides:
        return start
    return f"{start}, overridden: {', '.join(f'{key}={value}' for key, value in overrides.items())}"


@contextlib.contextmanager
def _quiet_third_party_warnings() -> Iterator[None]:
    """Silence, for the run only, what users cannot act on: Lightning 2.6's pytree helper builds
    torch's ``LeafSpec``, deprecated since torch 2.10 (Lightning's to fix), and Lightning's tips."""
    with warnings.catch_warnings(), _without_lightning_tips():
        warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated", category=FutureWarning)
        yield


class _LightningTips(logging.Filter):
    """Lightning's "💡 Tip: try installing litlogger / litmodels" lines."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("💡 Tip")


@contextlib.contextmanager
def _without_lightning_tips() -> Iterator[None]:
    """Lightning's advertising tips left out while vitkit builds and runs a Trainer."""
    logger, tips = logging.getLogger("lightning.pytorch.utilities.rank_zero"), _LightningTips()
    logger.addFilter(tips)
    try:
        yield
    finally:
        logger.removeFilter(tips)


@contextlib.contextmanager
def _own_run_dir(run_dir: Path, adopted: bool) -> Iterator[None]:
    """Hold ``run_dir``'s lock for the run (the process that claimed or adopted it; the processes it
    launches share it). A resumed run then removes the temporary files a killed save left there:
    with the lock held, no other process can be writing them."""
    # launched by rank 0, or another rank of an externally launched job (torchrun, srun): those write
    # nothing there, and on a shared file system rank 0 may already hold the directory they name
    if RUN_DIR_ENV in os.environ or not is_global_rank_zero() or not run_dir.is_dir():
        yield
        return
    with hold(run_dir):
        if adopted:
            remove_orphan_temp_files(run_dir / "checkpoints")
            remove_orphan_temp_files(run_dir, pattern=".*.tmp")  # model.safetensors, summary.json, ...
        yield


@contextlib.contextmanager
def _shared_run_dir(run_dir: Path) -> Iterator[None]:
    """Expose the run directory to the DDP processes Lightning launches during ``fit``."""
    if RUN_DIR_ENV in os.environ:  # this process was launched by rank 0
        yield
        return
    os.environ[RUN_DIR_ENV] = str(run_dir.resolve())
    try:
        yield
    finally:
        os.environ.pop(RUN_DIR_ENV, None)


def _metric(results: list[dict[str, float]], key: str) -> float | None:
    """``key`` of a ``trainer.validate``/``test`` result, rounded; ``None`` when that loop did not run."""
    value = results[0].get(key) if results else None
    return None if value is None else round(float(value), 3)
