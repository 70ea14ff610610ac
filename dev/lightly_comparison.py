"""vitkit's MAE and DINO against the lightly library's, on the same ViT and data.

    pip install --target ~/lightly-site lightly==1.6.0 --no-deps   # outside vitkit's environment (the modules
    python dev/lightly_comparison.py --lightly-site ~/lightly-site   # used here import with vitkit's dependencies)
    python dev/lightly_comparison.py --lightly-site ~/lightly-site --methods mae --seeds 0 1 2 --equal-time
    python dev/lightly_comparison.py --lightly-site ~/lightly-site --check-step   # one MAE step of each, seconds
    python dev/lightly_comparison.py --lightly-site ~/lightly-site --limit 300 --epochs 1   # a smoke run

(or ``pip install lightly`` into an environment of its own and leave out ``--lightly-site``: lightly is
never a dependency of vitkit). For each method and each of ``--seeds`` (``trainer.seed``: on both
sides the initial weights, the data order, the augmentation and the masks), two trainers run one
after the other in this process, on ``--threads`` CPU threads (2): vitkit's and lightly's, each for
``--epochs`` epochs (2). ``--equal-time`` adds, at every seed, vitkit trained for the whole epochs
that fit in lightly's training seconds at the first seed (its own schedule over those epochs).
``--libraries`` trains one side only and ``--set KEY=VALUE ...`` changes the recipe of both: the
controlled experiments of docs/results.md. The script prints a markdown table (per method, library
and epochs: seconds per training epoch and per run, each seed's k-NN top-1 and their mean) and
the command, and writes ``results.json`` (with every epoch's seconds) and ``results.md`` to
``--out``. Time it on an otherwise idle machine: where other work keeps the cores busy, 2 threads
wait on each other and every step takes several times longer, unevenly (measured: a lightly MAE
step took 0.07 s on 2 threads at a quiet moment, 4-5 s while other work kept the load average at
5, 0.2 s on 1 thread under that load), and such a run compares the load, not the libraries
(``--threads 1`` keeps a shared machine's run going; its k-NN accuracies are still comparable).

``--check-step`` compares the two MAE objectives themselves (:func:`mae_step_parity`): one loss
and backward pass of vitkit's task and of lightly's modules on the same weights, images and masks.

vitkit's side is vitkit's own training path: :func:`vitkit.train.train` (what ``tools/train.py``
runs), in this process, with ``recipes/mae_fashion_mnist.yaml`` / ``recipes/dino_fashion_mnist.yaml``
and the overrides :func:`recipe_overrides` lists (linear patches and no LSA, so timm holds the same
encoder; ``trainer.max_epochs``; no time limit). An :class:`EpochClock` callback times its epochs
and keeps the encoder the last step left. Each run also writes its usual run directory under
``--out``; its ``summary.json`` ``knn_acc1`` (vitkit's own measurement of the checkpoint its
recipe monitors: MAE's last) is printed beside the table as a check.

lightly's side is a plain loop over lightly's modules on the timm twin of the same encoder
(:func:`vitkit.models.to_timm`: 32 px, 8-px linear patches, 128 wide, 4 blocks, 4 heads, class
token): MAE as lightly 1.6.0's ``examples/pytorch/mae.py`` (``MaskedVisionTransformerTIMM``,
``MaskedVisionTransformerDecoderTIMM``: ``MAEDecoderTIMM`` is deprecated in 1.6.0 in its favour,
the same layers), DINO as its ``examples/pytorch/dino.py`` (``DINOProjectionHead``, ``DINOLoss``,
``update_momentum`` with ``cosine_schedule``, ``DINOTransform``).

Alike on both sides: the training images (vitkit's split of the 60,000: 57,000, the other 3,000 are
vitkit's validation images; ``--limit N`` keeps ``N / 10`` of each class), batch size, epochs, the
optimiser and learning rate (vitkit's AdamW groups and per-step warm-up + cosine schedule, which
lightly leaves to its user), gradient clipping, precision (float32 for MAE, bfloat16 autocast for
DINO, as the recipes), loader workers (0), and the recipes' method settings: mask ratio 0.75, a
2-block, 64-wide, 4-head decoder, per-patch normalised targets; DINO's 3-layer head (512, 128,
1024), student 0.1 and teacher 0.04 -> 0.07 temperatures over 2 epochs, centre momentum 0.9,
teacher momentum 0.996 -> 1 on a cosine over the steps, the head's last layer frozen for 1 epoch,
2 global 32-px crops (area 0.4-1) and 4 local 16-px crops (0.1-0.4), blur sigma 0.1-1. The DINO
teacher starts as a copy of the student on both sides, and both students start from the same
initial weights (the recipe's seed).

Differences lightly does not let go (or that are its examples' way):
  * MAE: ``MaskedVisionTransformerTIMM`` re-initialises the encoder as MAE does (Xavier-uniform
    linears, a fixed 2-D sin-cos position embedding); vitkit's recipe asks for the same
    (``model.init=mae``, ``model.pos_embed=sincos``), drawn by its own code: the same distributions,
    other draws (the initial weights alike at a seed are DINO's only). vitkit's sin-cos tables hold
    MAE's columns in another order (a fixed permutation of the channels, which the Xavier-drawn
    layers around them do not tell apart).
  * Augmentation: lightly's transforms work per PIL image in the loader (MAE: torchvision's
    ``RandomCrop(padding=1)`` and flip, the recipe's; DINO: ``DINOTransform``, bicubic crops, PIL
    blur); vitkit transforms whole uint8 batches in torch (bilinear crops). Both count in s/epoch.
  * DINO: lightly's example runs the student once per crop (6 passes a step) and the teacher once
    per global crop; vitkit runs one pass per crop size (2 and 1).
  * vitkit's epochs carry Lightning's per-step hooks and logging; its end-of-epoch validation and
    checkpoints are not timed.

Measures: s/epoch is the mean over epochs of the time from an epoch's start to its last step's end
(loading, augmentation, forward, backward, optimiser, teacher update). k-NN top-1 is ONE
evaluation for every encoder: :func:`vitkit.train.knn.pooled_features` (the final norm's class
token: what vitkit's task measures and exports) and :func:`~vitkit.train.knn.knn_accuracy` (DINO's
weighted k-NN, k=20, T=0.07), the training images unaugmented as the memory bank, the 10,000 test
images as queries, on each encoder as the last step left it (DINO: the teacher's backbone).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import importlib.util
import shlex
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import Callback
from PIL import Image
from torch import nn
from torch.utils.data import DataLoader, Dataset
from torchvision import transforms as T

from vitkit.data import DataInfo, settle_unset, unaugmented
from vitkit.data.multicrop import BLUR_SIGMA
from vitkit.files import markdown_table, write_json
from vitkit.models import to_timm, to_timm_state_dict
from vitkit.tasks.mae import MaeTask, kept_count
from vitkit.train import RecipeConfig, ViTDataModule, load_recipe, train
from vitkit.train.knn import knn_accuracy, pooled_features
from vitkit.train.model_builder import build_model
from vitkit.train.optim import Horizon, build_optimizer, warmup_cosine

RECIPES = {method: Path(__file__).resolve().parents[1] / "recipes" / f"{method}_fashion_mnist.yaml" for method in ("mae", "dino")}
#: Fashion-MNIST's classes: ``--limit N`` keeps ``N // CLASSES`` training images of each.
CLASSES = 10


def recipe_overrides(epochs: int, limit: int | None, threads: int, out: Path, seed: int = 0) -> list[str]:
    """The overrides of both recipes: the plain encoder timm can hold (linear patches, no LSA), the
    epochs without a time limit or budget, on ``threads`` CPU threads, ``seed`` (``trainer.seed``: the initial
    weights, data order, augmentation and masks), the run directories under ``out``. A ``limit`` run
    (a smoke test) also cuts vitkit's own validation and test to one batch (neither is timed or compared)."""
    words = [
        "model.patch_embed=linear", "model.locality=false", f"trainer.max_epochs={epochs}",
        "trainer.max_time_minutes=null", "trainer.time_budget_minutes=null", "trainer.accelerator=cpu",
        f"trainer.num_threads={threads}", f"trainer.seed={seed}", "trainer.enable_progress_bar=false", f"output.dir={out}",
    ]
    if limit:
        words += [f"data.train_per_class={limit // CLASSES}", "trainer.limit_val_batches=1", "trainer.limit_test_batches=1"]
    return words


@dataclasses.dataclass
class Result:
    """One trainer's measurements."""

    method: str
    library: str
    seed: int
    epoch_seconds: list[float]
    knn_acc1: float
    notes: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def epochs(self) -> int:
        return len(self.epoch_seconds)


def summary_rows(results: list[Result], seeds: list[int]) -> list[dict[str, str]]:
    """One row per method, library and epoch count: s/epoch and the training seconds (means over
    the seeds), each seed's k-NN top-1 and their mean."""
    rows = []
    for key in dict.fromkeys((r.method, r.library, r.epochs) for r in results):
        runs = {r.seed: r for r in results if (r.method, r.library, r.epochs) == key}
        seconds = [s for r in runs.values() for s in r.epoch_seconds]
        row = {"method": key[0], "library": key[1], "epochs": str(key[2]), "s/epoch": f"{statistics.mean(seconds):.1f}",
               "training s": f"{statistics.mean(sum(r.epoch_seconds) for r in runs.values()):.0f}"}
        row |= {f"seed {seed}": f"{runs[seed].knn_acc1:.2f}" if seed in runs else "" for seed in seeds}
        rows.append(row | {"mean k-NN top-1 (%)": f"{statistics.mean(r.knn_acc1 for r in runs.values()):.2f}"})
    return rows


# ------------------------------------------------------------------------------------ shared parts
def prepared(method: str, overrides: list[str]) -> tuple[RecipeConfig, ViTDataModule]:
    """The recipe and data as :func:`vitkit.train.train` settles them (unset data keys filled, the
    batch clamped to a small split), for lightly's loop and the shared evaluation."""
    config = load_recipe(RECIPES[method], overrides)
    data, _ = settle_unset(config.data)
    datamodule = ViTDataModule(data, config.trainer.batch_size)
    datamodule.fit_batch()
    trainer = dataclasses.replace(config.trainer, batch_size=datamodule.batch_size)
    return dataclasses.replace(config, data=data, trainer=trainer), datamodule


def initial_timm_encoder(config: RecipeConfig, datamodule: ViTDataModule) -> nn.Module:
    """The timm twin of the encoder vitkit's run starts from (built after the same seeding)."""
    L.seed_everything(config.trainer.seed, verbose=False)
    model, _ = build_model(config, datamodule.info, None)
    return to_timm(model)


class KnnJudge:
    """The one k-NN evaluation of every encoder (see the module docstring)."""

    def __init__(self, datamodule: ViTDataModule) -> None:
        bundle, batch = datamodule.bundle, 2 * datamodule.batch_size
        self.bank = datamodule.loader(unaugmented(bundle.train, bundle.test), batch, False)
        self.queries = datamodule.loader(bundle.test, batch, False)
        self.num_classes = bundle.info.num_classes
        self.train_images, self.test_images = len(bundle.train), len(bundle.test)

    def __call__(self, encoder: nn.Module) -> float:
        encoder.eval()
        return knn_accuracy(*pooled_features(encoder, self.bank), *pooled_features(encoder, self.queries),
                            num_classes=self.num_classes)


def autocast(config: RecipeConfig) -> torch.autocast:
    """The recipe's precision as Lightning applies it on the CPU (``bf16-mixed``: bfloat16 autocast)."""
    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=config.trainer.precision == "bf16-mixed")


# ------------------------------------------------------------------------------------ vitkit
class EpochClock(Callback):
    """Seconds from each training epoch's start to its last batch's end, and a copy of the encoder
    the last step left (the task's exported one: DINO's teacher backbone)."""

    def __init__(self) -> None:
        self.seconds: list[float] = []
        self.encoder: nn.Module | None = None
        self._start = self._last = 0.0

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._start = time.perf_counter()

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        self._last = time.perf_counter()

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.seconds.append(self._last - self._start)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.encoder = copy.deepcopy(pl_module.task.exported_model(pl_module.model))


def run_vitkit(method: str, overrides: list[str], seed: int, judge: KnnJudge) -> Result:
    clock = EpochClock()
    result = train(RECIPES[method], overrides, callbacks=[clock])
    notes = {"run_dir": str(result.run_dir), "summary_knn_acc1 (monitored checkpoint)": result.summary.get("knn_acc1")}
    return Result(method, "vitkit", seed, clock.seconds, judge(clock.encoder), notes)


# ------------------------------------------------------------------------------------ lightly
class PilImages(Dataset):
    """``uint8 [N, H, W, C]`` images as PIL images (what lightly's transforms take) through
    ``transform``, with their labels."""

    def __init__(self, images: np.ndarray, labels: np.ndarray, transform: Callable[[Image.Image], Any]) -> None:
        self.images, self.labels, self.transform = images, labels, transform

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        image = self.images[index]
        return self.transform(Image.fromarray(image[..., 0] if image.shape[-1] == 1 else image)), int(self.labels[index])


class LightlyMae(nn.Module):
    """lightly's MAE (its ``examples/pytorch/mae.py``) with the recipe's ``task.mae`` sizes;
    ``forward`` returns the loss: MSE over the masked patches' (per-patch normalised) pixels."""

    def __init__(self, vit: nn.Module, options: Any) -> None:
        from lightly.models.modules import MaskedVisionTransformerDecoderTIMM, MaskedVisionTransformerTIMM
        from lightly.models.modules.masked_vision_transformer_timm import init_weights

        super().__init__()
        self.mask_ratio, self.norm_pix_loss = options.mask_ratio, options.norm_pix_loss
        self.patch_size = vit.patch_embed.patch_size[0]
        self.backbone = MaskedVisionTransformerTIMM(vit=vit)
        self.sequence_length = self.backbone.sequence_length
        self.decoder_embed = nn.Linear(vit.embed_dim, options.decoder_dim)
        self.decoder = MaskedVisionTransformerDecoderTIMM(
            num_patches=vit.patch_embed.num_patches, embed_dim=options.decoder_dim, depth=options.decoder_depth,
            num_heads=options.decoder_heads, num_prefix_tokens=vit.num_prefix_tokens, mlp_ratio=4.0,
        )
        self.prediction_head = nn.Linear(options.decoder_dim, self.patch_size**2 * vit.patch_embed.proj.in_channels)
        self.decoder_embed.apply(init_weights)
        self.prediction_head.apply(init_weights)

    def decoder_parts(self) -> nn.Module:
        return nn.ModuleList([self.decoder_embed, self.decoder, self.prediction_head])

    def forward(self, images: torch.Tensor, order: torch.Tensor | None = None) -> torch.Tensor:
        """The loss of ``images``; ``order`` ``[B, 1 + L]`` (the class token, then the patches from
        first kept to last masked, as :func:`~lightly.models.utils.random_token_mask` sorts them)
        fixes the mask, which is otherwise drawn."""
        from lightly.models import utils

        if order is None:
            idx_keep, idx_mask = utils.random_token_mask(
                size=(len(images), self.sequence_length), mask_ratio=self.mask_ratio, device=images.device
            )
        else:
            kept = 1 + kept_count(self.sequence_length - 1, self.mask_ratio)
            idx_keep, idx_mask = order[:, :kept], order[:, kept:]
        encoded = self.decoder_embed(self.backbone.encode(images=images, idx_keep=idx_keep))
        tokens = encoded.new_zeros(len(images), self.sequence_length, encoded.shape[-1])
        decoded = self.decoder(utils.set_at_index(tokens, idx_keep, encoded), idx_mask=idx_mask)
        prediction = self.prediction_head(utils.get_at_index(decoded, idx_mask))
        target = utils.get_at_index(utils.patchify(images, self.patch_size), idx_mask - 1)  # no class token
        if self.norm_pix_loss:
            target = utils.normalize_mean_var(target, dim=-1)
        return F.mse_loss(prediction.float(), target.float())


class LightlyDino(nn.Module):
    """lightly's DINO (its ``examples/pytorch/dino.py``) with the recipe's ``task.dino`` head and
    temperatures; the teacher is a copy of the student (backbone and head), as DINO starts it."""

    def __init__(self, vit: nn.Module, options: Any) -> None:
        from lightly.loss import DINOLoss
        from lightly.models.modules import DINOProjectionHead
        from lightly.models.utils import deactivate_requires_grad

        super().__init__()
        head = {"input_dim": vit.embed_dim, "hidden_dim": options.hidden_dim, "bottleneck_dim": options.bottleneck_dim,
                "output_dim": options.out_dim, "norm_last_layer": options.norm_last_layer}
        self.student_backbone = vit
        self.student_head = DINOProjectionHead(**head, freeze_last_layer=options.freeze_last_layer_epochs)
        self.teacher_backbone, self.teacher_head = copy.deepcopy(vit), DINOProjectionHead(**head)
        self.teacher_head.load_state_dict(self.student_head.state_dict())  # its weight_norm cannot be deep-copied
        deactivate_requires_grad(self.teacher_backbone)
        deactivate_requires_grad(self.teacher_head)
        self.criterion = DINOLoss(
            output_dim=options.out_dim, warmup_teacher_temp=options.warmup_teacher_temp, teacher_temp=options.teacher_temp,
            warmup_teacher_temp_epochs=options.warmup_teacher_temp_epochs, student_temp=options.student_temp,
            center_momentum=options.center_momentum,
        )
        self.base_momentum = options.teacher_momentum

    def forward(self, views: list[torch.Tensor], epoch: int) -> torch.Tensor:
        with torch.no_grad():
            teacher = [self.teacher_head(self.teacher_backbone(view)) for view in views[:2]]
        student = [self.student_head(self.student_backbone(view)) for view in views]
        return self.criterion(teacher, student, epoch=epoch)

    def after_backward(self, epoch: int) -> None:
        self.student_head.cancel_last_layer_gradients(current_epoch=epoch)

    def after_step(self, step: int, total_steps: int) -> None:
        from lightly.models.utils import update_momentum
        from lightly.utils.scheduler import cosine_schedule

        momentum = cosine_schedule(step, total_steps, self.base_momentum, 1.0)
        update_momentum(self.student_backbone, self.teacher_backbone, m=momentum)
        update_momentum(self.student_head, self.teacher_head, m=momentum)


def lightly_mae(config: RecipeConfig, info: DataInfo, vit: nn.Module) -> tuple[LightlyMae, nn.Module, nn.Module, Callable]:
    """The MAE, its encoder, its other trainable parts, and the per-image transform (the recipe's
    pad-and-crop and flip)."""
    augment = config.data.augment
    model = LightlyMae(vit, config.task.options)
    transform = T.Compose([
        T.RandomCrop(info.img_size[0], padding=augment.padding), T.RandomHorizontalFlip(augment.hflip or 0.0),
        T.ToTensor(), T.Normalize(info.mean, info.std),
    ])
    return model, model.backbone.vit, model.decoder_parts(), transform


def lightly_dino(config: RecipeConfig, info: DataInfo, vit: nn.Module) -> tuple[LightlyDino, nn.Module, nn.Module, Callable]:
    """The DINO, its student backbone (the teacher's is evaluated), its head, and ``DINOTransform``."""
    from lightly.transforms import DINOTransform

    options = config.task.options
    model = LightlyDino(vit, options)
    transform = DINOTransform(
        global_crop_size=options.global_size or info.img_size[0], global_crop_scale=options.global_scale,
        local_crop_size=options.local_size, local_crop_scale=options.local_scale, n_local_views=options.local_crops,
        sigmas=BLUR_SIGMA, normalize={"mean": list(info.mean), "std": list(info.std)},
    )
    return model, model.student_backbone, model.student_head, transform


#: :class:`~vitkit.tasks.mae.MaeDecoder`'s parts by their :class:`LightlyMae` names.
LIGHTLY_DECODER_PARTS = {"embed": "decoder_embed", "pred": "prediction_head", "norm": "decoder.norm",
                         "blocks": "decoder.blocks", "mask_token": "decoder.mask_token"}


def lightly_decoder_name(name: str) -> str:
    """The :class:`LightlyMae` parameter that holds vitkit's decoder parameter ``name``."""
    part, dot, rest = name.partition(".")
    return LIGHTLY_DECODER_PARTS[part] + dot + rest


def mae_step_parity(config: RecipeConfig, datamodule: ViTDataModule, images: int = 16) -> dict[str, float]:
    """One MAE loss and backward pass of vitkit's task and of :class:`LightlyMae` on the same
    weights (vitkit's initial model, its timm twin, and vitkit's decoder copied into lightly's),
    the same ``images`` training images and the same masks: the losses and the largest gradient
    difference of the encoder's and the decoder's parameters. The decoder's sin-cos table is
    vitkit's on both sides (MAE's lists the same columns in another order: ``(sin y, cos y, sin x,
    cos x)`` blocks against MAE's ``(sin x, cos x, sin y, cos y)``)."""
    L.seed_everything(config.trainer.seed, verbose=False)
    model, vit_config = build_model(config, datamodule.info, None)
    task = MaeTask(vit_config, config.task.options)
    lightly = LightlyMae(to_timm(model), config.task.options)
    lightly.backbone.vit.load_state_dict(to_timm_state_dict(model))  # undo lightly's re-initialisation
    decoder = task.decoder
    for mine, theirs in ((decoder.embed, lightly.decoder_embed), (decoder.pred, lightly.prediction_head),
                         (decoder.norm, lightly.decoder.norm), (decoder.blocks, lightly.decoder.blocks)):
        theirs.load_state_dict(mine.state_dict())
    lightly.decoder.mask_token.data.copy_(decoder.mask_token)
    lightly.decoder.pos_embed.data.copy_(decoder.pos_embed)
    batch = next(iter(datamodule.loader(datamodule.bundle.train, images, False)))[0]
    noise = torch.rand(len(batch), vit_config.num_patches)
    order = torch.cat([torch.zeros(len(batch), 1, dtype=torch.long), 1 + noise.argsort(dim=1)], dim=1)
    vitkit_loss, lightly_loss = task.loss(model, batch, noise), lightly(batch, order)
    (vitkit_loss + lightly_loss).backward()
    gradients = copy.deepcopy(model)
    for held, param in zip(gradients.parameters(), model.parameters()):
        held.data = param.grad if param.grad is not None else torch.zeros_like(param)
    encoder_grads = to_timm_state_dict(gradients)
    encoder = max((p.grad - encoder_grads[name]).abs().max().item()
                  for name, p in lightly.backbone.vit.named_parameters() if p.grad is not None)
    theirs = dict(lightly.named_parameters())
    decoder_diff = max((p.grad - theirs[lightly_decoder_name(name)].grad).abs().max().item()
                       for name, p in decoder.named_parameters())
    return {"vitkit loss": vitkit_loss.item(), "lightly loss": lightly_loss.item(),
            "encoder grad max |diff|": encoder, "decoder grad max |diff|": decoder_diff}


def run_lightly(method: str, config: RecipeConfig, datamodule: ViTDataModule, judge: KnnJudge) -> Result:
    """lightly's ``method`` for the recipe's epochs, with vitkit's optimiser and schedule (lightly
    leaves both to its user), on the training images vitkit's run trained on. The recipe's seed
    seeds everything after the shared initial weights: lightly's re-initialisation, the data order,
    the augmentation and the masks (one generator, torch's global one)."""
    vit = initial_timm_encoder(config, datamodule)
    model, encoder, parts, transform = (lightly_mae if method == "mae" else lightly_dino)(config, datamodule.info, vit)
    train_split = datamodule.bundle.train
    loader = DataLoader(PilImages(train_split.images, train_split.labels, transform), batch_size=config.trainer.batch_size,
                        shuffle=True, drop_last=True, num_workers=config.data.num_workers)
    optim, epochs = config.optim, config.trainer.max_epochs
    total_steps = epochs * len(loader)
    optimizer = build_optimizer(encoder, optim, extra=parts)
    horizon = Horizon(round(optim.warmup_epochs * total_steps / epochs), total_steps, floor=optim.min_lr / optim.lr)
    scheduler = warmup_cosine(optimizer, horizon)
    trained = [p for group in optimizer.param_groups for p in group["params"]]
    seconds, step = [], 0
    model.train()
    for epoch in range(epochs):
        start = time.perf_counter()
        for views, _ in loader:
            with autocast(config):
                loss = model(views) if method == "mae" else model(views, epoch)
            loss.backward()
            if method == "dino":
                model.after_backward(epoch)
            if optim.clip_grad:
                nn.utils.clip_grad_norm_(trained, optim.clip_grad)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            if method == "dino":
                model.after_step(step, total_steps)
            step += 1
        seconds.append(time.perf_counter() - start)
        print(f"lightly {method} seed {config.trainer.seed} epoch {epoch}: loss {loss.item():.4f}, {seconds[-1]:.1f} s", flush=True)
    evaluated = model.backbone.vit if method == "mae" else model.teacher_backbone
    return Result(method, "lightly", config.trainer.seed, seconds, judge(evaluated), {"steps": step})


def equal_time_epochs(vitkit: Result, lightly: Result) -> int:
    """The most whole vitkit epochs that fit in lightly's training seconds (at vitkit's mean s/epoch)."""
    return int(sum(lightly.epoch_seconds) // statistics.mean(vitkit.epoch_seconds))


# ------------------------------------------------------------------------------------ main
def check_lightly(site: Path | None) -> None:
    """Put ``site`` first on ``sys.path`` and make sure lightly imports from there (or anywhere)."""
    if site is not None:
        sys.path.insert(0, str(site.expanduser().resolve()))
    if importlib.util.find_spec("lightly") is None:
        raise SystemExit("error: lightly is not importable: pip install --target DIR lightly==1.6.0 --no-deps, "
                         "then --lightly-site DIR (or pip install lightly in an environment of its own).")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=2, help="training epochs of every trainer (default 2)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0], metavar="S",
                        help="trainer.seed of each repeat (default 0): both sides' initial weights, data order, "
                             "augmentation and masks")
    parser.add_argument("--equal-time", action="store_true",
                        help="also train vitkit, at every seed, for the whole epochs that fit in lightly's training "
                             "seconds at the first seed (more than --epochs where vitkit's epochs are faster)")
    parser.add_argument("--libraries", nargs="+", choices=["vitkit", "lightly"], default=["vitkit", "lightly"],
                        help="the sides to train (default both; --equal-time needs both)")
    parser.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE",
                        help="more recipe overrides, for both sides (lightly's loop reads optim.*, data.augment.*, "
                             "task.*): a controlled experiment")
    parser.add_argument("--check-step", action="store_true",
                        help="only compare one MAE loss and backward pass of the two on the same weights, images "
                             "and masks (mae_step_parity), and exit")
    parser.add_argument("--limit", type=int, default=None, metavar="N",
                        help=f"train on N images (N // {CLASSES} of each class) instead of all 57,000: a smoke run")
    parser.add_argument("--methods", nargs="+", choices=list(RECIPES), default=list(RECIPES), help="default: both")
    parser.add_argument("--threads", type=int, default=2,
                        help="torch CPU threads of every trainer (default 2; 1 on a machine other work keeps busy)")
    parser.add_argument("--lightly-site", type=Path, default=None, metavar="DIR",
                        help="a folder lightly was installed into with pip install --target (put on sys.path)")
    parser.add_argument("--out", type=Path, default=Path("runs/lightly_comparison"), help="vitkit's runs and the results")
    args = parser.parse_args()
    if args.epochs < 1 or args.threads < 1 or (args.limit is not None and args.limit < CLASSES):
        parser.error(f"--epochs and --threads must be at least 1, --limit at least {CLASSES}.")
    if len(set(args.seeds)) != len(args.seeds):
        parser.error("--seeds must not repeat a seed.")
    if args.equal_time and len(args.libraries) < 2:
        parser.error("--equal-time compares the two libraries' time: leave --libraries at both.")
    return args


def compare(method: str, args: argparse.Namespace) -> tuple[list[Result], KnnJudge]:
    """vitkit and lightly (``--libraries``) on ``method`` at every seed, and vitkit at equal time
    with ``--equal-time``; the results and the evaluation."""
    results: list[Result] = []
    judge, time_epochs = None, None
    for seed in args.seeds:
        out = args.out / f"seed{seed}"
        overrides = recipe_overrides(args.epochs, args.limit, args.threads, out, seed) + args.set
        config, datamodule = prepared(method, overrides)
        judge = judge or KnnJudge(datamodule)  # the split and the test images do not depend on the seed
        pair = {}
        if "vitkit" in args.libraries:
            pair["vitkit"] = run_vitkit(method, overrides, seed, judge)
        if "lightly" in args.libraries:
            pair["lightly"] = run_lightly(method, config, datamodule, judge)
        results += pair.values()
        if args.equal_time:
            time_epochs = time_epochs or equal_time_epochs(pair["vitkit"], pair["lightly"])
            if time_epochs > args.epochs:
                longer = recipe_overrides(time_epochs, args.limit, args.threads, out, seed) + args.set
                results.append(run_vitkit(method, longer, seed, judge))
        print(markdown_table(summary_rows(results, args.seeds)), flush=True)
    return results, judge


def main() -> None:
    args = parse_args()
    check_lightly(args.lightly_site)
    torch.set_num_threads(args.threads)
    if args.check_step:
        config, datamodule = prepared("mae", recipe_overrides(args.epochs, args.limit, args.threads, args.out) + args.set)
        print(mae_step_parity(config, datamodule))
        return
    results: list[Result] = []
    for method in args.methods:
        method_results, judge = compare(method, args)
        results += method_results
    command = shlex.join(["python", "dev/lightly_comparison.py", *sys.argv[1:]])
    images, tests = judge.train_images, judge.test_images
    table = markdown_table(summary_rows(results, args.seeds))
    text = (f"{table}\n{images:,} training images, {args.threads} CPU thread(s), seeds {args.seeds}; "
            f"k-NN: k=20, T=0.07 on the {tests:,} test images.\n\n    {command}\n")
    print("\n" + text)
    for result in results:
        print(f"{result.method} {result.library} seed {result.seed}: s per epoch {[round(s, 1) for s in result.epoch_seconds]}, "
              f"k-NN {result.knn_acc1:.2f}, {result.notes}")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.md").write_text(text)
    write_json(args.out / "results.json", {"command": command, "train_images": images, "threads": args.threads,
                                           "seeds": args.seeds, "results": [dataclasses.asdict(r) for r in results]})


if __name__ == "__main__":
    main()
