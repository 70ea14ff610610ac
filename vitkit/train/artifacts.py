"""The run directory: where it is, and the files written into it besides checkpoints.

Layout of ``<output.dir>/<recipe name>/<timestamp>/``: ``config.yaml`` (resolved recipe),
``logs/version_<k>/`` (Lightning's CSV log of each attempt; a resumed run adds one),
``metrics.csv`` (the attempts merged), ``checkpoints/{best,last}.ckpt``, ``curves.png``,
``summary.json`` and ``model.safetensors``. ``<output.dir>/<recipe name>/latest`` links to the
last finished run.
"""

from __future__ import annotations

import csv
import json
import os
import time
from pathlib import Path
from typing import Any

from ..io import atomic_write
from .config import RecipeConfig

#: Set by rank 0 for the processes Lightning launches for DDP, so they share its run directory.
RUN_DIR_ENV = "VITKIT_RUN_DIR"
CONFIG_FILE = "config.yaml"


def resolve_run_dir(config: RecipeConfig, resume: str | os.PathLike | None) -> Path:
    """The run directory: inherited from the launching rank, the directory of the checkpoint to
    resume (when it is a run directory), or a new ``<output.dir>/<name>/<timestamp>`` (not yet
    created: rank 0 creates it)."""
    inherited = os.environ.get(RUN_DIR_ENV)
    if inherited:
        return Path(inherited)
    if resume is not None:
        candidate = Path(resume).resolve().parent.parent
        if (candidate / CONFIG_FILE).is_file():
            return candidate
    base = Path(config.output.dir) / config.name
    stamp = time.strftime("%Y%m%d-%H%M%S")
    run_dir, suffix = base / stamp, 1
    while run_dir.exists():
        run_dir, suffix = base / f"{stamp}-{suffix}", suffix + 1
    return run_dir


def merge_metrics(run_dir: Path) -> list[dict[str, str]]:
    """Merge every attempt's ``logs/version_*/metrics.csv`` into ``run_dir/metrics.csv``: a row a
    later (resumed) attempt logged again at the same step replaces the earlier one. Returns the rows."""
    merged: dict[tuple[int, frozenset[str]], dict[str, str]] = {}
    versions = sorted((run_dir / "logs").glob("version_*"), key=lambda p: int(p.name.rpartition("_")[2]))
    for version in versions:
        path = version / "metrics.csv"
        if not path.is_file():
            continue
        with open(path, newline="") as handle:
            for row in csv.DictReader(handle):
                filled = frozenset(key for key, value in row.items() if value not in ("", None))
                merged[(int(row["step"]), filled)] = row
    rows = sorted(merged.values(), key=lambda row: int(row["step"]))
    fields = sorted({key for row in rows for key in row}, key=lambda key: (key not in ("epoch", "step"), key))

    def write(tmp: str) -> None:
        with open(tmp, "w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=fields)
            writer.writeheader()
            writer.writerows(rows)

    atomic_write(run_dir / "metrics.csv", write)
    return rows


def write_json(path: Path, values: dict[str, Any]) -> Path:
    """``values`` as indented JSON, atomically."""
    return atomic_write(path, lambda tmp: Path(tmp).write_text(json.dumps(values, indent=2) + "\n"))


def point_latest(run_dir: Path) -> None:
    """Make ``run_dir.parent / "latest"`` a relative symlink to ``run_dir`` (replaced atomically)."""
    link = run_dir.parent / "latest"
    tmp = run_dir.parent / f".latest.{os.getpid()}"
    if tmp.is_symlink():
        tmp.unlink()
    tmp.symlink_to(run_dir.name, target_is_directory=True)
    os.replace(tmp, link)
