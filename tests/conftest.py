"""Shared fixtures for vitkit's tests."""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Iterator
from types import ModuleType

import pytest
import torch
from tiny_runs import RENDEZVOUS


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist (``make test`` runs ``-n auto``), each worker gets its share of the cores:
    torch's threads in the worker and ``OMP_NUM_THREADS`` for the tools its tests start. Two workers
    each running torch on every core would contend for them (OpenMP threads spin while they wait)."""
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if workers:
        threads = max(1, (os.cpu_count() or 1) // int(workers))
        torch.set_num_threads(threads)
        os.environ["OMP_NUM_THREADS"] = str(threads)


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


@pytest.fixture(autouse=True)
def _no_leaked_rendezvous() -> Iterator[None]:
    """Each test leaves ``os.environ``'s distributed rendezvous and torch's default process group
    as it found them: an in-process FSDP or DDP run sets ``MASTER_PORT`` and the ranks, and a later
    run would join them; a group it leaves initialised makes a later single-process call behave as
    a rank of it (``torch.distributed.checkpoint.save`` no longer warns that it saves alone)."""
    before = {key: os.environ.get(key) for key in RENDEZVOUS}
    grouped = torch.distributed.is_available() and torch.distributed.is_initialized()
    yield
    if not grouped and torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    for key, value in before.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
