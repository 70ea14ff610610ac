"""One-shot pruning (--heads / --ratio), --orders, and the plan with its estimate printed before any work."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch
from tiny_models import tiny_model, toy_batches

import vitkit
from vitkit.data import DataConfig, build_datasets
from vitkit.errors import UsageError
from vitkit.prune import PruneOptions, head_importance, one_shot_pruning, prepare_pruning
from vitkit.prune.plan import BatchCost, estimate, iterative_steps

TINY_DATA = {"name": "digits", "img_size": 8, "num_workers": 0, "val_fraction": 0.1, "test_fraction": 0.1}


def test_iterative_steps_follow_the_pruning_loop() -> None:
    # 16 heads at 10%: remove 2, 1 (round(1.4)), 1, ... one per step below 15 heads: 1 + 15 steps... by hand:
    # 16 -> 14 (round 1.6 = 2), 14 -> 13 (1.4 -> 1), then 1 per step down to 0: 13 more steps.
    assert iterative_steps(16, 0.1) == 15
    assert iterative_steps(4, 0.5) == 3  # 4 -> 2 -> 1 -> 0, as the prune tool's curve shows
    assert iterative_steps(12, 1.0) == 1


def test_the_estimate_prices_each_pass_of_the_plan() -> None:
    cost = BatchCost(train_s=2.0, eval_s=0.5, train_batches=3, eval_batches=4)
    # one-shot: measure step 0 (eval 4 x 0.5 + timing 12 x 0.5) and one step (score 3 x 2 + eval 2 + timing 6)
    assert estimate({"one-shot": 1}, cost) == pytest.approx(2 + 6 + 6 + 2 + 6)
    # random: no scoring; 2 steps of evaluation after the first measurement
    assert estimate({"random": 2}, cost) == pytest.approx(2 + 2 * 2)
    # entropy scores with forward passes over the training batches
    assert estimate({"entropy": 1}, cost) == pytest.approx(2 + 3 * 0.5 + 2)


def test_one_shot_removes_the_lowest_scored_heads_of_one_scoring_pass() -> None:
    model = tiny_model()
    batches = toy_batches()
    scores = head_importance(model, batches, normalize_layers=False)
    lowest = sorted((float(scores[layer, head]), layer, head) for layer in range(2) for head in range(4))[:3]
    records = one_shot_pruning(model, batches, 3, eval_loader=batches,
                               scorer=lambda m, g: head_importance(m, batches, gates=g, normalize_layers=False),
                               progress=False)
    assert [r.heads_left for r in records] == [8, 5]
    assert records[1].pruned == {layer: sorted(h for _, l2, h in lowest if l2 == layer)
                                 for layer in sorted({l2 for _, l2, _ in lowest})}
    with pytest.raises(ValueError, match=r"\[0, 8\]"):
        one_shot_pruning(model, batches, 9, eval_loader=batches, progress=False)


def saved_tiny(tmp_path: Path) -> Path:
    model = vitkit.create_model("vit_cifar_tiny", img_size=8, in_chans=1, patch_size=4, embed_dim=16, depth=2,
                                num_heads=2, num_classes=10)
    extra = {"dataset": "digits", "recipe": "tiny", "data_config": TINY_DATA}
    return vitkit.save_model(model, tmp_path / "model.safetensors", extra=extra)


@pytest.mark.slow
def test_prune_heads_one_shot_keeps_the_most_important_heads_and_runs_only_the_listed_orders(
    tmp_path: Path, load_tool, capsys: pytest.CaptureFixture
) -> None:
    checkpoint = saved_tiny(tmp_path)
    out = tmp_path / "prune"
    code = load_tool("prune_heads").main(["--checkpoint", str(checkpoint), "--out", str(out), "--orders", "importance",
                                          "--heads", "1", "--rounds", "2"])
    assert code == 0
    err = capsys.readouterr().err
    plan = err.index("plan: one-shot (1 step)")
    assert "estimated" in err[plan:].splitlines()[0] and plan < err.index("prune:")  # before the progress bar
    with open(out / "curves.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert {row["order"] for row in rows} == {"importance"}  # the other orders were not computed
    assert [row["heads_left"] for row in rows] == ["4", "1"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["heads"] == [4, 1] and summary["one_shot"] and summary["max_drop"] is None
    # The kept head is the most important one, scored independently on the same training split.
    model = vitkit.load_model(checkpoint).eval()
    train = torch.utils.data.DataLoader(build_datasets(DataConfig.from_dict(TINY_DATA)).train, batch_size=256)
    scores = head_importance(model, train, normalize_layers=False)
    best = divmod(int(scores.argmax()), 2)
    pruned = vitkit.load_model(out / "pruned.safetensors")
    assert pruned.heads_per_layer() == [1 if layer == best[0] else 0 for layer in range(2)]


@pytest.mark.slow
def test_prune_heads_ratio_prunes_that_share(tmp_path: Path, load_tool) -> None:
    out = tmp_path / "prune"
    code = load_tool("prune_heads").main(["--checkpoint", str(saved_tiny(tmp_path)), "--out", str(out),
                                          "--orders", "importance", "random", "--random-seeds", "1",
                                          "--ratio", "0.5", "--rounds", "2"])
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["heads"] == [4, 2]
    with open(out / "curves.csv", newline="") as handle:
        assert {row["order"] for row in csv.DictReader(handle)} == {"importance", "random"}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--orders", "random"], "--orders must include importance"),
        (["--heads", "9"], "--heads 9 keeps more heads than the model has (4)"),
    ],
)
def test_prune_heads_refuses_a_target_it_cannot_meet_in_one_line(
    tmp_path: Path, load_tool, capsys: pytest.CaptureFixture, args: list[str], message: str
) -> None:
    code = load_tool("prune_heads").main(["--checkpoint", str(saved_tiny(tmp_path)), "--out", str(tmp_path / "p"), *args])
    err = capsys.readouterr().err
    assert code == 2 and message in err and err.count("\n") == 1
    assert not (tmp_path / "p").exists()  # refused before the output folder was claimed


def test_heads_and_max_drop_are_exclusive(tmp_path: Path, load_tool, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit_:
        load_tool("prune_heads").main(["--checkpoint", "m", "--out", "o", "--heads", "2", "--max-drop", "1"])
    assert exit_.value.code == 2 and "not allowed with argument" in capsys.readouterr().err


def test_prepare_pruning_resolves_the_target_and_plans_each_order_without_any_work(tmp_path: Path) -> None:
    model_file = saved_tiny(tmp_path)  # 2 blocks x 2 heads
    one_shot = prepare_pruning(model_file, tmp_path / "p", PruneOptions(ratio=0.5, orders=("importance",)))
    assert (one_shot.target_pruned, one_shot.max_drop, one_shot.plan()) == (2, None, {"one-shot": 1})
    iterative = prepare_pruning(model_file, tmp_path / "p", PruneOptions(
        orders=("importance", "random"), step_fraction=0.5, random_seeds=2))
    # 4 heads at half a step: 4 -> 2 -> 1 -> 0, three steps; random: three steps per seed; the default budget 1 pt
    assert (iterative.target_pruned, iterative.max_drop, iterative.plan()) == (None, 1.0, {"importance": 3, "random": 6})
    assert not (tmp_path / "p").exists()  # nothing written before run()
    with pytest.raises(UsageError, match="--recipe only applies to recovery"):
        prepare_pruning(model_file, tmp_path / "p", PruneOptions(recipe="r.yaml"))


@pytest.mark.slow
def test_the_library_run_writes_the_summary_it_returns_and_notifies_the_plan_first(tmp_path: Path) -> None:
    job = prepare_pruning(saved_tiny(tmp_path), tmp_path / "p", PruneOptions(heads=3, orders=("importance",), rounds=2))
    lines: list[str] = []
    result = job.run(tmp_path / "p", notify=lines.append)
    assert result.summary == json.loads((tmp_path / "p" / "summary.json").read_text())
    assert result.summary["heads"] == [4, 3] and result.summary["one_shot"]
    assert [line.split(":")[0] for line in lines] == ["plan"]
    assert vitkit.load_model(tmp_path / "p" / "pruned.safetensors").heads_per_layer() in ([1, 2], [2, 1])
