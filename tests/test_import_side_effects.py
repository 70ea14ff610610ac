"""Importing vitkit changes nothing of the user's: no network request, no environment variable,
no matplotlib backend."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Records every outgoing request (urllib's audit event, raised before any connection is tried).
PROBE = """
import os, sys
requests = []
sys.addaudithook(lambda event, args: requests.append(args[0]) if event == "urllib.Request" else None)
{imports}
print("requests", requests)
print("env", os.environ.get("NO_ALBUMENTATIONS_UPDATE"))
print("albumentations", "albumentations" in sys.modules)
"""


def run_probe(imports: str, **env: str) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if k != "NO_ALBUMENTATIONS_UPDATE"}
    result = subprocess.run(
        [sys.executable, "-c", PROBE.format(imports=imports)],
        env={**clean, "PYTHONPATH": str(ROOT), **env},
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return dict(line.split(" ", 1) for line in result.stdout.splitlines())


def test_importing_vitkit_data_skips_albumentations_update_check_and_restores_the_environment() -> None:
    probe = run_probe("import vitkit.data")
    assert probe == {"requests": "[]", "env": "None", "albumentations": "True"}


def test_the_probe_sees_albumentations_update_check_when_imported_directly() -> None:
    # the control: without vitkit.data in front, importing albumentations asks PyPI
    probe = run_probe("import albumentations")
    assert "pypi.org" in probe["requests"]


def test_a_user_setting_of_the_update_switch_is_kept() -> None:
    assert run_probe("import vitkit.data", NO_ALBUMENTATIONS_UPDATE="0")["requests"] != "[]"


def test_importing_and_plotting_keep_the_users_matplotlib_backend(tmp_path: Path) -> None:
    code = f"""
import matplotlib, numpy as np
matplotlib.use("svg")
import vitkit.train.plots, vitkit.prune.report, vitkit.explain
vitkit.train.plots.plot_confusion_matrix(np.eye(2, dtype=int), ["a", "b"], {str(tmp_path / "cm.png")!r})
print(matplotlib.get_backend())
"""
    result = subprocess.run(
        [sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True, text=True, check=True, timeout=120,
    )
    assert result.stdout.split() == ["svg"]
    assert (tmp_path / "cm.png").read_bytes().startswith(b"\x89PNG")
