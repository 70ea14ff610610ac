"""The one evaluation loop (vitkit.evaluation): loss and accuracies by hand count, device, modes."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from vitkit.evaluation import (
    UnknownTTAError,
    batch_metrics,
    black_level,
    evaluate_model,
    predict,
    predict_views,
    shift_images,
)


class FixedLogits(nn.Module):
    """Returns ``table[i]`` for an image whose first pixel holds ``i``; records its head masks."""

    def __init__(self, table: torch.Tensor) -> None:
        super().__init__()
        self.anchor = nn.Parameter(torch.zeros(1))
        self.register_buffer("table", table)
        self.head_gatess: list[object] = []

    def forward(self, images: torch.Tensor, head_gates: object = None) -> torch.Tensor:
        self.head_gatess.append(head_gates)
        return self.table[images[:, 0, 0, 0].long()] + 0 * self.anchor


def indexed_images(count: int) -> torch.Tensor:
    return torch.arange(count).float().view(count, 1, 1, 1).expand(count, 1, 2, 2).contiguous()


# 6 classes; image i's scores rank the classes in the order given by ORDERS[i].
ORDERS = [[0, 1, 2, 3, 4, 5], [5, 4, 3, 2, 1, 0], [2, 0, 1, 3, 4, 5], [1, 2, 3, 4, 5, 0], [3, 4, 5, 0, 1, 2]]
LABELS = torch.tensor([0, 0, 1, 0, 0])
# top-1 hits: image 0 only -> 1/5; top-5 misses: images 1 and 3 rank their label 0 last -> 3/5


def ranked_logits() -> torch.Tensor:
    table = torch.zeros(len(ORDERS), 6)
    for row, order in enumerate(ORDERS):
        for rank, cls in enumerate(order):
            table[row, cls] = 6.0 - rank  # the first class scores 6, the last 1
    return table


def hand_cross_entropy() -> float:
    """Mean cross-entropy of :func:`ranked_logits` on ``LABELS``, written out: every row scores the
    classes 6, 5, ..., 1, so each image's loss is log(sum e^v) minus its label's score."""
    log_z = math.log(sum(math.exp(v) for v in range(1, 7)))
    return sum(log_z - (6.0 - ORDERS[i].index(int(LABELS[i]))) for i in range(len(ORDERS))) / len(ORDERS)


def test_batch_metrics_are_cross_entropy_and_top1_top5_by_hand_count() -> None:
    loss, acc1, acc5 = batch_metrics(ranked_logits(), LABELS)
    assert acc1.item() == pytest.approx(20.0) and acc5.item() == pytest.approx(60.0)
    assert loss.item() == pytest.approx(hand_cross_entropy(), rel=1e-6)


def test_evaluation_over_uneven_batches_equals_the_per_image_counts() -> None:
    model = FixedLogits(ranked_logits())
    images = indexed_images(5)
    loader = [(images[:2], LABELS[:2]), (images[2:], LABELS[2:])]
    result = evaluate_model(model, loader)
    assert (result.top1, result.top5, result.num_images) == (pytest.approx(20.0), pytest.approx(60.0), 5)
    assert result.loss == pytest.approx(hand_cross_entropy(), rel=1e-6)
    assert result.predictions.tolist() == [order[0] for order in ORDERS]
    assert torch.equal(result.labels, LABELS)


def test_evaluation_stops_after_max_batches_and_passes_head_gatess() -> None:
    model = FixedLogits(ranked_logits())
    images = indexed_images(5)
    gates = [torch.ones(2), torch.tensor([1.0, 0.0])]
    loader = [(images[i : i + 1], LABELS[i : i + 1]) for i in range(5)]
    result = evaluate_model(model, loader, head_gates=gates, max_batches=2)
    assert result.num_images == 2 and result.top1 == pytest.approx(50.0)
    assert all(torch.equal(g, e) for mask in model.head_gatess for g, e in zip(mask, gates))


def test_evaluation_runs_in_eval_mode_on_the_models_device_and_restores_its_mode() -> None:
    seen = []
    model = nn.Sequential(nn.Flatten(), nn.Linear(4, 3), nn.Dropout(0.9)).train()
    model.register_forward_hook(lambda module, args, out: seen.append((module.training, args[0].device)))
    evaluate_model(model, [(torch.randn(4, 1, 2, 2), torch.tensor([0, 1, 2, 0]))])
    assert seen == [(False, torch.device("cpu"))]
    assert model.training and model[2].training


def test_the_forward_time_counts_the_model_and_not_the_loading() -> None:
    """images/s is of the forward: a loader that sleeps 0.2 s a batch and a model that sleeps
    0.05 s a call give 2 batches of 4 images in 0.1 s of forward, whatever the loading took."""
    import time

    class Slow(FixedLogits):
        def forward(self, images: torch.Tensor, head_gates: object = None) -> torch.Tensor:
            time.sleep(0.05)
            return super().forward(images, head_gates)

    def loader():
        for first in (0, 4):
            time.sleep(0.2)
            yield indexed_images(8)[first : first + 4] % 5, torch.zeros(4, dtype=torch.long)

    result = evaluate_model(Slow(ranked_logits()), loader())
    assert 0.1 <= result.forward_seconds < 0.19
    assert result.images_per_second == pytest.approx(8 / result.forward_seconds)


def test_a_callable_that_is_no_module_is_scored_on_the_cpu() -> None:
    """An exported graph (vitkit.export.OnnxClassifier) is a plain callable: scored as a module is."""
    table = ranked_logits()
    result = evaluate_model(lambda images: table[images[:, 0, 0, 0].long()], [(indexed_images(5), LABELS)])
    assert (result.top1, result.top5) == (pytest.approx(20.0), pytest.approx(60.0))


def test_empty_loader_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="yielded no examples"):
        evaluate_model(FixedLogits(ranked_logits()), [])


class Halves(nn.Module):
    """Three classes scored from a ``[B, 1, 1, 2]`` image: its left pixel, its right pixel, and 1.5."""

    def __init__(self) -> None:
        super().__init__()
        self.anchor = nn.Parameter(torch.zeros(1))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        left, right = images[:, 0, 0, 0], images[:, 0, 0, 1]
        return torch.stack([left, right, torch.full_like(left, 1.5)], dim=1) + 0 * self.anchor


def test_hflip_averages_the_class_probabilities_of_the_image_and_its_mirror() -> None:
    image = torch.tensor([[[[2.0, 0.0]]]])  # scores (2, 0, 1.5); its mirror scores (0, 2, 1.5)
    z = math.exp(2.0) + math.exp(0.0) + math.exp(1.5)  # the same partition function for both views
    expected = [(math.exp(2.0) + 1.0) / (2 * z)] * 2 + [math.exp(1.5) / z]
    probs = predict(Halves(), image, "hflip").softmax(-1)[0]
    assert probs.tolist() == pytest.approx(expected, rel=1e-6)
    assert predict(Halves(), image, "none").tolist() == [[2.0, 0.0, 1.5]]
    # the mirror moves the left class's mass to the right one: averaged, the constant class wins
    label = torch.tensor([2])
    assert evaluate_model(Halves(), [(image, label)], tta="none").top1 == 0.0
    assert evaluate_model(Halves(), [(image, label)], tta="hflip").top1 == 100.0


class Recording(nn.Module):
    """Scores ``[B, C, H, W]`` images by a fixed linear map of their pixels; records every input."""

    def __init__(self, pixels: int, classes: int = 3) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(pixels, classes, generator=torch.Generator().manual_seed(0)))
        self.inputs: list[torch.Tensor] = []

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        self.inputs.append(images.clone())
        return images.flatten(1) @ self.weight


def test_shift_moves_the_pixels_and_fills_the_uncovered_border_per_channel() -> None:
    image = torch.arange(1.0, 10.0).view(1, 1, 3, 3).repeat(1, 2, 1, 1)
    image[:, 1] *= 10
    fill = torch.tensor([-1.0, -2.0])
    down = shift_images(image, 1, 0, fill)
    assert down[0, 0].tolist() == [[-1, -1, -1], [1, 2, 3], [4, 5, 6]]
    assert down[0, 1].tolist() == [[-2, -2, -2], [10, 20, 30], [40, 50, 60]]
    assert shift_images(image, 0, -1, fill)[0, 0].tolist() == [[2, 3, -1], [5, 6, -1], [8, 9, -1]]
    assert shift_images(image, -1, 1, fill)[0, 0].tolist() == [[-1, 4, 5], [-1, 7, 8], [-1, -1, -1]]


def test_hflip_shift_scores_the_windows_training_pad_and_crop_cuts_and_their_mirrors() -> None:
    # Training pads the uint8 pixels with zeros and crops (vitkit.data.batch_transforms.random_crop),
    # then normalises; the views are derived here the same way, in pixel space.
    raw = torch.randint(0, 256, (2, 2, 4, 5), generator=torch.Generator().manual_seed(1)).float()
    mean, std = torch.tensor([0.3, 0.6]), torch.tensor([0.2, 0.25])

    def normalise(pixels: torch.Tensor) -> torch.Tensor:
        return (pixels / 255 - mean.view(1, -1, 1, 1)) / std.view(1, -1, 1, 1)

    padded = torch.nn.functional.pad(raw, (1, 1, 1, 1))
    windows = [(1, 1), (2, 1), (0, 1), (1, 2), (1, 0)]  # (top, left) offsets: centre, up, down, left, right
    expected = []
    for top, left in windows:
        crop = normalise(padded[..., top : top + 4, left : left + 5])
        expected += [crop, crop.flip(-1)]
    model = Recording(2 * 4 * 5)
    views = predict_views(model, normalise(raw), "hflip_shift", black_level(mean.tolist(), std.tolist()))
    assert len(views) == len(model.inputs) == 10
    for seen, want in zip(model.inputs, expected):
        torch.testing.assert_close(seen, want)
    probabilities = torch.stack([(view.flatten(1) @ model.weight).softmax(-1) for view in expected]).mean(0)
    averaged = predict(model, normalise(raw), "hflip_shift", black_level(mean.tolist(), std.tolist()))
    torch.testing.assert_close(averaged.softmax(-1), probabilities)
    with pytest.raises(ValueError, match="needs fill="):
        predict(model, normalise(raw), "hflip_shift")


@pytest.mark.parametrize("tta", ["hflp", "HFLIP", None])
def test_an_unknown_tta_is_refused_not_scored_as_one_view(tta: object) -> None:
    image = torch.tensor([[[[2.0, 0.0]]]])
    with pytest.raises(UnknownTTAError, match=rf"test-time augmentation {tta!r} .*'none', 'hflip'"):
        predict(Halves(), image, tta)
    with pytest.raises(UnknownTTAError):
        evaluate_model(Halves(), [(image, torch.tensor([2]))], tta=tta)
