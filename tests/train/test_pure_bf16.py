"""``trainer.precision: bf16-true``: a bfloat16 copy runs the steps, the float32 model keeps every
update (:mod:`vitkit.train.pure_bf16`), and a run through ``vitkit.train`` trains that way."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from mnist_files import fabricate_mnist
from tiny_runs import tiny_recipe

import vitkit
from vitkit.io import load_model
from vitkit.layers import AttentionBase
from vitkit.train import RecipeError, load_recipe, train
from vitkit.train.compile_trial import CompileChooser
from vitkit.train.datamodule import ViTDataModule
from vitkit.train.kernel_trial import TrainingKernelChooser
from vitkit.train.pure_bf16 import PureBf16
from vitkit.train.run import build_module


def conv_stem_model() -> vitkit.VisionTransformer:
    """A 2-block ViT on 16x16 images with the convolutional stem (BatchNorm), in training mode."""
    torch.manual_seed(0)
    return vitkit.create_model("vit_cifar_tiny", img_size=16, patch_size=8, patch_embed="conv", embed_dim=32, depth=2,
                               num_heads=2, num_classes=4, attn_impl="explicit").train()


def batch(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(6, 3, 16, 16, generator=generator), torch.randint(0, 4, (6,), generator=generator)


def test_the_copy_runs_in_bfloat16_with_autocast_off_and_returns_float32() -> None:
    model = conv_stem_model().eval()
    pure = PureBf16(model).eval()
    images, _ = batch(0)
    # the reference: the model's weights rounded to bfloat16 (BatchNorm's kept float32), no autocast
    reference = copy.deepcopy(model).bfloat16()
    for module in reference.modules():
        if isinstance(module, torch.nn.BatchNorm2d):
            module.float()
    # autocast off inside (on a GPU it would run LayerNorm and softmax in float32), bfloat16 blocks
    seen = []
    pure.model.blocks[0].register_forward_pre_hook(
        lambda module, args: seen.append((torch.is_autocast_enabled("cpu"), args[0].dtype)))
    with torch.autocast("cpu", dtype=torch.bfloat16):  # a bf16-mixed run's training step is inside one
        out = pure(images)
    assert out.dtype == torch.float32 and seen == [(False, torch.bfloat16)]
    assert torch.equal(out, reference(images.bfloat16()).float())


def test_weights_are_taken_from_the_model_and_gradients_summed_into_it_in_float32() -> None:
    model = conv_stem_model()
    pure = PureBf16(model)
    with torch.no_grad():
        model.head.weight.add_(0.25)
    pure.load_weights()
    assert torch.equal(pure.model.head.weight, model.head.weight.bfloat16())
    grads = []
    for seed in (1, 2):  # two micro-batches, as with gradient accumulation
        images, labels = batch(seed)
        F.cross_entropy(pure(images), labels).backward()
        grads.append({name: param.grad.clone() for name, param in pure.model.named_parameters()})
        pure.move_grads()
        assert all(param.grad is None for param in pure.model.parameters())
    for name, param in model.named_parameters():
        assert param.grad.dtype == torch.float32
        assert torch.equal(param.grad, grads[0][name].float() + grads[1][name].float()), name
    # the sum in bfloat16 would have rounded: float32 keeps what it drops
    assert any(not torch.equal(grads[0][name].float() + grads[1][name].float(), (grads[0][name] + grads[1][name]).float())
               for name in grads[0])


def test_batchnorm_statistics_are_the_models_own_and_stay_float32() -> None:
    model = conv_stem_model()
    pure = PureBf16(model)
    norms = [module for module in model.modules() if isinstance(module, torch.nn.BatchNorm2d)]
    assert norms
    before = [norm.running_mean.clone() for norm in norms]
    pure(batch(0)[0])
    for norm, old in zip(norms, before):
        assert norm.running_mean.dtype == torch.float32 and not torch.equal(norm.running_mean, old)
        assert int(norm.num_batches_tracked) == 1


def test_after_a_move_the_copy_shares_the_moved_statistics_and_takes_newly_unfrozen_weights() -> None:
    model = conv_stem_model()
    pure = PureBf16(model)
    model.head.requires_grad_(False)
    moved = lambda tensor: tensor.clone()  # noqa: E731 - what a device move does: new buffer tensors, the same modules
    pure._apply(moved)
    model._apply(moved)
    pure.load_weights()
    pure(batch(0)[0])
    norms = [(copied, original) for copied, original in zip(pure.model.modules(), model.modules())
             if isinstance(original, torch.nn.BatchNorm2d)]
    assert norms and all(copied.running_mean is original.running_mean for copied, original in norms)
    assert int(norms[0][1].num_batches_tracked) == 1
    with torch.no_grad():
        model.head.weight.add_(0.25)
    pure.load_weights()
    assert not torch.equal(pure.model.head.weight, model.head.weight.bfloat16())  # frozen: not copied
    model.head.requires_grad_(True)  # a fine-tuning schedule unfreezes it
    pure.load_weights()
    assert torch.equal(pure.model.head.weight, model.head.weight.bfloat16())


def test_float32_master_weights_keep_updates_a_bfloat16_weight_drops() -> None:
    """An AdamW step moves each weight by about lr; at lr 1e-4 that is under half the last bit of a
    bfloat16 weight near 1 (2**-8), so bfloat16 weights never move and the master weights do."""
    model = conv_stem_model()
    with torch.no_grad():
        model.head.weight.fill_(1.0)
    naive = copy.deepcopy(model).bfloat16()
    for module in naive.modules():
        if isinstance(module, torch.nn.BatchNorm2d):
            module.float()
    pure = PureBf16(model)
    master_opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.0)
    naive_opt = torch.optim.AdamW(naive.parameters(), lr=1e-4, weight_decay=0.0)
    for step in range(10):
        images, labels = batch(step)
        pure.load_weights()
        F.cross_entropy(pure(images), labels).backward()
        pure.move_grads()
        master_opt.step()
        master_opt.zero_grad()
        F.cross_entropy(naive(images.bfloat16()).float(), labels).backward()
        naive_opt.step()
        naive_opt.zero_grad()
    assert torch.equal(naive.head.weight, torch.ones_like(naive.head.weight))
    moved = (model.head.weight - 1.0).abs()
    assert moved.max() > 5e-4 and moved.max() <= 10 * 1e-4 * 1.01  # Adam: at most lr per step


def fmnist_recipe(root: Path, out: Path, **trainer: Any) -> dict:
    return {
        "name": "bf16_true",
        "model": {"name": "vit_cifar_tiny", "patch_size": 7, "embed_dim": 32, "depth": 2, "num_heads": 2, "mlp_ratio": 2.0},
        "data": {"name": "fashion_mnist", "root": str(root), "num_workers": 0, "val_fraction": 0.2},
        "optim": {"lr": 1e-2, "warmup_epochs": 0.5, "ema": True, "ema_decay": 0.9, "clip_grad": 1.0},
        "trainer": {"max_epochs": 2, "batch_size": 16, "accelerator": "cpu", "enable_progress_bar": False,
                    "num_sanity_val_steps": 0, "log_every": 1, "num_threads": 1, "precision": "bf16-true", **trainer},
        "output": {"dir": str(out)},
    }


class StepSpy(L.Callback):
    """Records, in each training step, the dtype of the first block's input and the kernel policy
    of the attention layers the step runs (as its forward reaches them), and the dtype of the
    module's own weights."""

    def __init__(self) -> None:
        self.inputs: list[torch.dtype] = []
        self.kernels: list[set[str]] = []
        self.weights: list[torch.dtype] = []

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        layers = [m for m in pl_module.step_model.modules() if isinstance(m, AttentionBase)]

        def record(module: torch.nn.Module, args: tuple) -> None:
            self.inputs.append(args[0].dtype)
            self.kernels.append({layer.attn_impl for layer in layers})

        pl_module.step_model.blocks[0].register_forward_pre_hook(record)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        self.weights.append(pl_module.model.head.weight.dtype)


@pytest.fixture(scope="module")
def fmnist_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fmnist")
    fabricate_mnist(root, per_class=8, test_per_class=2)
    return root


@pytest.mark.slow
def test_a_bf16_true_run_steps_in_bfloat16_and_keeps_float32_weights(fmnist_root: Path, tmp_path: Path) -> None:
    spy = StepSpy()
    result = train(fmnist_recipe(fmnist_root, tmp_path), callbacks=[spy])
    steps = result.summary["global_steps"]
    assert steps >= 4
    assert spy.inputs == [torch.bfloat16] * steps  # bf16-mixed's residual stream would be float32
    assert spy.weights == [torch.float32] * steps
    assert all("auto" not in kernels for kernels in spy.kernels)  # the kernel trial set the copy's layers
    assert result.summary["precision"] == "bf16-true"
    checkpoint = torch.load(result.summary["best_checkpoint"], weights_only=True)
    weights = {key: value for key, value in checkpoint["state_dict"].items() if value.is_floating_point()}
    assert weights and {value.dtype for value in weights.values()} == {torch.float32}
    assert not any(key.startswith("pure_bf16") for key in checkpoint["state_dict"])
    exported = load_model(result.run_dir / "model.safetensors")
    assert {param.dtype for param in exported.parameters()} == {torch.float32}
    torch.manual_seed(0)  # the weights trained: the exported (EMA) model is not the initial one
    initial = vitkit.create_model("vit_cifar_tiny", img_size=28, in_chans=1, patch_size=7, embed_dim=32, depth=2,
                                  num_heads=2, mlp_ratio=2.0, num_classes=10)
    assert not torch.equal(exported.head.weight, initial.head.weight)


@pytest.mark.parametrize(("change", "message"), [
    ({"trainer": {"strategy": "ddp"}}, "trains on one device"),
    ({"trainer": {"devices": 2}}, "trains on one device"),
    ({"task": {"name": "mae"}, "optim": {"ema": False, "clip_grad": None}}, "task.name is 'mae'"),
])
def test_bf16_true_refuses_what_it_cannot_train(fmnist_root: Path, tmp_path: Path, change: dict, message: str) -> None:
    recipe = fmnist_recipe(fmnist_root, tmp_path)
    for section, values in change.items():
        recipe.setdefault(section, {}).update(values)
    with pytest.raises(RecipeError, match=message):
        load_recipe(recipe)


def test_the_compile_trial_compiles_the_copy_the_steps_run(tmp_path: Path) -> None:
    config = load_recipe(tiny_recipe(tmp_path, precision="bf16-true"))
    module = build_module(config, ViTDataModule(config.data, config.trainer.batch_size).info)
    compiled = []
    CompileChooser(TrainingKernelChooser(), compile_model=compiled.append).setup(None, module, "fit")
    assert compiled == [module.pure_bf16.model] and module.step_model is module.pure_bf16.model
