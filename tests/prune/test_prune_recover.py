"""Prune -> recover: ``vitkit prune --recover-epochs N`` fine-tunes pruned models with the model's
recipe at a fine-tuning learning rate, keeps their head counts, and reports accuracy before and
after recovery (summary.json, curves.csv, curves.png); ``recover_steps`` measures what a
``recover`` function returns."""

from __future__ import annotations

import copy
import csv
import json
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from tiny_models import hand_accuracy, tiny_model, toy_batches
from tiny_runs import short_recipe, tiny_recipe

from vitkit import load_model, save_model
from vitkit.data import datasets_for
from vitkit.io import load_model_and_extra
from vitkit.models import VisionTransformer, ViTConfig
from vitkit.prune import (
    PruningStep,
    RecipeRecovery,
    RecoveredStep,
    iterative_pruning,
    prune_heads,
    pruning_record,
    recover_model,
    recover_steps,
)
from vitkit.prune.report import pruning_curves_figure
from vitkit.train import load_recipe, train

#: The tiny recipe's peak learning rate; recovery's default is a tenth of it.
RECIPE_LR = tiny_recipe(Path("."))["optim"]["lr"]
#: Quick pruning: halve the heads per step, one random order, few timing rounds.
QUICK = ["--step-fraction", "0.5", "--random-seeds", "1", "--rounds", "2", "--num-threads", "1"]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A training run of the tiny recipe (2 blocks of 4 heads, a few steps): model and config.yaml."""
    folder = tmp_path_factory.mktemp("trained")
    return train(short_recipe(folder / "runs"), ["model.num_heads=4"]).run_dir


def prune(load_tool, *args: str) -> int:
    return load_tool("prune_heads").main([*args, *QUICK])


def read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def run_config(run: str) -> dict:
    return yaml.safe_load((Path(run) / "config.yaml").read_text())


def weights_differ(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    return any(not torch.equal(x, b.state_dict()[key]) for key, x in a.state_dict().items())


@pytest.mark.slow
def test_recovery_fine_tunes_the_chosen_pruned_model_with_its_recipe_at_a_tenth_of_the_lr(
    run_dir: Path, tmp_path: Path, load_tool
) -> None:
    out = tmp_path / "prune"
    assert prune(load_tool, "--checkpoint", str(run_dir / "model.safetensors"), "--out", str(out),
                 "--max-drop", "100", "--recover-epochs", "1") == 0
    summary = json.loads((out / "summary.json").read_text())
    (step,) = summary["recovery"]["steps"]  # end: the chosen step only
    assert step["heads_left"] == summary["heads"][1]
    config = run_config(step["run_dir"])
    assert config["optim"]["lr"] == pytest.approx(RECIPE_LR / 10) and config["optim"]["warmup_epochs"] == 0
    assert config["model"]["pretrained"] == str(out / "recover" / f"step_{step['step']}" / "pruned.safetensors")
    assert config["trainer"]["max_epochs"] == 1 and config["data"]["name"] == "digits"
    assert json.loads((Path(step["run_dir"]) / "summary.json").read_text())["global_steps"] == 4  # the recipe's limits
    recovered = load_model(out / "pruned_recovered.safetensors")
    pruned = load_model(out / "pruned.safetensors")
    assert recovered.heads_per_layer() == pruned.heads_per_layer() == summary["heads_per_layer"]
    assert weights_differ(recovered, pruned)  # it was trained
    # Accuracies before and after, counted by hand on the splits the pruning used.
    model, extra = load_model_and_extra(run_dir / "model.safetensors")
    bundle = datasets_for(model, extra)
    assert step["val_acc"] == [summary["val_acc"][1], pytest.approx(hand_accuracy(recovered, bundle.val))]
    assert step["test_acc"] == [pytest.approx(summary["test_acc"][1]), pytest.approx(hand_accuracy(recovered, bundle.test))]
    assert (summary["val_acc_recovered"], summary["test_acc_recovered"]) == (step["val_acc"][1], step["test_acc"][1])
    rows = read_csv(out / "curves.csv")
    (row,) = [r for r in rows if r["recovered_val_acc"]]
    assert (row["order"], int(row["step"])) == ("importance", step["step"])
    assert float(row["recovered_val_acc"]) == pytest.approx(step["val_acc"][1])
    assert float(row["recovered_test_acc"]) == pytest.approx(step["test_acc"][1])


@pytest.mark.slow
def test_recover_at_each_trains_one_run_per_pruning_step_at_the_given_lr(run_dir: Path, tmp_path: Path, load_tool) -> None:
    out = tmp_path / "prune"
    assert prune(load_tool, "--checkpoint", str(run_dir / "model.safetensors"), "--out", str(out),
                 "--max-drop", "100", "--recover-epochs", "1", "--recover-at", "each", "--recover-lr", "0.002") == 0
    rows = [r for r in read_csv(out / "curves.csv") if r["order"] == "importance"]
    pruned_steps = [int(r["step"]) for r in rows if int(r["step"]) > 0]
    steps = json.loads((out / "summary.json").read_text())["recovery"]["steps"]
    assert [s["step"] for s in steps] == pruned_steps and len(pruned_steps) == 4  # 8 heads -> 4 -> 2 -> 1 -> 0
    assert sorted(p.name for p in (out / "recover").iterdir()) == [f"step_{k}" for k in pruned_steps]
    for step, row in zip(steps, rows[1:]):
        config = run_config(step["run_dir"])
        assert config["optim"]["lr"] == 0.002 and config["optim"]["min_lr"] <= 0.002
        before = load_model(config["model"]["pretrained"])
        after = load_model(Path(step["run_dir"]) / "model.safetensors")
        assert sum(before.heads_per_layer()) == step["heads_left"] == int(row["heads_left"])
        assert after.heads_per_layer() == before.heads_per_layer() and weights_differ(after, before)
        assert float(row["recovered_val_acc"]) == pytest.approx(step["val_acc"][1])
    assert rows[0]["recovered_val_acc"] == ""  # the unpruned model is not recovered


@pytest.mark.slow
def test_a_model_outside_a_run_directory_recovers_with_the_recipe_given(run_dir: Path, tmp_path: Path,
                                                                         load_tool, capsys) -> None:
    lone = tmp_path / "lone"
    lone.mkdir()
    checkpoint = shutil.copy(run_dir / "model.safetensors", lone / "model.safetensors")
    out = tmp_path / "prune"
    assert prune(load_tool, "--checkpoint", str(checkpoint), "--out", str(out), "--recover-epochs", "1") == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "--recipe" in err and "\n" not in err
    assert not out.exists()  # refused before any work
    recipe = short_recipe(tmp_path / "unused", limit_train_batches=2)
    recipe_path = tmp_path / "other.yaml"
    recipe_path.write_text(yaml.safe_dump(recipe))  # 2 heads a layer: the model has 4
    assert prune(load_tool, "--checkpoint", str(checkpoint), "--out", str(out), "--recover-epochs", "1",
                 "--recipe", str(recipe_path)) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: the recipe contradicts the weights") and "model.num_heads=2" in err
    assert not out.exists()  # refused before the pruning
    recipe["optim"]["lr"] = 1e-2
    recipe["model"]["num_heads"] = 4
    recipe_path.write_text(yaml.safe_dump(recipe))
    assert prune(load_tool, "--checkpoint", str(checkpoint), "--out", str(out), "--recover-epochs", "1",
                 "--recipe", str(recipe_path), "--data", "seed=3") == 0
    (step,) = json.loads((out / "summary.json").read_text())["recovery"]["steps"]
    config = run_config(step["run_dir"])
    assert config["optim"]["lr"] == pytest.approx(1e-3) and config["data"]["seed"] == 3  # --data reaches recovery
    assert json.loads((Path(step["run_dir"]) / "summary.json").read_text())["global_steps"] == 2
    assert not (tmp_path / "unused").exists()  # the run went inside --out


@pytest.mark.parametrize("option", [["--recover-at", "each"], ["--recipe", "r.yaml"], ["--recover-lr", "0.1"]])
def test_recovery_options_without_recover_epochs_are_refused(option: list[str], tmp_path: Path, load_tool,
                                                              capsys) -> None:
    model_file = save_model(tiny_model(), tmp_path / "m.safetensors", extra={"dataset": "digits"})
    assert prune(load_tool, "--checkpoint", str(model_file), "--out", str(tmp_path / "out"), *option) == 2
    err = capsys.readouterr().err
    assert f"{option[0]} only applies to recovery; add --recover-epochs N" in err
    assert not (tmp_path / "out").exists()


def test_recover_steps_measures_each_steps_pruned_model_and_what_recover_returns() -> None:
    model = tiny_model()
    batches = toy_batches(count=2, batch=8)
    records = iterative_pruning(model, batches, step_fraction=0.5, eval_loader=batches, progress=False)
    seen: list[tuple[list[int], PruningStep]] = []

    def recover(pruned, step: PruningStep):
        seen.append((pruned.heads_per_layer(), step))
        recovered = copy.deepcopy(pruned)  # a new model, as a training run returns: the pruned one is unchanged
        with torch.no_grad():  # always class 2
            recovered.head.weight.zero_()
            recovered.head.bias.copy_(torch.tensor([0.0, 0.0, 1.0]))
        return recovered

    results = recover_steps(model, records[1:3], recover, val_loader=batches, test_loader=batches[:1])
    assert seen == [(r.heads_per_layer, r) for r in records[1:3]]
    labels = torch.cat([y for _, y in batches])
    for result, record in zip(results, records[1:3]):
        assert result.val_acc == (record.accuracy, pytest.approx(100.0 * float((labels == 2).float().mean())))
        images, labels = batches[0]
        with torch.no_grad():
            before = prune_heads(copy.deepcopy(model), record.pruned).eval()(images).argmax(-1)
        assert result.test_acc == (pytest.approx(100.0 * float((before == labels).float().mean())),
                                   pytest.approx(100.0 * float((batches[0][1] == 2).float().mean())))
    with pytest.raises(RuntimeError, match="changed the head counts"):
        recover_steps(model, records[1:2], lambda pruned, step: model, val_loader=batches)


def test_recover_steps_measures_both_splits_after_recovery_on_the_recovered_model() -> None:
    """The recovered model predicts the class after the pruned model's (its classifier's rows
    rolled by one) and the labels are those classes: 0 % before recovery, 100 % after, on the
    validation and the test split. An 8-image accuracy of a random model can equal the accuracy
    the test above expects after recovery; 0 and 100 cannot be mistaken for each other."""
    model = tiny_model()
    heads = {0: [0, 2], 1: [1]}
    pruned = prune_heads(copy.deepcopy(model), heads).eval()
    images = toy_batches(count=1, batch=8)[0][0]
    with torch.no_grad():
        labels = (pruned(images).argmax(-1) + 1) % 3
    step = PruningStep(1, 5, 3 / 8, 0.0, 0, 0, None, pruned.heads_per_layer(), heads)

    def recover(given: VisionTransformer, step: PruningStep) -> VisionTransformer:
        recovered = copy.deepcopy(given)
        with torch.no_grad():
            recovered.head.weight.copy_(given.head.weight.roll(1, dims=0))
            recovered.head.bias.copy_(given.head.bias.roll(1, dims=0))
        return recovered

    (result,) = recover_steps(model, [step], recover, val_loader=[(images, labels)], test_loader=[(images, labels)])
    assert result.val_acc == (0.0, 100.0)
    assert result.test_acc == (0.0, 100.0)


def test_pruning_figure_draws_recovery_arrows_against_the_measured_speedup() -> None:
    def step(index: int, accuracy: float, speed: float) -> PruningStep:
        return PruningStep(index, 4 - index, index / 4, accuracy, 0, 0, speed, [], {0: list(range(index))})

    curve = [step(0, 90.0, 100.0), step(1, 85.0, 150.0), step(2, 70.0, 200.0)]
    recovery = [RecoveredStep(curve[1], (85.0, 89.0), None), RecoveredStep(curve[2], (70.0, 80.0), None)]
    fig = pruning_curves_figure({"importance": [curve]}, max_drop=1.0, chosen=curve[1], title="t", recovery=recovery,
                                speed_curve=curve, recovery_label="after 2 epoch(s)")
    _, panel = fig.axes
    assert "speed-up" in panel.get_xlabel() and panel.get_ylabel() == "validation accuracy (%)"
    arrows = [(a.xyann, a.xy) for a in panel.texts]
    assert arrows == [((1.5, 85.0), (1.5, 89.0)), ((2.0, 70.0), (2.0, 80.0))]
    assert "after 2 epoch(s)" in [t.get_text() for t in panel.get_legend().get_texts()]
    assert len(pruning_curves_figure({"importance": [curve]}).axes) == 1  # no recovery: one panel


def test_recovery_lr_is_a_tenth_of_the_recipes_and_its_min_lr_is_capped_at_the_lr(tmp_path: Path) -> None:
    recipe = short_recipe(tmp_path / "runs")
    recipe["optim"]["min_lr"] = 1e-4
    plan = RecipeRecovery.from_recipe(recipe, epochs=1, out=tmp_path)
    assert (plan.lr, plan.min_lr) == (pytest.approx(RECIPE_LR / 10), 1e-4)
    plan = RecipeRecovery.from_recipe(recipe, epochs=1, out=tmp_path, lr=5e-5)  # below the recipe's min_lr
    assert (plan.lr, plan.min_lr) == (5e-5, 5e-5)
    optim = load_recipe(recipe, plan.overrides(tmp_path / "m.safetensors", tmp_path)).optim  # a valid recipe
    assert (optim.lr, optim.min_lr, optim.warmup_epochs) == (5e-5, 5e-5, 0)


def test_recover_model_fine_tunes_another_pruners_model_with_a_recipe_and_keeps_its_head_counts(tmp_path: Path) -> None:
    torch.manual_seed(0)
    config = ViTConfig(img_size=8, in_chans=1, num_classes=10, patch_size=2, embed_dim=32, depth=2, num_heads=2,
                       mlp_ratio=2.0)
    pruned = prune_heads(VisionTransformer(config), {0: [1]})
    result = recover_model(pruned, short_recipe(tmp_path / "unused"), epochs=1, out=tmp_path / "rec",
                           extra={"mean": [0.5], "std": [0.5]})
    assert result.model.heads_per_layer() == [1, 2] and weights_differ(result.model, pruned)
    assert result.run_dir.is_relative_to(tmp_path / "rec") and not (tmp_path / "unused").exists()
    config = run_config(result.run_dir)
    assert config["model"]["pretrained"] == str(tmp_path / "rec" / "pruned.safetensors")
    assert config["optim"]["lr"] == pytest.approx(RECIPE_LR / 10) and config["optim"]["warmup_epochs"] == 0
    assert config["data"]["mean"] == [0.5]  # the model file's normalisation reached the run


def test_each_evaluation_stops_after_max_batches() -> None:
    """A second batch whose labels no model gets right: with ``max_batches=1`` it is never read,
    before or after recovery, on either split."""
    model = tiny_model()
    heads = {0: [1]}
    pruned = prune_heads(copy.deepcopy(model), heads).eval()
    images = toy_batches(count=1, batch=8)[0][0]
    with torch.no_grad():
        right = pruned(images).argmax(-1)
    loader = [(images, right), (images, (right + 1) % 3)]
    step = PruningStep(1, 7, 1 / 8, 100.0, 0, 0, None, pruned.heads_per_layer(), heads)
    (result,) = recover_steps(model, [step], lambda given, step: copy.deepcopy(given), val_loader=loader,
                              test_loader=loader, max_batches=1)
    assert result.val_acc == (100.0, 100.0) and result.test_acc == (100.0, 100.0) and result.step is step
    (result,) = recover_steps(model, [step], lambda given, step: copy.deepcopy(given), val_loader=loader,
                              test_loader=loader)
    assert result.val_acc == (100.0, 50.0) and result.test_acc == (50.0, 50.0)
    (result,) = recover_steps(model, [step], lambda given, step: copy.deepcopy(given), val_loader=loader)
    assert result.test_acc is None  # no test loader, no test accuracy


def test_a_pruning_record_names_the_source_the_heads_pruned_and_the_heads_left() -> None:
    pruned = prune_heads(tiny_model(), {0: [0, 2], 1: [1]})  # 4 heads a block
    assert pruning_record("runs/x/model.safetensors", {0: [0, 2], 1: [1]}, pruned) == {
        "source": "runs/x/model.safetensors", "heads_pruned": {"0": [0, 2], "1": [1]}, "heads_per_layer": [2, 3]}


def test_the_recovery_run_trains_the_pruned_weights_as_they_are_with_the_recipes_data_changes(tmp_path: Path) -> None:
    """Each override read back through the recipe loader: the pruned file, no timm file or options,
    the classifier kept, vitkit's implementation, the schedule, the run's folder, the data changes."""
    recipe = short_recipe(tmp_path / "runs")
    plan = RecipeRecovery.from_recipe(recipe, epochs=3, out=tmp_path, lr=2e-4, data=["seed=7"])
    assert plan.source == ""  # no source named: the pruning records say none
    folder = tmp_path / "odd #: [folder]"
    config = load_recipe(recipe, plan.overrides(folder / "pruned.safetensors", folder))
    assert config.model.pretrained == str(folder / "pruned.safetensors") and config.model.pretrained_file is None
    assert config.model.pretrained_kwargs == {} and config.model.reset_head is False and config.model.impl == "vitkit"
    assert (config.trainer.max_epochs, config.optim.lr, config.optim.warmup_epochs) == (3, 2e-4, 0)
    assert config.output.dir == str(folder) and config.data.seed == 7


def test_a_recipe_recovery_saves_each_steps_model_with_its_record_and_keeps_each_runs_folder(
        tmp_path: Path, monkeypatch) -> None:
    """``train`` stubbed: what the recovery hands it (the recipe, the overrides naming the saved
    pruned file under out/recover/step_<k>), the file's metadata, and what it returns."""
    import vitkit.train

    calls = []

    def fake_train(recipe, overrides):
        calls.append((recipe, overrides))
        return vitkit.train.RunResult(run_dir=tmp_path / f"run{len(calls)}", summary={}, model=trained)

    monkeypatch.setattr(vitkit.train, "train", fake_train)
    model, heads = tiny_model(), {1: [0]}
    pruned = prune_heads(copy.deepcopy(model), heads)
    trained = copy.deepcopy(pruned)
    recipe = short_recipe(tmp_path / "runs")
    plan = RecipeRecovery.from_recipe(recipe, epochs=1, out=tmp_path / "out", extra={"mean": [0.5] * 3}, source="src")
    step = PruningStep(4, 7, 1 / 8, 50.0, 0, 0, None, pruned.heads_per_layer(), heads)
    assert plan(pruned, step) is trained and plan.runs == {4: tmp_path / "run1"}
    folder = tmp_path / "out" / "recover" / "step_4"
    assert calls == [(recipe, plan.overrides(folder / "pruned.safetensors", folder))]
    saved, extra = load_model_and_extra(folder / "pruned.safetensors")
    assert saved.heads_per_layer() == pruned.heads_per_layer() and extra["mean"] == [0.5] * 3
    assert extra["pruning"] == pruning_record("src", heads, pruned)
    result = recover_model(pruned, recipe, epochs=2, out=tmp_path / "alone", extra={"std": [0.2] * 3})
    assert result.model is trained and (tmp_path / "alone" / "pruned.safetensors").is_file()
    overrides = calls[-1][1]
    assert f"optim.lr={RECIPE_LR * 0.1!r}" in overrides and "trainer.max_epochs=2" in overrides
    recover_model(pruned, recipe, epochs=1, out=tmp_path / "lr", lr=3e-4, data=["seed=5"])
    assert {"optim.lr=0.0003", "data.seed=5"} <= set(calls[-1][1])
    assert load_model_and_extra(tmp_path / "alone" / "pruned.safetensors")[1]["std"] == [0.2] * 3
