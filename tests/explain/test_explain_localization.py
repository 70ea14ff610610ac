"""Pointing game and mass-in-box scores of relevance maps against object boxes."""

from __future__ import annotations

import pytest
import torch

import vitkit
from vitkit.data import ShapesDataset
from vitkit.explain import evaluate_localization, explain, localization_scores
from vitkit.explain.localization import box_masks


def test_box_masks_treat_x1_and_y1_as_exclusive() -> None:
    mask = box_masks(torch.tensor([[1.0, 2.0, 3.0, 4.0]]), (5, 6))
    assert mask.sum() == 4
    assert mask[0, 2:4, 1:3].all()


def test_map_peaked_inside_the_box_hits_and_holds_all_mass() -> None:
    maps = torch.zeros(2, 8, 8)
    maps[0, 5, 6] = 1.0  # inside (x 4..8, y 4..8)
    maps[1, 1, 1] = 1.0  # outside
    scores = localization_scores(maps, [(4, 4, 8, 8), (4, 4, 8, 8)])
    assert scores.pointing.tolist() == [True, False]
    torch.testing.assert_close(scores.mass_in_box, torch.tensor([1.0, 0.0]))


def test_uniform_map_puts_the_box_area_share_in_the_box() -> None:
    scores = localization_scores(torch.ones(1, 10, 10), torch.tensor([[0, 0, 5, 4]]))
    assert scores.mass_in_box.item() == pytest.approx(0.2)
    assert scores.box_area.item() == pytest.approx(0.2)
    assert scores.summary() == pytest.approx({"pointing_game": 100.0, "mass_in_box": 20.0, "box_area": 20.0})


def test_all_zero_map_scores_zero_mass_without_nan() -> None:
    scores = localization_scores(torch.zeros(1, 4, 4), [(0, 0, 2, 2)])
    assert scores.mass_in_box.item() == 0.0


def test_mismatched_maps_and_boxes_raise() -> None:
    with pytest.raises(ValueError, match="same B"):
        localization_scores(torch.zeros(2, 4, 4), [(0, 0, 2, 2)])


def test_evaluate_localization_scores_each_dataset_image_against_its_own_box(seed: int) -> None:
    dataset = ShapesDataset(num_samples=7, img_size=32, seed=1)
    model = vitkit.create_model("vit_cifar_tiny", patch_size=8, embed_dim=24, depth=2, num_heads=3, num_classes=6)
    model.eval()
    scores = evaluate_localization(model, dataset, dataset.boxes, "grad_rollout", batch_size=3, max_images=5)
    assert scores.pointing.shape == scores.mass_in_box.shape == (5,)
    boxes = torch.as_tensor(dataset.boxes[:5], dtype=torch.float32)
    areas = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1]) / (32 * 32)
    torch.testing.assert_close(scores.box_area, areas)
    images = torch.stack([dataset[i][0] for i in range(5)])
    labels = torch.tensor([dataset[i][1] for i in range(5)])
    maps = explain(model, images, "grad_rollout", target=labels)  # the pointing game cues the true class
    torch.testing.assert_close(scores.mass_in_box, localization_scores(maps, boxes).mass_in_box)


def test_pointing_tolerance_counts_near_misses_by_euclidean_distance() -> None:
    from vitkit.explain.localization import localization_scores, pointing_tolerance

    maps = torch.zeros(3, 10, 10)
    maps[0, 2, 7] = 1.0  # 2 px right of the box's last column (x = 5)
    maps[1, 7, 7] = 1.0  # 2 px right and 2 px below: distance sqrt(8) = 2.83
    maps[2, 4, 4] = 1.0  # inside
    boxes = torch.tensor([[2, 2, 6, 6]] * 3)
    assert localization_scores(maps, boxes).pointing.tolist() == [False, False, True]
    assert localization_scores(maps, boxes, tolerance=2).pointing.tolist() == [True, False, True]
    assert localization_scores(maps, boxes, tolerance=3).pointing.tolist() == [True, True, True]
    assert pointing_tolerance((224, 224)) == 15 and pointing_tolerance((32, 32)) == 2


def test_localization_explains_the_label_by_default(monkeypatch) -> None:
    from vitkit.explain import localization

    seen = []

    def spy(model, images, method, target=None, **options):
        seen.append(target)
        return torch.ones(len(images), 32, 32)

    monkeypatch.setattr(localization, "explain", spy)
    dataset = torch.utils.data.TensorDataset(torch.zeros(4, 3, 32, 32), torch.tensor([3, 1, 4, 1]))
    boxes = torch.tensor([[0, 0, 8, 8]] * 4)
    localization.evaluate_localization(None, dataset, boxes, "grad_rollout")
    localization.evaluate_localization(None, dataset, boxes, "grad_rollout", explain_class="predicted")
    assert seen[0].tolist() == [3, 1, 4, 1] and seen[1] is None
