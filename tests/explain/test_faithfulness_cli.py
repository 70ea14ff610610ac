"""``vitkit faithfulness``: the table, CSV, figure and next step on a model file's own test images,
each option changing what it should, and bad input refused in one line."""

from __future__ import annotations

import argparse
import csv
import json
import os
import signal
from pathlib import Path

import pytest
import torch
from tiny_models import save_tiny, tiny_shapes_model

from vitkit.cli import faithfulness as command
from vitkit.cli.faithfulness import main, verdict
from vitkit.explain import FaithfulnessReport, MethodResult
from vitkit.output_dirs import MARKER


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(0)
    return save_tiny(tiny_shapes_model(), tmp_path_factory.mktemp("model") / "model.safetensors")


def measure(checkpoint: Path, out: Path, *options: str) -> dict[str, dict[str, str]]:
    """Run the command on 6 test images in 4 steps; the CSV rows by method."""
    argv = ["--checkpoint", str(checkpoint), "--images", "6", "--steps", "4", "--out", str(out), *options]
    assert main(argv) == 0
    with open(out / "faithfulness.csv", newline="") as handle:
        return {row["method"]: row for row in csv.DictReader(handle)}


def test_the_table_figure_and_next_step(checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    rows = measure(checkpoint, tmp_path / "all")
    assert list(rows) == ["rollout", "grad_rollout", "chefer", "lrp", "integrated_gradients", "attention", "random"]
    for row in rows.values():
        assert row["images"] == "6" and 0 <= float(row["deletion_auc"]) <= 1 and 0 <= float(row["positive_auc"]) <= 100
    assert rows["random"]["sanity_spearman"] == "" and rows["lrp"]["sanity_spearman"] != ""
    printed = capsys.readouterr().out.strip().splitlines()
    assert printed[0] == "note: 6 test images drawn across 6 classes (seed 0; --seed to draw others)."
    chosen_on = printed[1].split()[1]  # the tiny data's validation split holds fewer than --lrp-choice-images 32
    assert printed[1] == f"note: {chosen_on} validation images drawn across 6 classes (seed 0; --seed to draw others)."
    assert printed[2].startswith("lrp rules: ") and f"on {chosen_on} validation images" in printed[2]  # chosen, and said
    assert printed[3].startswith("note: about ") and " min for the 6 images (the first 6 took " in printed[3]
    printed = printed[4:]
    assert printed[0].startswith("| method | deletion_auc |") and len(printed) >= 8
    assert printed[-1].startswith("most faithful here (insertion minus deletion): ")
    assert f"vitkit maps {checkpoint} --method " in printed[-1]  # the next step
    assert (tmp_path / "all" / "faithfulness.png").stat().st_size > 10_000
    assert (tmp_path / "all" / "faithfulness.md").read_text().startswith("| method |")
    assert json.loads((tmp_path / "all" / MARKER).read_text())["state"] == "complete"


def test_each_option_changes_what_it_should(checkpoint: Path, tmp_path: Path) -> None:
    methods = ("--methods", "chefer", "lrp", "random")
    base = measure(checkpoint, tmp_path / "base", *methods)
    assert list(base) == ["chefer", "lrp", "random"]

    def differs(rows: dict, method: str, column: str) -> bool:
        return rows[method][column] != base[method][column]

    assert differs(measure(checkpoint, tmp_path / "blur", *methods, "--baseline", "blur"), "chefer", "insertion_auc")
    assert all(row["sanity_spearman"] == "" for row in measure(checkpoint, tmp_path / "fast", *methods, "--no-sanity").values())
    preset = measure(checkpoint, tmp_path / "preset", *methods, "--lrp-rules", "cp-gamma")
    attnlrp = measure(checkpoint, tmp_path / "attnlrp", *methods, "--lrp-rules", "cp-gamma", "--lrp-attention", "attnlrp")
    gamma = measure(checkpoint, tmp_path / "gamma", *methods, "--lrp-rules", "cp-gamma", "--linear-gamma", "2",
                    "--patch-gamma", "0")
    assert attnlrp["lrp"]["sanity_spearman"] != preset["lrp"]["sanity_spearman"] != gamma["lrp"]["sanity_spearman"]
    assert not differs(attnlrp, "chefer", "sanity_spearman")  # lrp's options touch lrp alone
    reseeded = measure(checkpoint, tmp_path / "seed", *methods, "--seed", "4")
    assert differs(reseeded, "random", "deletion_auc") or differs(reseeded, "random", "insertion_auc")
    steps = measure(checkpoint, tmp_path / "steps", "--methods", "chefer", "--steps", "16")
    assert steps["chefer"]["deletion_auc"] != base["chefer"]["deletion_auc"]


def test_lrp_rules_auto_measures_the_rules_it_names(checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from vitkit.explain import LRP_PRESETS

    auto = measure(checkpoint, tmp_path / "auto", "--methods", "lrp", "--lrp-choice-images", "3")
    said = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("lrp rules: "))
    chosen = said.split()[2].rstrip(",")
    assert chosen in LRP_PRESETS and "on 3 validation images" in said
    rows = {name: measure(checkpoint, tmp_path / name, "--methods", "lrp", "--lrp-rules", name)["lrp"]
            for name in LRP_PRESETS}
    capsys.readouterr()

    def areas(row: dict[str, str]) -> tuple[str, ...]:
        return tuple(row[f"{test}_auc"] for test in ("deletion", "insertion", "positive", "negative")) + (row["sanity_spearman"],)

    assert areas(auto["lrp"]) == areas(rows[chosen])  # the rules it named are the rules it measured
    assert len({areas(row) for row in rows.values()}) > 1  # the presets differ on this model: the choice matters
    assert main(["--checkpoint", str(checkpoint), "--linear-gamma", "0.5", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --lrp-attention, --linear-gamma and --patch-gamma change one preset") and len(err.splitlines()) == 1
    assert not (tmp_path / "x").exists()


def test_bad_input_is_one_line(checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["--checkpoint", str(checkpoint), "--data", "img_size=48", "--out", str(tmp_path / "d")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "48x48" in err and len(err.splitlines()) == 1
    with pytest.raises(SystemExit) as stop:
        main(["--checkpoint", str(checkpoint), "--methods", "gradcam", "--out", str(tmp_path / "m")])
    assert stop.value.code == 2
    capsys.readouterr()
    assert main(["--checkpoint", str(checkpoint), "--steps", "1000", "--out", str(tmp_path / "s")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --steps 1000 is more than the ") and len(err.splitlines()) == 1
    assert main(["--checkpoint", str(checkpoint), "--methods", "lrp", "random", "lrp", "--out", str(tmp_path / "r")]) == 2
    assert capsys.readouterr().err.strip() == "error: --methods names lrp more than once; name each method once."
    assert not any((tmp_path / name).exists() for name in ("d", "s", "r"))  # refused before anything was written


def report_of(areas: dict[str, tuple[float, float]]) -> FaithfulnessReport:
    """A report whose methods have these (deletion, insertion) areas on one image."""
    results = [MethodResult(name, {"deletion": torch.tensor([d]), "insertion": torch.tensor([i])}, {}, 0.0, None)
               for name, (d, i) in areas.items()]
    return FaithfulnessReport(results, torch.linspace(0, 1, 5), "mean", 1)


def test_the_verdict_names_a_map_vitkit_maps_can_draw(checkpoint: Path) -> None:
    args = argparse.Namespace(checkpoint=str(checkpoint))
    drawn = verdict(report_of({"chefer": (0.3, 0.5), "lrp": (0.2, 0.6), "random": (0.4, 0.4)}), args)
    assert drawn.startswith("most faithful here (insertion minus deletion): lrp (deletion 0.200, insertion 0.600)")
    assert drawn.endswith(f"next: draw it with vitkit maps {checkpoint} --method lrp --test-images 8 --out maps/")
    # the best method is not one vitkit maps draws: the best one it draws is named instead
    undrawn = verdict(report_of({"integrated_gradients": (0.1, 0.7), "rollout": (0.3, 0.4), "chefer": (0.3, 0.5)}), args)
    assert undrawn.startswith("most faithful here (insertion minus deletion): integrated_gradients (deletion 0.100")
    assert "vitkit maps does not draw it; the most faithful map it draws is chefer (deletion 0.300, insertion 0.500)" in undrawn
    assert undrawn.endswith("--method chefer --test-images 8 --out maps/")
    assert verdict(report_of({"attention": (0.3, 0.4), "random": (0.4, 0.4)}), args).endswith("--method all --test-images 8 --out maps/")


def test_sigterm_writes_the_table_of_the_images_measured_so_far(
    checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    measured = command.faithfulness

    def stopped_after_one_batch(*args, on_batch, **kwargs):  # SIGTERM arrives while the first batch runs
        def hook(done: int) -> bool:
            os.kill(os.getpid(), signal.SIGTERM)
            return on_batch(done)
        return measured(*args, on_batch=hook, **kwargs)

    monkeypatch.setattr(command, "faithfulness", stopped_after_one_batch)
    out = tmp_path / "stopped"
    argv = [str(checkpoint), "--images", "6", "--batch-size", "2", "--steps", "4", "--methods", "chefer", "random",
            "--out", str(out)]
    assert main(argv) == 143
    with open(out / "faithfulness.csv", newline="") as handle:
        assert [(row["method"], row["images"]) for row in csv.DictReader(handle)] == [("chefer", "2"), ("random", "2")]
    printed = capsys.readouterr().out.strip().splitlines()
    assert printed[-1].startswith("stopped by SIGTERM after 2 of 6 images: the table covers those")
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the handler is put back
