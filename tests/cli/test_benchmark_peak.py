"""``vitkit benchmark``: the share of the GEMM peak in the models and levers tables, with the peak
(``torch.mm`` at the model's own shapes) timed in the same interleaved rounds as the steps."""

from __future__ import annotations

import re

import pytest

import vitkit.bench.models as benchmark

# one ViT-Ti-wide block on 16 + 1 tokens: GEMMs big enough that GFLOP/s print as more than rounding, small
# enough that bf16 steps on a CPU without bf16 instructions take a fraction of a second
SMALL = "vit_small_patch16_224:16:img_size=32,patch_size=8,num_classes=10,depth=1,embed_dim=192,num_heads=3"


def test_each_lever_has_a_row_whose_share_is_its_gflops_over_the_peak_timed_in_the_same_rounds(monkeypatch: pytest.MonkeyPatch) -> None:
    rounds: list[list[str]] = []
    timed = benchmark.interleaved_times

    def spy(calls, repeats, warmup):  # type: ignore[no-untyped-def]
        rounds.append(list(calls))
        return timed(calls, repeats=repeats, warmup=warmup)

    monkeypatch.setattr(benchmark, "interleaved_times", spy)
    lines = benchmark.bench_levers(SMALL, repeats=3, compile_lever=False)
    # one interleaved run: the six levers and one torch.mm per GEMM shape of the step (17 tokens x 16 images = 272 rows)
    assert len(rounds) == 1 and {name for name in rounds[0] if name.startswith("mm ")} == {
        "mm 272x192x192", "mm 272x192x576", "mm 272x192x768", "mm 272x768x192"}
    peak = float(re.search(r"GEMM peak at its shapes ([\d,.]+) GFLOP/s", lines[0]).group(1).replace(",", ""))
    table = [line for line in lines if line.startswith("| ") and "GFLOP" not in line and "operator" not in line]
    levers = [row for row in table if not row.startswith("| aten.")]
    assert [row.split(" | ")[0][2:] for row in levers] == [
        "baseline (autocast bf16, explicit, fused AdamW)", "SDPA kernel instead of explicit",
        "foreach AdamW instead of fused", "trainer.precision=bf16-true (bf16 copy, float32 master weights)",
        "bf16 weights and AdamW state, no master weights (Lightning's bf16-true)", "baseline again (last in each round)"]
    for row in levers:
        gflops, share = row.split(" | ")[2:4]
        assert share_of_peak_agrees(float(share.rstrip("%")), float(gflops.replace(",", "")), peak)
    assert any(row.startswith("| aten.mm |") or row.startswith("| aten.addmm |") for row in table)  # the operator table


def share_of_peak_agrees(share: float, gflops: float, peak: float) -> bool:
    """Whether a printed share (%) is ``100 * gflops / peak`` for some true values that print as
    these three (each rounded to a whole number: off by at most 0.5; a slow CPU's peak of a few
    GFLOP/s makes the peak's rounding the largest term)."""
    low = 100 * max(gflops - 0.5, 0.0) / (peak + 0.5) - 0.5
    high = 100 * (gflops + 0.5) / (peak - 0.5) + 0.5 if peak > 0.5 else float("inf")
    return low <= share <= high


def test_a_models_cell_shares_its_rounds_with_the_peak_it_is_divided_by(monkeypatch: pytest.MonkeyPatch) -> None:
    runs: list[list[str]] = []
    timed = benchmark.interleaved_times

    def spy(calls, repeats):  # type: ignore[no-untyped-def]
        runs.append(list(calls))
        return timed(calls, repeats=repeats)

    monkeypatch.setattr(benchmark, "interleaved_times", spy)
    lines = benchmark.bench_models([SMALL], repeats=2)
    assert len(runs) == 4 and all({"vitkit", "mm 272x192x576"} <= set(run) for run in runs)  # forward/train x fp32/bf16
    cells = [line.split(" | ") for line in lines if line.startswith("| vit_small") and (" | forward | " in line or " | train | " in line)]
    peak_row = next(line for line in lines if "272x192x192" in line).split(" | ")
    peaks = {precision: [float(p.replace(",", "")) for p in cell.strip(" |").split(" / ")]
             for precision, cell in zip(("bf16", "fp32"), peak_row[3:5])}
    assert len(cells) == 4
    for cell in cells:
        mode, precision, gflops, share = cell[2], cell[3], float(cell[8].replace(",", "")), float(cell[9].rstrip("% |"))
        peak = peaks[precision][("forward", "train").index(mode)]
        assert share_of_peak_agrees(share, gflops, peak)
