"""Shared fixtures for vitkit's tests."""

from __future__ import annotations

import os

os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402


@pytest.fixture(autouse=True)
def seed() -> int:
    """Seed torch's global RNG before every test, so random inputs, initialisations and
    statistical checks are reproducible."""
    torch.manual_seed(0)
    return 0
