"""Shared fixtures for vitkit's tests."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
import torch


@pytest.fixture(autouse=True)
def seed() -> int:
    """Seed torch's global RNG before every test, so random inputs, initialisations and
    statistical checks are reproducible."""
    torch.manual_seed(0)
    return 0


TOOLS = Path(__file__).resolve().parents[1] / "tools"


@pytest.fixture
def load_tool() -> Callable[[str], ModuleType]:
    """``load_tool("prune_heads")`` imports ``tools/prune_heads.py`` as a module, so a test can call
    its ``main(argv)`` in-process."""

    def load(name: str) -> ModuleType:
        spec = importlib.util.spec_from_file_location(f"{name}_tool", TOOLS / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
        return module

    return load
