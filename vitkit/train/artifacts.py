"""The run directory: where it is, and the files written into it besides checkpoints.

Layout of ``<output.dir>/<recipe name>/<timestamp>/``: ``config.yaml`` (resolved recipe),
``logs/version_<k>/`` (Lightning's CSV log of each attempt; a resumed run adds one),
``metrics.csv`` (the attempts merged), ``checkpoints/{best,last}.ckpt``, ``curves.png``,
``summary.json`` and ``model.safetensors``. ``<output.dir>/<recipe name>/latest`` links to the
last finished run.

Lightning has no equal for these: its ``default_root_dir`` gets ``lightning_logs/version_<k>``
folders, not one directory per run claimed atomically, with the resolved recipe, the exported model
file and a ``latest`` link beside it.
"""

from __future__ import annotations

import csv
import os
import time
from pathlib import Path

from lightning.fabric.utilities.rank_zero import rank_zero_only
from safetensors.torch import save_file
from torch import nn

from ..errors import VitkitError
from ..files import atomic_write
from ..output_dirs import mark, written_by
from .config import RecipeConfig

#: Set by rank 0 for the processes Lightning launches for DDP, so they share its run directory.
RUN_DIR_ENV = "VITKIT_RUN_DIR"
CONFIG_FILE = "config.yaml"
#: What a run directory's marker (:mod:`vitkit.output_dirs`) names.
RUN_KIND = "train"


class RunDirError(VitkitError):
    """The run directory or its ``latest`` link cannot be used as it is."""


def resolve_run_dir(config: RecipeConfig, resume: str | os.PathLike | None) -> Path:
    """The run directory, created: inherited from the launching rank, the run directory of the
    checkpoint to resume (only when vitkit's marker says it is one: see :func:`adopted_run_dir`), or
    a new ``<output.dir>/<name>/<timestamp>`` claimed by rank 0 (:func:`claim_run_dir`; other ranks
    of an externally launched job get the path without creating anything, they write nothing there)."""
    inherited = os.environ.get(RUN_DIR_ENV)
    if inherited:
        return Path(inherited)
    adopted = adopted_run_dir(resume)
    if adopted is not None:
        return adopted
    base = Path(config.output.dir) / config.name
    check_latest_link(base)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    if not is_global_rank_zero():
        return base / stamp
    return claim_run_dir(base, stamp)


def is_global_rank_zero() -> bool:
    """Whether this process is the job's global rank 0, as its launcher's environment says
    (``RANK``/``SLURM_PROCID``, read by Lightning, and ``NODE_RANK``), before any process group exists."""
    return rank_zero_only.rank == 0 and int(os.environ.get("NODE_RANK", "0")) == 0


def adopted_run_dir(resume: str | os.PathLike | None) -> Path | None:
    """The run directory ``<run>/checkpoints/<file>`` of the checkpoint ``resume`` when vitkit's
    marker in ``<run>`` says a training run wrote it, else ``None`` (the resumed run gets a new one)."""
    if resume is None:
        return None
    candidate = Path(resume).resolve().parent
    if candidate.name != "checkpoints" or written_by(candidate.parent) != RUN_KIND:
        return None
    return candidate.parent


def claim_run_dir(base: Path, stamp: str) -> Path:
    """Create ``base/stamp`` exclusively (``base/stamp-1``, ``-2``, ... when another run holds
    it): ``os.mkdir`` either creates the directory or fails, so two runs started in the same second
    never share one."""
    base.mkdir(parents=True, exist_ok=True)
    run_dir, suffix = base / stamp, 1
    while True:
        try:
            run_dir.mkdir()
            return mark(run_dir, RUN_KIND)
        except FileExistsError:
            run_dir, suffix = base / f"{stamp}-{suffix}", suffix + 1


def check_latest_link(base: Path) -> None:
    """Refuse to start when ``base/latest``, the link to the last finished run, is a real file
    or folder (replacing it at the end would lose it)."""
    link = base / "latest"
    if link.exists() and not link.is_symlink():
        raise RunDirError(
            f"{link} is a real {'folder' if link.is_dir() else 'file'}, not the link to the last finished run "
            "that vitkit keeps there; move or rename it, then start the run again."
        )


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


def save_part(part: nn.Module, path: Path, task: str) -> Path:
    """Write a task's trained part (:meth:`~vitkit.tasks.Task.released_parts`: a dense task's head)
    to ``path`` as safetensors, atomically: its state dict on the CPU, with the task's name in the
    metadata (``{"task": task}``)."""
    state = {key: value.detach().cpu().contiguous() for key, value in part.state_dict().items()}
    return atomic_write(path, lambda tmp: save_file(state, tmp, metadata={"task": task}))


def point_latest(run_dir: Path) -> None:
    """Make ``run_dir.parent / "latest"`` a relative symlink to ``run_dir`` (replaced atomically)."""
    check_latest_link(run_dir.parent)
    link = run_dir.parent / "latest"
    tmp = run_dir.parent / f".latest.{os.getpid()}"
    if tmp.is_symlink():
        tmp.unlink()
    tmp.symlink_to(run_dir.name, target_is_directory=True)
    os.replace(tmp, link)
