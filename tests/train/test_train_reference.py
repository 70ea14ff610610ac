"""Training on MNIST-format files, timm's model as a reference (``model.impl: timm``),
``trainer.compile`` and the time-to-accuracy measurement."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest
import timm
import torch
import yaml
from mnist_files import fabricate_mnist

from vitkit.data import build_datasets
from vitkit.io import load_model
from vitkit.train import load_recipe, train
from vitkit.train.kernel_trial import STEPS_TO_CHOOSE
from vitkit.train.run import build_module
from vitkit.train.time_to_accuracy import AccuracyPoint, TestAccuracyTimer, accuracy_at, summarise, time_to_reach

pytestmark = pytest.mark.slow


def mnist_recipe(root: Path, out: Path, **trainer: object) -> dict:
    """A 2-block, 32-wide ViT on fabricated 28x28 Fashion-MNIST files (7x7 patches)."""
    return {
        "name": "fmnist_tiny",
        "model": {"name": "vit_cifar_tiny", "patch_size": 7, "embed_dim": 32, "depth": 2, "num_heads": 2,
                  "mlp_ratio": 2.0},
        "data": {"name": "fashion_mnist", "root": str(root), "num_workers": 0, "val_fraction": 0.2},
        "optim": {"lr": 1e-2, "warmup_epochs": 0.5},
        "trainer": {"max_epochs": 1, "batch_size": 16, "accelerator": "cpu", "enable_progress_bar": False,
                    "num_sanity_val_steps": 0, "log_every": 1, "num_threads": 1, **trainer},
        "output": {"dir": str(out)},
    }


@pytest.fixture(scope="module")
def fmnist_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fmnist")
    fabricate_mnist(root, per_class=12, test_per_class=4)
    return root


def test_one_epoch_on_fashion_mnist_files_trains_and_tests_on_the_official_test_set(
    fmnist_root: Path, tmp_path: Path
) -> None:
    result = train(mnist_recipe(fmnist_root, tmp_path, max_epochs=6))
    assert result.summary["dataset"] == "fashion_mnist"
    assert result.summary["global_steps"] == 6 * (96 // 16)  # 96 training images after the 20% hold-out
    assert result.summary["test_acc"] > 30.0  # chance is 10%; the classes differ in brightness
    rows = list(csv.DictReader(open(result.run_dir / "metrics.csv")))
    assert any(row.get("test/acc1") for row in rows)


def test_timm_reference_trains_timms_model_and_exports_it_as_vitkit(fmnist_root: Path, tmp_path: Path) -> None:
    recipe = mnist_recipe(fmnist_root, tmp_path)
    recipe["model"]["impl"] = "timm"
    config = load_recipe(recipe)
    module = build_module(config, build_datasets(config.data).info)
    assert isinstance(module.model, timm.models.vision_transformer.VisionTransformer)
    result = train(recipe)
    exported = load_model(result.run_dir / "model.safetensors").eval()
    images = torch.randn(4, 1, 28, 28)
    twin = timm.models.vision_transformer.VisionTransformer(
        img_size=28, patch_size=7, in_chans=1, num_classes=10, embed_dim=32, depth=2, num_heads=2, mlp_ratio=2.0
    ).eval()
    ckpt = torch.load(result.summary["best_checkpoint"], weights_only=True)["state_dict"]
    twin.load_state_dict({k.removeprefix("model."): v for k, v in ckpt.items() if k.startswith("model.")})
    torch.testing.assert_close(exported(images), twin(images), atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="no C compiler for inductor")
def test_compile_option_compiles_the_trained_model(fmnist_root: Path, tmp_path: Path, monkeypatch) -> None:
    from vitkit.train import run as run_lib

    built = []
    original = run_lib.build_module

    def spy(*args: object, **kwargs: object):
        module = original(*args, **kwargs)
        built.append(module)
        return module

    monkeypatch.setattr(run_lib, "build_module", spy)
    # compiled once the attention kernel is chosen (STEPS_TO_CHOOSE steps), then kept untimed
    result = train(mnist_recipe(fmnist_root, tmp_path, compile=True, batch_size=4, limit_train_batches=STEPS_TO_CHOOSE + 2))
    assert result.summary["compiled"] is True and result.summary["compile"]["round"]["step"] == STEPS_TO_CHOOSE
    assert result.summary["compile"]["round"]["pairs"] == []
    assert built[0].model._compiled_call_impl is not None  # nn.Module.compile() took effect
    assert all(not name.startswith("model._orig_mod") for name in built[0].state_dict())
    result = train(mnist_recipe(fmnist_root, tmp_path / "eager", limit_train_batches=2))
    assert result.summary["compiled"] is False and built[1].model._compiled_call_impl is None
    assert "compile" not in result.summary


def test_accuracy_timer_records_every_n_steps_and_the_end(fmnist_root: Path, tmp_path: Path) -> None:
    timer = TestAccuracyTimer(every_n_steps=4)
    train(mnist_recipe(fmnist_root, tmp_path, max_epochs=2), callbacks=[timer])
    assert [p.step for p in timer.points] == [4, 8, 12]
    assert all(b.seconds > a.seconds for a, b in zip(timer.points, timer.points[1:]))
    # 40 test images: every accuracy is a multiple of 2.5%, so the whole test split was counted.
    assert all(0.0 <= p.accuracy <= 100.0 and (p.accuracy / 2.5) == pytest.approx(round(p.accuracy / 2.5))
               for p in timer.points)


def test_time_to_reach_and_accuracy_at_read_the_curve() -> None:
    points = [AccuracyPoint(10, 1, 70.0), AccuracyPoint(20, 2, 84.0), AccuracyPoint(30, 3, 86.5)]
    assert time_to_reach(points, 85.0) == 30 and time_to_reach(points, 84.0) == 20
    assert time_to_reach(points, 90.0) is None
    assert accuracy_at(points, 25) == 84.0 and accuracy_at(points, 5) is None
    rows = summarise({"a": points}, (80.0, 85.0), budget_s=15)
    assert rows == [{"model": "a", "time_to_80_s": 20, "time_to_85_s": 30, "acc_at_budget": 70.0,
                     "final_acc": 86.5, "train_s": 30}]


def test_time_to_accuracy_tool_writes_curves_table_and_figure(fmnist_root: Path, tmp_path: Path, load_tool) -> None:
    tool = load_tool("time_to_accuracy")
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump(mnist_recipe(fmnist_root, tmp_path / "runs")))
    out = tmp_path / "tta"
    code = tool.main([str(recipe), "--eval-every", "3", "--targets", "20", "--out", str(out)])
    assert code == 0
    rows = list(csv.DictReader(open(out / "curves.csv")))
    assert {row["model"] for row in rows} == {"vitkit", "timm"}
    assert [int(r["step"]) for r in rows if r["model"] == "timm"] == [3, 6]
    summary = json.loads((out / "summary.json").read_text())
    assert [row["model"] for row in summary["rows"]] == ["vitkit", "timm"]
    assert (out / "time_to_accuracy.png").stat().st_size > 10_000



def test_init_ablation_tool_trains_every_variant_per_seed(fmnist_root: Path, tmp_path: Path, load_tool) -> None:
    tool = load_tool("init_ablation")
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump(mnist_recipe(fmnist_root, tmp_path / "runs", limit_train_batches=2)))
    out = tmp_path / "ablation"
    assert tool.main([str(recipe), "--seeds", "0", "1", "--out", str(out), "trainer.log_every=2"]) == 0
    rows = list(csv.DictReader(open(out / "runs.csv")))
    labels = [label for label, _, _ in tool.variants(with_parts=True)]
    assert [row["variant"] for row in rows] == labels * 2 and len(labels) == 4 + 4
    assert {row["steps"] for row in rows} == {"2"}
    table = (out / "table.md").read_text()
    assert all(f"| {label} | 2 |" in table for label in labels)


def test_init_ablation_of_a_conv_stem_recipe_adds_the_plain_vit_and_trains_timm_as_it(load_tool) -> None:
    tool = load_tool("init_ablation")
    recipe = yaml.safe_load(Path("recipes/fashion_mnist.yaml").read_text())
    recipe["model"].update(patch_embed="conv", patch_size=8, shifted_patches=False)
    recipe["data"]["img_size"] = 32
    rows = tool.variants(with_parts=False, plain=tool.timm_twin_overrides(load_recipe(recipe)))
    assert [label for label, _, _ in rows] == [
        "vitkit default", "timm scheme", "jax scheme", "plain ViT, vitkit default", "plain ViT, timm scheme",
        "timm VisionTransformer",
    ]
    built = {label: load_recipe(recipe, overrides) for label, overrides, _ in rows}
    assert built["vitkit default"].model.patch_embed == "conv" and built["timm scheme"].model.init == "timm"
    for label in ("plain ViT, vitkit default", "plain ViT, timm scheme", "timm VisionTransformer"):
        model = built[label].model  # loads: the timm reference is not refused
        assert (model.patch_embed, model.locality, model.shifted_patches) == ("linear", False, False)
    assert built["timm VisionTransformer"].model.impl == "timm"


def test_init_ablation_can_stop_early_in_the_recipes_own_schedule(fmnist_root: Path, tmp_path: Path,
                                                                   load_tool, capsys) -> None:
    tool = load_tool("init_ablation")
    recipe = mnist_recipe(fmnist_root, tmp_path / "runs", limit_train_batches=4)
    recipe["trainer"]["max_epochs"] = 4
    recipe["optim"] = {**recipe.get("optim", {}), "lr": 1e-3, "warmup_epochs": 1, "min_lr": 1e-5}
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(recipe))
    out = tmp_path / "ablation"
    assert tool.main([str(path), "--variants", "vitkit default", "jax", "--out", str(out)]) == 2
    assert "error: --variants 'jax' is no variant of this recipe; choose from: 'vitkit default'" in capsys.readouterr().err
    assert not out.exists()  # refused before anything was claimed or trained
    assert tool.main([str(path), "--seeds", "0", "--variants", "timm scheme", "--stop-after-epochs", "1", "--out",
                      str(out), "trainer.log_every=1"]) == 0
    rows = list(csv.DictReader(open(out / "runs.csv")))
    assert [row["variant"] for row in rows] == ["timm scheme"]
    assert {row["steps"] for row in rows} == {"4"}  # one epoch of 4 batches, of a 16-step schedule
    metrics = next((out / "runs").glob("*/*/logs/version_0/metrics.csv"))
    rates = [float(row["lr/pg1"]) for row in csv.DictReader(open(metrics)) if row.get("lr/pg1")]
    # warm-up over the first epoch's 4 steps to 1e-3, then cosine over the 12 left: the last step
    # trained at the peak, where max_epochs=1 would have decayed it to min_lr by then
    assert rates[-1] == pytest.approx(1e-3)


def test_init_override_reinitialises_only_its_part_before_training(fmnist_root: Path, tmp_path: Path,
                                                                    load_tool) -> None:
    tool = load_tool("init_ablation")
    config = load_recipe(mnist_recipe(fmnist_root, tmp_path))
    module = build_module(config, build_datasets(config.data).info)
    before = {name: tensor.clone() for name, tensor in module.model.state_dict().items()}
    tool.InitOverride("timm", ("qkv",)).on_fit_start(None, module)
    changed = {name for name, tensor in module.model.state_dict().items() if not torch.equal(tensor, before[name])}
    assert changed == {"blocks.0.attn.qkv.weight", "blocks.1.attn.qkv.weight"}


def test_time_to_accuracy_adds_a_plain_vitkit_run_when_timm_cannot_match_the_recipe(
    fmnist_root: Path, tmp_path: Path, load_tool
) -> None:
    tool = load_tool("time_to_accuracy")
    recipe = mnist_recipe(fmnist_root, tmp_path)
    assert list(tool.runs_to_make(load_recipe(recipe), ["vitkit", "timm"])) == ["vitkit", "timm"]
    recipe["model"]["shifted_patches"] = True
    runs = tool.runs_to_make(load_recipe(recipe), ["vitkit", "timm"])
    assert list(runs) == ["vitkit", "vitkit (plain ViT)", "timm"]
    assert "model.shifted_patches=false" in runs["timm"] and "model.shifted_patches=false" in runs["vitkit (plain ViT)"]
    assert runs["vitkit"] == ["model.impl=vitkit"]
    recipe["model"] = {**recipe["model"], "shifted_patches": False, "patch_embed": "conv", "patch_size": 4}
    runs = tool.runs_to_make(load_recipe(recipe), ["vitkit", "timm"])
    assert list(runs) == ["vitkit", "vitkit (plain ViT)", "timm"] and "model.patch_embed=linear" in runs["timm"]
    load_recipe(recipe, runs["timm"])  # what timm's VisionTransformer can be


def test_timm_reference_with_options_timm_lacks_is_refused_before_training() -> None:
    from vitkit.train import RecipeError

    with pytest.raises(RecipeError, match="also set model.shifted_patches=false model.locality=false"):
        load_recipe("recipes/fashion_mnist.yaml", ["model.impl=timm"])
    load_recipe("recipes/fashion_mnist.yaml", ["model.impl=timm", "model.shifted_patches=false",
                                              "model.locality=false"])
