"""File helpers every floor of vitkit uses (no vitkit imports): atomic writes of files (a full disk
named as such, whatever library wrote) and of directories (a symlink swapped atomically), result
tables as CSV, JSON and Markdown, and reads that refuse anything but a regular file (a FIFO or device
named by mistake must not block or be replaced) and say what the path is instead."""

from __future__ import annotations

import csv
import errno
import json
import math
import os
import secrets
import shutil
import stat
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from safetensors import SafetensorError


def atomic_write(path: str | os.PathLike, write: Callable[[str], None], replace: bool = True) -> Path:
    """Call ``write(tmp_path)`` on a temporary file beside ``path``, fsync it, then rename it
    over ``path``: a crash leaves either the old file or the new one, never a truncated one. A
    symlink at ``path`` is replaced itself; its target is never written.

    With ``replace=False`` the file is linked into place instead, which fails if anything (a file,
    a symlink, even a dangling one) appeared at ``path`` meanwhile: no check-then-write window.

    Raises:
        FileExistsError: ``replace`` is false and ``path`` exists.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        try:
            write(tmp)
        except (RuntimeError, SafetensorError) as error:  # torch.save and safetensors wrap the OS error
            if _disk_full(error, path.parent):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path)) from error
            raise
        with open(tmp, "rb+") as handle:
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o666 & ~_current_umask())  # mkstemp creates 0600; give the usual mode
        if replace:
            os.replace(tmp, path)
        else:
            os.link(tmp, path)  # EEXIST, atomically, when something is there
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def staging_directory(path: str | os.PathLike) -> Path:
    """A fresh name beside ``path`` for a directory to write and then :func:`commit_directory` to
    ``path``: ``.<name>.<random>.tmp`` (not created; the orphan of a killed write matches ``.*.tmp``)."""
    path = Path(path)
    return path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp"


def commit_directory(staging: str | os.PathLike, path: str | os.PathLike) -> Path:
    """Make the complete directory ``staging`` (:func:`staging_directory`) what ``path`` names, as
    :func:`atomic_write` does for a file: its files are fsynced, it is renamed to
    ``<name>.<random>`` beside ``path``, and ``path`` becomes a symlink to it, replaced atomically
    (a directory cannot be renamed over a non-empty one). A crash leaves ``path`` naming either the
    old directory or the new one, both complete. The versions ``path`` no longer names are removed
    (those of an earlier crash too). Returns ``path``."""
    staging, path = Path(staging), Path(path)
    for file in staging.rglob("*"):
        if file.is_file():
            with open(file, "rb+") as handle:
                os.fsync(handle.fileno())
    token = staging.name.removeprefix(f".{path.name}.").removesuffix(".tmp")
    version = path.parent / f"{path.name}.{token}"
    os.rename(staging, version)
    if path.is_dir() and not path.is_symlink():  # a directory written in place by another tool
        shutil.rmtree(path)
    link = path.parent / f".{path.name}.{token}.link.tmp"
    link.symlink_to(version.name, target_is_directory=True)
    os.replace(link, path)
    _fsync_directory(path.parent)
    remove_unlinked_versions(path)
    return path


def remove_unlinked_versions(path: str | os.PathLike) -> list[Path]:
    """Delete the ``<name>.<random>`` directories beside ``path`` that ``path`` (a symlink written by
    :func:`commit_directory`) does not name: replaced versions, or one a crash left unlinked."""
    path = Path(path)
    current = path.resolve() if path.is_symlink() else None
    stale = [version for version in path.parent.glob(f"{path.name}.*")
             if version.is_dir() and not version.is_symlink() and version.resolve() != current]
    for version in stale:
        shutil.rmtree(version, ignore_errors=True)
    return stale


def _fsync_directory(folder: Path) -> None:
    """Persist ``folder``'s entries (a rename or a new link in it)."""
    handle = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(handle)
    finally:
        os.close(handle)


def _disk_full(error: BaseException, folder: Path) -> bool:
    """Whether a library's write ``error`` means the disk is full: its message (or a cause's) says
    so (``os error 28``, torch's "file write failed"), or the folder's filesystem has no space left."""
    texts = []
    while error is not None:
        texts.append(str(error))
        error = error.__cause__ or error.__context__
    if any("No space left" in text or "os error 28" in text for text in texts):
        return True
    try:
        stats = os.statvfs(folder)
    except OSError:
        return False
    return stats.f_bavail * stats.f_frsize < 1 << 20  # under 1 MiB free


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def read_regular_text(path: str | os.PathLike) -> str:
    """The text of ``path``, which must be a regular file.

    The file is opened without blocking and checked on the open descriptor (no window between a
    check and the open): a FIFO would otherwise block the reader forever, a device stream forever.

    Raises:
        OSError: ``path`` is missing, unreadable or not a regular file.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path} is not a regular file")
        os.set_blocking(fd, True)
        with os.fdopen(fd, encoding="utf-8") as handle:
            fd = -1  # the handle owns it now
            return handle.read()
    finally:
        if fd >= 0:
            os.close(fd)


def path_kind(path: str | os.PathLike) -> str:
    """What ``path`` is, for a message that says why it cannot be read: ``"does not exist"``, ``"is a
    folder"``, ``"is a FIFO (named pipe)"``, ``"is a device"``, ``"is a socket"`` or ``"is a file"``
    (a symlink is followed; a dangling one does not exist)."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "does not exist"
    except OSError as error:
        return f"cannot be read ({error.strerror})"
    kinds = ((stat.S_ISDIR, "is a folder"), (stat.S_ISFIFO, "is a FIFO (named pipe)"), (stat.S_ISCHR, "is a device"),
             (stat.S_ISBLK, "is a device"), (stat.S_ISSOCK, "is a socket"))
    return next((what for test, what in kinds if test(mode)), "is a file")


def write_csv(path: str | os.PathLike, rows: Sequence[Mapping[str, Any]]) -> Path:
    """Write ``rows`` (dicts sharing the first row's keys) as CSV, atomically."""
    if not rows:
        raise ValueError(f"no rows to write to {path}.")

    def write(tmp: str) -> None:
        with open(tmp, "w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)

    return atomic_write(path, write)


def write_json(path: Path, values: dict[str, Any]) -> Path:
    """``values`` as indented JSON, atomically; NaN and infinities (a diverged loss) become ``null``,
    which JSON can hold."""
    text = json.dumps(_finite(values), indent=2, allow_nan=False)
    return atomic_write(path, lambda tmp: Path(tmp).write_text(text + "\n"))


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    return value


def markdown_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """A GitHub Markdown table of ``rows`` (the first row's keys are the columns)."""
    columns = list(rows[0])
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(str(row[c]) for c in columns) + " |" for row in rows]
    return "\n".join(lines) + "\n"
