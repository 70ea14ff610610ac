"""Each training option takes effect: a test here fails when the option is silently ignored.

Expected values are derived here from the options' definitions (the EMA recurrence, the cosine
formula, the Mixup convex combination), not read back from the code under test.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import pytest
import torch
from lightning.pytorch.plugins.precision import MixedPrecision
from tiny_runs import SHORT, Recorder, tiny_recipe

from vitkit.data import AugmentConfig, build_train_transform, datasets_for
from vitkit.data.info import DataInfo
from vitkit.io import load_model_and_extra
from vitkit.models import vision_transformer as vit_module
from vitkit.tasks import build_criterion
from vitkit.train import evaluate, load_recipe, train
from vitkit.train.datamodule import ViTDataModule
from vitkit.train.run import build_module

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(("precision", "dtype"), [("bf16-mixed", torch.bfloat16), ("32-true", torch.float32)])
def test_precision_sets_the_dtype_of_the_training_matmuls(tmp_path: Path, precision: str, dtype: torch.dtype) -> None:
    recorder = Recorder()
    train(tiny_recipe(tmp_path, precision=precision, **SHORT), callbacks=[recorder])
    assert recorder.activation_dtypes and set(recorder.activation_dtypes) == {dtype}


class AutocastSeen(L.Callback):
    """Whether CPU autocast is on during each training step's forward and at its backward and step."""

    def __init__(self) -> None:
        self.seen: dict[str, set[bool]] = {"forward": set(), "backward": set(), "step": set()}

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        pl_module.model.register_forward_hook(lambda *args: self.seen["forward"].add(torch.is_autocast_enabled("cpu")))

    def on_after_backward(self, *args: Any) -> None:
        self.seen["backward"].add(torch.is_autocast_enabled("cpu"))

    def on_before_optimizer_step(self, *args: Any) -> None:
        self.seen["step"].add(torch.is_autocast_enabled("cpu"))


def test_bf16_mixed_autocasts_the_forward_only(tmp_path: Path) -> None:
    """As Lightning's automatic loop: the backward, clipping and optimiser step run without autocast."""
    seen = AutocastSeen()
    train(tiny_recipe(tmp_path, precision="bf16-mixed", **SHORT), callbacks=[seen])
    assert seen.seen == {"forward": {True}, "backward": {False}, "step": {False}}


@pytest.mark.parametrize("enabled", [True, False])
def test_grad_checkpointing_switch_reaches_the_trained_blocks(tmp_path: Path, monkeypatch, enabled: bool) -> None:
    calls = []
    real_checkpoint = vit_module.checkpoint

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real_checkpoint(*args, **kwargs)

    monkeypatch.setattr(vit_module, "checkpoint", counting)
    recipe = tiny_recipe(tmp_path, **SHORT)
    recipe["model"]["grad_checkpointing"] = enabled
    train(recipe)
    depth, steps = 2, 4
    assert len(calls) == (depth * steps if enabled else 0)  # once per block per training step, never in eval


class StepGradients(L.Callback):
    """The global L2 norm of the gradients each optimiser step used (read after the step: the
    step leaves them as it found them, and the next step's zeroing comes later)."""

    def __init__(self) -> None:
        self.norms: list[float] = []

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        grads = [p.grad.float() for p in pl_module.parameters() if p.grad is not None]
        self.norms.append(float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))))


@pytest.mark.parametrize("clip", [1e-3, None])
def test_clip_grad_bounds_the_global_norm_of_every_step_s_gradients(tmp_path: Path, clip: float | None) -> None:
    seen = StepGradients()
    recipe = tiny_recipe(tmp_path, **SHORT)
    recipe["optim"]["clip_grad"] = clip
    train(recipe, callbacks=[seen])
    assert len(seen.norms) == SHORT["limit_train_batches"]
    if clip is None:
        assert min(seen.norms) > 1e-3 * 10  # what the clipped run bounds is far above the bound
    else:
        assert max(seen.norms) <= clip * (1 + 1e-4)
        assert min(seen.norms) >= clip * (1 - 1e-4)  # scaled down to the bound, not zeroed


def test_float16_gradients_are_clipped_after_the_loss_scale_is_taken_out(tmp_path: Path) -> None:
    """A loss scale of 2**16 (a CPU GradScaler, as Lightning's 16-mixed has on a GPU): the bound
    holds for the unscaled gradients; clipping the scaled ones would leave them 2**16 below it."""
    clip = 1e-3
    recipe = tiny_recipe(tmp_path, **SHORT)
    recipe["optim"]["clip_grad"] = clip
    config = load_recipe(recipe)
    data = ViTDataModule(config.data, config.trainer.batch_size, on_device=True)
    module, seen = build_module(config, data.info), StepGradients()
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
    trainer = L.Trainer(max_epochs=1, accelerator="cpu", plugins=[MixedPrecision("16-mixed", "cpu", scaler)], logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        limit_train_batches=4, limit_val_batches=0, callbacks=[seen])
    trainer.fit(module, datamodule=data)
    assert scaler.get_scale() == 2.0**16 and trainer.global_step == 4  # no step skipped for an overflow
    assert len(seen.norms) == 4 and all(clip * (1 - 1e-3) <= norm <= clip * (1 + 1e-3) for norm in seen.norms)


def test_ema_follows_its_recurrence_with_the_configured_decay(tmp_path: Path) -> None:
    decay = 0.6
    recorder = Recorder()
    recipe = tiny_recipe(tmp_path, **SHORT)
    recipe["optim"].update(ema=True, ema_decay=decay)
    train(recipe, callbacks=[recorder])
    # timm's ModelEmaV3 copies the weights at its first update, then EMA_k = d EMA_{k-1} + (1 - d) theta_k.
    expected = recorder.weights[0]
    for weights in recorder.weights[1:]:
        expected = decay * expected + (1 - decay) * weights
    torch.testing.assert_close(recorder.ema_weights[-1], expected, atol=1e-6, rtol=1e-5)
    assert not torch.allclose(recorder.ema_weights[-1], recorder.weights[-1])


def test_hflip_tta_scores_the_test_split_with_each_image_and_its_mirror(tmp_path: Path) -> None:
    recipe = tiny_recipe(tmp_path, **SHORT, tta="hflip")
    recipe["data"]["augment"] = {"enabled": True, "hflip": 0.5, "padding": 0}
    result = train(recipe)
    # the tested images (2 batches of 2 x 32, in order), scored here by hand with the exported model
    model, extra = load_model_and_extra(result.run_dir / "model.safetensors")
    bundle = datasets_for(model, extra)
    images = torch.stack([bundle.test[i][0] for i in range(2 * 2 * 32)])
    labels = torch.tensor([bundle.test[i][1] for i in range(2 * 2 * 32)])
    with torch.no_grad():
        plain, mirrored = model(images).softmax(-1), model(images.flip(-1)).softmax(-1)
    one_view = 100 * (plain.argmax(-1) == labels).float().mean().item()
    both = 100 * ((plain + mirrored).argmax(-1) == labels).float().mean().item()
    assert result.summary["test_acc"] == pytest.approx(both, abs=1e-3)
    assert result.summary["test_acc_one_view"] == pytest.approx(one_view, abs=1e-3)
    assert both != one_view  # the mirror changes some answers, so an ignored option cannot pass
    assert evaluate(result.run_dir / "model.safetensors")["top1"] != evaluate(
        result.run_dir / "model.safetensors", tta="none")["top1"]  # the option is saved with the model


def test_hflip_shift_tta_scores_the_test_split_with_ten_views_and_val_tta_validation_with_one(tmp_path: Path) -> None:
    recipe = tiny_recipe(tmp_path, **{**SHORT, "limit_train_batches": 45}, max_epochs=3, tta="hflip_shift", val_tta="none")
    recipe["data"]["augment"] = {"enabled": True, "hflip": 0.5, "crop": "pad", "padding": 1}
    result = train(recipe)
    model, extra = load_model_and_extra(result.run_dir / "model.safetensors")
    bundle = datasets_for(model, extra)
    fill = torch.tensor([-m / s for m, s in zip(extra["mean"], extra["std"])]).view(1, -1, 1, 1)

    def scored(split: Any, count: int) -> tuple[float, float, float]:
        """One-view, 2-view (image and mirror) and 10-view accuracy of the first ``count`` images,
        views cut by hand."""
        images = torch.stack([split[i][0] for i in range(count)])
        labels = torch.tensor([split[i][1] for i in range(count)])
        padded = torch.nn.functional.pad(images - fill, (1, 1, 1, 1)) + fill
        crops = [padded[..., top : top + 8, left : left + 8] for top, left in [(1, 1), (0, 1), (2, 1), (1, 0), (1, 2)]]
        with torch.no_grad():
            probs = [model(view).softmax(-1) for crop in crops for view in (crop, crop.flip(-1))]
        one = 100 * (probs[0].argmax(-1) == labels).float().mean().item()
        two = 100 * ((probs[0] + probs[1]).argmax(-1) == labels).float().mean().item()
        ten = 100 * (sum(probs).argmax(-1) == labels).float().mean().item()
        return one, two, ten

    test_one, test_two, test_ten = scored(bundle.test, 2 * 2 * 32)  # the tested images: 2 batches of 2 x 32, in order
    assert result.summary["test_acc"] == pytest.approx(test_ten, abs=1e-3)
    assert result.summary["test_acc_one_view"] == pytest.approx(test_one, abs=1e-3)
    assert result.summary["test_acc_mirrored"] == pytest.approx(test_two, abs=1e-3)
    assert len({test_one, test_two, test_ten}) == 3  # the mirror and the moved views each change some answers
    assert (result.summary["tta"], result.summary["val_tta"]) == ("hflip_shift", "none")
    val_one = scored(bundle.val, 2 * 2 * 32)[0]  # 2 batches of 2 x 32 too
    assert result.summary["val_acc"] == pytest.approx(val_one, abs=1e-3)
    with open(result.run_dir / "metrics.csv") as rows:
        columns = next(csv.reader(rows))
    # every epoch validated one view (no averaged views to log one beside); the test logged both
    assert "val/acc1" in columns and "val/acc1_one_view" not in columns and "test/acc1_one_view" in columns


def test_learning_rate_follows_linear_warmup_then_cosine(tmp_path: Path) -> None:
    recorder = Recorder()
    recipe = tiny_recipe(tmp_path, max_epochs=2, limit_train_batches=10, limit_val_batches=1, limit_test_batches=1)
    recipe["optim"].update(lr=0.01, min_lr=0.001, warmup_epochs=0.5)
    train(recipe, callbacks=[recorder])
    total, warmup = 20, 5
    expected = [0.01 * (t + 1) / warmup if t < warmup else
                0.001 + (0.01 - 0.001) * 0.5 * (1 + math.cos(math.pi * (t - warmup) / (total - warmup)))
                for t in range(total)]
    assert recorder.lrs == pytest.approx(expected, rel=1e-6)
    assert recorder.lrs[12] == pytest.approx(0.001 + 0.009 * 0.5 * (1 + math.cos(math.pi * 7 / 15)))


def test_mixup_mixes_pairs_convexly_and_cutmix_pastes_boxes() -> None:
    torch.manual_seed(0)
    images = torch.randn(8, 1, 8, 8)
    labels = torch.arange(8) % 4
    mixup, _ = build_criterion(4, mixup=0.8, cutmix=0.0, label_smoothing=0.0)
    mixed, targets = mixup(images.clone(), labels)
    lam = targets[0, labels[0]].item()  # timm mixes image i with image B-1-i with weight lam
    torch.testing.assert_close(mixed, lam * images + (1 - lam) * images.flip(0))
    assert 0 < lam < 1 and torch.allclose(targets.sum(1), torch.ones(8))
    cutmix, _ = build_criterion(4, mixup=0.0, cutmix=1.0, label_smoothing=0.0)
    cut, _ = cutmix(images.clone(), labels)
    from_self = torch.isclose(cut, images)
    from_partner = torch.isclose(cut, images.flip(0))
    assert bool((from_self | from_partner).all()) and bool(from_partner.any()) and bool(from_self.any())


def _info() -> DataInfo:
    return DataInfo(10, tuple("abcdefghij"), (16, 16), 3, (0.5,) * 3, (0.25,) * 3, "test")


def test_rand_augment_policy_changes_images_and_its_absence_does_not() -> None:
    rng = np.random.default_rng(0)
    image = rng.integers(0, 255, (16, 16, 3), dtype=np.uint8)
    plain = AugmentConfig(crop="resize", hflip=0.0)
    policy = AugmentConfig(crop="resize", hflip=0.0, rand_augment="rand-m9-n2-mstd0")
    reference = build_train_transform(plain, _info())(image)
    with_policy = build_train_transform(policy, _info())
    changed = sum(not torch.equal(with_policy(image), reference) for _ in range(200))
    # timm's RandAugment fires each of its n=2 ops with probability 0.5: at least one fires in 75%
    # of draws (150 of 200, binomial std 6); a dropped policy would change none.
    assert 120 <= changed <= 180
    assert all(torch.equal(build_train_transform(plain, _info())(image), reference) for _ in range(5))


@pytest.mark.parametrize("rate", [0.0, 0.5])
def test_flip_and_jitter_are_applied_at_their_rates(rate: float) -> None:
    image = np.tile(np.arange(16, dtype=np.uint8)[None, :, None] * 10, (16, 1, 3))
    transform = build_train_transform(AugmentConfig(crop="resize", hflip=rate), _info())
    outputs = [transform(image) for _ in range(400)]
    flipped = sum(bool(out[0, 0, 0] > out[0, 0, -1]) for out in outputs)
    assert abs(flipped / 400 - rate) < 0.08  # binomial std at n=400 is <= 0.025
    jitter = build_train_transform(AugmentConfig(crop="resize", hflip=0.0, color_jitter=0.4), _info())
    base = build_train_transform(AugmentConfig(crop="resize", hflip=0.0), _info())(image)
    assert sum(not torch.allclose(jitter(image), base) for _ in range(20)) >= 19
