"""The processes of a DDP run start alike and then draw apart: 2 ranks of a DDP run of the tiny recipe,
forked from the test (tests/helpers/ddp_seed_worker.py), hold the same initial weights, and from the
start of training their global generators (which augmentation on the device, masks and dropout draw
from) are seeded ``seed + rank``, as MAE's and timm's training scripts seed each process."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch
from ddp_seed_worker import SEED, main
from tiny_runs import run_forked


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    folder = tmp_path_factory.mktemp("ddp_seeds")
    run_forked(main, folder)
    return [json.loads((folder / f"rank{rank}.json").read_text()) for rank in (0, 1)]


def test_the_ranks_start_from_the_same_weights(ranks: list[dict]) -> None:
    assert ranks[0]["weights"] == ranks[1]["weights"]


def test_each_rank_draws_from_the_seed_plus_its_rank(ranks: list[dict]) -> None:
    for rank, drawn in enumerate(ranks):
        assert drawn["torch"] == torch.rand(4, generator=torch.Generator().manual_seed(SEED + rank)).tolist()
        assert drawn["numpy"] == np.random.RandomState(SEED + rank).rand(4).tolist()
        python = random.Random(SEED + rank)
        assert drawn["python"] == [python.random() for _ in range(4)]
    assert ranks[0]["torch"] != ranks[1]["torch"]  # before, both ranks flipped, shifted and masked alike
