"""Folders vitkit writes results into: marked as vitkit's, never mixed, and locked while in use.

Every run directory and every tool's ``--out`` folder holds a small marker file, ``.vitkit``, that
names what wrote it (``{"written_by": "train"}``, ``"prune_heads"``, ...). That marker is how vitkit
knows a folder is its own:

- ``--resume`` continues in a checkpoint's run directory only when the marker says ``train``
  (a user's folder that happens to hold a ``config.yaml`` is not adopted);
- a tool refuses an ``--out`` folder that another tool or a training run wrote, or that holds
  result files (``summary.json``, ``model.safetensors``, ...) without a marker; rerunning the same
  tool into its own folder replaces its results, as before;
- :func:`hold` takes an exclusive ``flock`` on the marker for as long as a run uses its folder, so
  two resumes of one run (or a resume of a run still training) cannot share it; a tool's
  :func:`claim_output_dir` takes the same lock until its command ends
  (:func:`release_output_dirs`), so two tools writing into one folder at once cannot mix their
  files, and the marker's ``state`` says ``running`` until the command finished, so a folder that a
  killed command left half-written is named as such by the next run. The kernel releases
  the lock when the process ends, however it ends, so a killed run leaves no stale lock.
- the marker is opened without following links, and one that is not a regular file (a symlink
  to a file elsewhere, a folder) is refused: writing it never reaches outside the folder.

A command's single output file (``explore --out page.html``, ``predict --csv out.csv``) has no
folder of its own to mark: :func:`check_output_file` refuses one that exists (a symlink too, even
a dangling one) unless ``--force``, and one that is an input of the command even then;
:func:`write_output_file` writes it atomically without replacing anything that appeared meanwhile.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import stat
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from .errors import VitkitError
from .files import atomic_write

MARKER = ".vitkit"

#: Files only vitkit's runs and tools write; a folder holding one without a marker is refused.
RESULT_FILES = (
    "summary.json",
    "model.safetensors",
    "pruned.safetensors",
    "config.yaml",
    "curves.png",
    "curves.csv",
    "metrics.csv",
    "eval.json",
    "checkpoints",
)


class OutputDirError(VitkitError):
    """A folder or file vitkit would write holds results it must not overwrite, or is in use."""


def written_by(folder: str | os.PathLike) -> str | None:
    """What the marker of ``folder`` names (``'train'``, a tool's name), or ``None`` without one."""
    path = Path(folder) / MARKER
    try:
        if not stat.S_ISREG(path.lstat().st_mode):  # a link is no marker: vitkit writes its markers itself
            return None
        value = json.loads(path.read_text()).get("written_by")
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, str) else None


def mark(folder: str | os.PathLike, kind: str) -> Path:
    """Create ``folder`` if needed and write its marker naming ``kind``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    fd = _open_marker(folder / MARKER)
    try:
        _write_marker(fd, {"written_by": kind})
    finally:
        os.close(fd)
    return folder


def check_output_dir(
    folder: str | os.PathLike, tool: str, extra_results: Iterable[str] = (), inputs: Iterable[str | os.PathLike] = ()
) -> Path:
    """``folder``, if ``tool`` may write its results there (nothing is created): a tool checks this
    before its work, so a refused folder costs nothing, and claims it (:func:`claim_output_dir`)
    once it has results, so refused input leaves no empty folder behind.

    Args:
        folder: the ``--out`` folder.
        tool: the tool's name, stored in the marker.
        extra_results: more file names the tool writes (refused without a marker, like
            :data:`RESULT_FILES`).
        inputs: files the tool reads (its model): never inside ``folder``, where its results
            (``pruned.safetensors``, ...) could replace them.

    Raises:
        OutputDirError: ``folder`` is a file, another tool's or a training run's folder, holds
            result files vitkit did not mark, or holds one of ``inputs``.
    """
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise OutputDirError(f"--out {folder} is a file, not a folder; choose a folder.")
    owner = written_by(folder) if folder.is_dir() else None
    if owner is not None and owner != tool:
        what = "a training run" if owner == "train" else f"{owner}'s output folder"
        raise OutputDirError(
            f"--out {folder} is {what}; writing {tool}'s results there would overwrite its files. "
            "Choose another folder (e.g. a subfolder)."
        )
    if owner is None and folder.is_dir():
        found = sorted(name for name in {*RESULT_FILES, *extra_results} if (folder / name).exists())
        if found:
            raise OutputDirError(
                f"--out {folder} already holds {', '.join(found)}, not written by {tool} (or by an older vitkit); "
                "choose another folder, or move those files first."
            )
    inside = next((source for source in inputs if Path(source).is_file() and Path(source).resolve().parent == folder.resolve()), None)
    if inside is not None:
        raise OutputDirError(
            f"--out {folder} holds this command's input {inside}, which its results could replace; choose another "
            "folder (or move the input out of it)."
        )
    return folder


#: Folders claimed by the command running in this process, with their locked markers' descriptors.
_CLAIMED: list[tuple[Path, int]] = []


def claim_output_dir(
    folder: str | os.PathLike, tool: str, extra_results: Iterable[str] = (), inputs: Iterable[str | os.PathLike] = ()
) -> Path:
    """``folder``, checked (:func:`check_output_dir`), created, marked as ``tool``'s and locked
    (``state: running``) until :func:`release_output_dirs` (the command's end).

    Raises:
        OutputDirError: as :func:`check_output_dir`, or another process is writing into ``folder``.
    """
    folder = check_output_dir(folder, tool, extra_results, inputs)
    folder.mkdir(parents=True, exist_ok=True)
    marker = folder / MARKER
    fd = _open_marker(marker)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _holder(fd)
        os.close(fd)
        raise OutputDirError(
            f"--out {folder} is in use by another vitkit process{holder} writing {tool}'s results; "
            "wait for it to finish, or choose another folder."
        ) from None
    previous = _marker_values(fd)
    _write_marker(fd, {"written_by": tool, "state": "running", "pid": os.getpid()})
    _CLAIMED.append((folder, fd))
    if previous.get("state") == "running":
        print(f"note: the previous {tool} run into {folder} did not finish (it was stopped); this run replaces "
              "its files.", file=sys.stderr)
    return folder


def release_output_dirs(complete: bool) -> None:
    """Unlock the folders this process claimed, marking them ``complete`` when the command
    finished (``complete``); a failed or stopped command leaves ``running`` for the next run to see."""
    for _, fd in _CLAIMED:
        if complete:
            _write_marker(fd, {**_marker_values(fd), "state": "complete"})
        os.close(fd)
    _CLAIMED.clear()


def _open_marker(marker: Path) -> int:
    """A read-write descriptor of ``marker``, created if missing, opened without following a
    symlink: a marker that is a link (to a file anywhere), a folder, a FIFO or a device is refused,
    so that vitkit never writes outside the folder it marks.

    Raises:
        OutputDirError: ``marker`` is not a regular file.
    """
    refused = OutputDirError(
        f"{marker} is not a regular file (a symlink, a folder or a device), so vitkit will not write its marker "
        "there; remove it, or choose another folder."
    )
    try:
        fd = os.open(marker, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o666)
    except OSError as error:
        if error.errno in (errno.ELOOP, errno.EISDIR, errno.ENXIO):
            raise refused from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise refused
    os.set_blocking(fd, True)
    return fd


def _write_marker(fd: int, values: dict) -> None:
    """Replace the marker open as ``fd`` with ``values``' JSON."""
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(values) + "\n").encode(), 0)


def _marker_values(fd: int) -> dict:
    """The JSON object of the marker open as ``fd``; ``{}`` for anything else."""
    try:
        values = json.loads(os.pread(fd, 1 << 16, 0))
    except (OSError, ValueError):
        return {}
    return values if isinstance(values, dict) else {}


def check_output_file(
    path: str | os.PathLike, flag: str, force: bool = False, inputs: Iterable[str | os.PathLike] = ()
) -> Path:
    """``path``, if a command may write its one output file there (nothing is created): checked
    before the command's work, so a refusal costs nothing.

    Args:
        path: the file to write.
        flag: the option that named it (``--out``, ``--csv``), for the message.
        force: an existing file (or symlink, which is replaced itself, never its target) may be replaced.
        inputs: files the command reads (model, weights, images): never replaced, ``force`` or not.

    Raises:
        OutputDirError: ``path`` is a folder, one of ``inputs`` (or a link to one), or exists and
            ``force`` is false.
    """
    path = Path(path)
    if path.is_dir():
        raise OutputDirError(f"{flag} {path} is a folder; give the file to write inside it.")
    blocking = next((parent for parent in path.parents if parent.exists()), None)
    if blocking is not None and not blocking.is_dir():
        raise OutputDirError(f"{flag} {path}: {blocking} is a file, not a folder; choose another path.")
    real = path.resolve()
    if any(real == Path(source).resolve() for source in inputs):
        raise OutputDirError(f"{flag} {path} is one of this command's inputs; choose another file.")
    if not force and (path.exists() or path.is_symlink()):
        raise OutputDirError(f"{flag} {path} already exists; add --force to replace it, or choose another file.")
    _check_writable(blocking or Path.cwd(), path, flag)
    return path


def _check_writable(folder: Path, path: Path, flag: str) -> None:
    """Create and remove a temporary file in ``folder`` (the nearest existing folder of ``path``),
    so that a folder where no file can be written (``/proc``, read-only) is named before the work."""
    try:
        fd, probe = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    except OSError as error:
        raise OutputDirError(f"{flag} {path}: no file can be written in {folder} ({error.strerror}); "
                             "choose another folder.") from None
    os.close(fd)
    os.unlink(probe)


def write_output_file(path: str | os.PathLike, flag: str, write: Callable[[str], None], force: bool = False) -> Path:
    """:func:`~vitkit.files.atomic_write` of a file checked by :func:`check_output_file`: a full
    disk leaves the previous file whole; without ``force``, a file that appeared since the check
    (a second command writing the same file) is not replaced.

    Missing parent folders are created (checked by :func:`check_output_file` before the work).

    Raises:
        OutputDirError: ``force`` is false and ``path`` exists now.
    """
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    try:
        return atomic_write(path, write, replace=force)
    except FileExistsError:
        raise OutputDirError(
            f"{flag} {path} was created by another process while this command ran; it was kept. "
            "Add --force to replace it, or choose another file."
        ) from None


@contextlib.contextmanager
def hold(folder: str | os.PathLike) -> Iterator[None]:
    """Hold an exclusive lock on ``folder``'s marker for the block.

    Raises:
        OutputDirError: another process holds it (the message gives its process id).
    """
    fd = _open_marker(Path(folder) / MARKER)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            raise OutputDirError(
                f"{folder} is in use by another vitkit process{holder} (a run still training, or another "
                "--resume of it); wait for it to finish, or resume a copy of the checkpoint into a new run."
            ) from None
        _write_marker(fd, {**_marker_values(fd), "pid": os.getpid()})  # for the message a second process gets
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _holder(fd: int) -> str:
    """`` (pid N)`` of the process the marker open as ``fd`` names, or ``""``."""
    pid = _marker_values(fd).get("pid")
    return f" (pid {pid})" if isinstance(pid, int) else ""
