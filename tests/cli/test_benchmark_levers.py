"""``vitkit benchmark --sections levers``: the levers' table, with the GEMM peak timed in the same rounds."""

from __future__ import annotations

import re

import pytest

import vitkit.cli.benchmark as benchmark

TINY = "vit_cifar_tiny:4:img_size=16,patch_size=8,in_chans=1,num_classes=3,embed_dim=16,depth=1,num_heads=2"


def test_each_lever_has_a_row_whose_share_is_its_gflops_over_the_peak_timed_in_the_same_rounds(monkeypatch: pytest.MonkeyPatch) -> None:
    rounds: list[list[str]] = []
    timed = benchmark.interleaved_times

    def spy(calls, repeats, warmup):  # type: ignore[no-untyped-def]
        rounds.append(list(calls))
        return timed(calls, repeats=repeats, warmup=warmup)

    monkeypatch.setattr(benchmark, "interleaved_times", spy)
    lines = benchmark.bench_levers(TINY, repeats=3, compile_lever=False)
    # one interleaved run: the five levers and one torch.mm per GEMM shape of the step (4 tokens x 4 images = 20 rows)
    assert len(rounds) == 1 and {name for name in rounds[0] if name.startswith("mm ")} == {
        "mm 20x16x16", "mm 20x16x48", "mm 20x16x32", "mm 20x32x16"}  # mlp_ratio 2
    peak = float(re.search(r"GEMM peak at its shapes ([\d,.]+) GFLOP/s", lines[0]).group(1).replace(",", ""))
    table = [line for line in lines if line.startswith("| ") and "GFLOP" not in line and "operator" not in line]
    levers = [row for row in table if not row.startswith("| aten.")]
    assert [row.split(" | ")[0][2:] for row in levers] == [
        "baseline (autocast bf16, explicit, fused AdamW)", "SDPA kernel instead of explicit",
        "foreach AdamW instead of fused", "bf16 weights, no autocast casts", "baseline again (last in each round)"]
    for row in levers:
        gflops, share = row.split(" | ")[2:4]
        assert float(share.rstrip("%")) == pytest.approx(100 * float(gflops.replace(",", "")) / peak, abs=0.5 + 100 / peak)
    assert any(row.startswith("| aten.mm |") or row.startswith("| aten.addmm |") for row in table)  # the operator table
