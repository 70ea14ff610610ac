"""Multi-node training through Lightning: two "nodes" of one process each, started on localhost by
torchrun as a cluster's launcher starts them (one ``torchrun --nnodes=2 --node-rank=R`` per node),
train one DDP run together."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from tiny_runs import ROOT, SHORT, free_port, tool_env, write_tiny_recipe

pytestmark = pytest.mark.slow


def test_two_nodes_started_by_torchrun_train_one_run(tmp_path: Path) -> None:
    steps = 4
    recipe = write_tiny_recipe(tmp_path, **{**SHORT, "limit_train_batches": steps})
    port = free_port()
    logs = [(tmp_path / f"node{rank}.out", tmp_path / f"node{rank}.err") for rank in (0, 1)]
    nodes = []
    for rank, (out, err) in enumerate(logs):  # files, not pipes: a node blocked on a full pipe would stall the other
        with open(out, "w") as stdout, open(err, "w") as stderr:
            nodes.append(subprocess.Popen(
                [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", f"--node-rank={rank}",
                 "--nproc-per-node=1", "--master-addr=127.0.0.1", f"--master-port={port}", "tools/train.py",
                 str(recipe), "trainer.strategy=ddp", "trainer.devices=1", "trainer.num_nodes=2"],
                cwd=ROOT, env=tool_env(), stdout=stdout, stderr=stderr,
            ))
    try:
        for node in nodes:
            node.wait(timeout=150)
    finally:
        for node in nodes:
            if node.poll() is None:
                node.kill()
    outputs = [(out.read_text(), err.read_text()) for out, err in logs]
    for node, (_, stderr) in zip(nodes, outputs):
        assert node.returncode == 0, stderr[-3000:]
    assert outputs[0][0].count("test accuracy") == 1 and "test accuracy" not in outputs[1][0]  # node 0 reports
    (run_dir,) = [path for path in (tmp_path / "runs" / "tiny").iterdir() if not path.is_symlink()]  # one, node 0's
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["global_steps"] == steps
    assert (run_dir / "model.safetensors").is_file()
