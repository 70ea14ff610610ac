"""Shared fixtures for vitkit's tests."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from types import ModuleType

import pytest
import torch


@pytest.fixture(autouse=True)
def seed() -> int:
    """Seed torch's global RNG before every test, so random inputs, initialisations and
    statistical checks are reproducible."""
    torch.manual_seed(0)
    return 0


@pytest.fixture
def load_tool() -> Callable[[str], ModuleType]:
    """``load_tool("prune_heads")`` imports the code of ``tools/prune_heads.py``, ``vitkit.cli.prune_heads``,
    so a test can call its ``main(argv)`` in-process."""
    return lambda name: importlib.import_module(f"vitkit.cli.{name}")
