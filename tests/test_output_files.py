"""A command's one output file (vitkit.output_dirs.check_output_file / write_output_file): written
atomically, never over a file that appeared after the check, the previous file kept whole on a full disk."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from vitkit.output_dirs import OutputDirError, check_output_file, write_output_file


def test_a_file_created_after_the_check_is_kept_not_replaced(tmp_path: Path) -> None:
    out = check_output_file(tmp_path / "page.html", "--out")
    out.write_text("a second command's page")  # written between this command's check and its write
    with pytest.raises(OutputDirError, match="--out .*page.html was created by another process"):
        write_output_file(out, "--out", lambda tmp: Path(tmp).write_text("ours"))
    assert out.read_text() == "a second command's page"
    assert [p.name for p in tmp_path.iterdir()] == ["page.html"]  # no temporary left


def test_a_full_disk_leaves_the_previous_file_whole(tmp_path: Path) -> None:
    out = tmp_path / "predictions.csv"
    out.write_text("previous")

    def write(tmp: str) -> None:
        Path(tmp).write_text("half")
        raise OSError(errno.ENOSPC, "No space left on device", tmp)

    with pytest.raises(OSError, match="No space left"):
        write_output_file(check_output_file(out, "--csv", force=True), "--csv", write, force=True)
    assert out.read_text() == "previous" and [p.name for p in tmp_path.iterdir()] == ["predictions.csv"]
