"""What FixMatch keeps across the processes of a multi-device run, in 2 gloo processes forked
from the test (tests/helpers/semi_supervised_worker.py): the processes read disjoint shares of each pass over the
unlabeled images; distribution alignment's running mean is the mean over every process's weak
views; FlexMatch's record takes every process's confident images. Expected values are worked out
from the whole batch (as one process would see it) by hand. Also: the workers of one loader
share a pass out in the same way."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from semi_supervised_worker import MU, PLACES, PROBS, UNLABELED, main
from tiny_runs import run_forked
from torch.utils.data import DataLoader

from vitkit.data.arrays import ArrayDataset
from vitkit.data.unlabeled import SemiSupervisedStream


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    folder = tmp_path_factory.mktemp("semi")
    run_forked(main, folder)
    return [json.loads((folder / f"rank{rank}.json").read_text()) for rank in (0, 1)]


def test_the_processes_read_disjoint_shares_that_make_up_the_pass(ranks: list[dict]) -> None:
    zero, one = ranks[0]["drawn"], ranks[1]["drawn"]
    assert len(zero) == len(one) == UNLABELED // 2
    assert not set(zero) & set(one)  # before the shares, both processes drew the same images
    assert sorted(zero + one) == list(range(UNLABELED))


def test_the_alignment_mean_is_over_every_process_s_weak_views(ranks: list[dict]) -> None:
    first, second = (np.array(batch).mean(axis=0) for batch in PROBS)  # the whole batches' means
    expected = 0.999 * first + 0.001 * second
    for rank, result in enumerate(ranks):
        np.testing.assert_allclose(result["p_model"], expected, rtol=0, atol=1e-6)
        rows = np.array(PROBS[1])[rank * 2: rank * 2 + 2] * ((1 / 3 + 1e-6) / (expected + 1e-6))
        np.testing.assert_allclose(result["aligned"][1], rows / rows.sum(axis=1, keepdims=True), rtol=0, atol=1e-6)


def test_flexmatch_s_record_takes_every_process_s_confident_images(ranks: list[dict]) -> None:
    # confident (>= 0.95): row 1 (class 1, place 7) on rank 0, row 3 (class 0, place 8) on rank 1
    kept = [-1] * 10
    kept[PLACES[1]], kept[PLACES[3]] = 1, 0
    for result in ranks:
        assert result["kept"] == kept
        # 8 images kept as none, one each as classes 0 and 1: beta = count / max(counts, none)
        np.testing.assert_allclose(result["learning_effect"], [1 / 8, 1 / 8, 0], rtol=0, atol=1e-7)


def test_the_workers_of_a_loader_share_each_pass_out() -> None:
    images = np.zeros((24, 2, 2, 1), np.uint8)
    images[:, 0, 0, 0] = np.arange(24)
    labelled = ArrayDataset(np.zeros((4, 2, 2, 1), np.uint8), np.arange(4) % 2, lambda image: torch.zeros(1), None)
    stream = SemiSupervisedStream(labelled, images, 3, seed=1)
    loader = DataLoader(stream, batch_size=2, num_workers=2, multiprocessing_context="fork")
    seen = [value for batch in loader for value in batch[2][..., 0, 0, 0].flatten().tolist()]
    assert sorted(seen) == list(range(24))  # each image once an epoch: the workers never draw the same one


def test_the_passes_follow_the_seed() -> None:
    images = np.arange(12, dtype=np.uint8).reshape(12, 1, 1, 1)
    labelled = ArrayDataset(np.zeros((2, 1, 1, 1), np.uint8), np.arange(2), lambda image: torch.zeros(1), None)
    draw = lambda seed: [SemiSupervisedStream(labelled, images, MU, seed=seed)[i][3].tolist() for i in range(6)]  # noqa: E731
    torch.manual_seed(0)
    first = draw(3)
    torch.manual_seed(1)  # torch's own generator does not change the passes: every process draws the same
    assert draw(3) == first and draw(4) != first
