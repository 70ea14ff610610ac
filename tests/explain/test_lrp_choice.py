"""``choose_lrp_rules``: every preset measured on the given images, the one with the highest
insertion minus deletion area kept, whatever the candidates' order."""

from __future__ import annotations

import pytest
import torch
from tiny_models import tiny_shapes_model

from vitkit.explain import LRP_PRESETS, LRPRules, choose_lrp_rules, perturbation_curves
from vitkit.explain.faithfulness import pool_per_patch
from vitkit.explain.lrp import lrp_relevance


def independent_score(model: torch.nn.Module, images: torch.Tensor, rules: LRPRules, steps: int) -> float:
    """Mean insertion minus deletion area of lrp's per-patch maps, from the curves directly."""
    with torch.no_grad():
        targets = model(images).argmax(dim=-1)
    maps = pool_per_patch(lrp_relevance(model, images, targets, rules=rules).pixels, tuple(model.config.patch_size))
    curves = perturbation_curves(model, images, maps, tuple(model.config.patch_size), targets, steps=steps)
    areas = curves.auc()
    return float(areas["insertion"].mean() - areas["deletion"].mean())


def test_the_choice_is_the_preset_with_the_best_measured_score_in_any_order() -> None:
    torch.manual_seed(0)
    model = tiny_shapes_model().eval()
    images = torch.randn(6, 3, *model.config.img_size)
    choice = choose_lrp_rules(model, images, steps=4)
    expected = {name: independent_score(model, images, rules, 4) for name, rules in LRP_PRESETS.items()}
    assert list(choice.scores) == list(LRP_PRESETS) and choice.num_images == 6
    for name in LRP_PRESETS:
        assert choice.scores[name] == pytest.approx(expected[name], abs=1e-6)
    assert choice.name == max(expected, key=expected.get) and choice.rules == LRP_PRESETS[choice.name]
    reversed_order = dict(reversed(list(LRP_PRESETS.items())))
    assert choose_lrp_rules(model, images, candidates=reversed_order, steps=4).name == choice.name
    assert choice.describe().startswith(f"lrp rules: {choice.name}, the most faithful preset on 6 validation images")


def test_ties_go_to_the_first_candidate_and_empty_input_is_refused() -> None:
    torch.manual_seed(0)
    model = tiny_shapes_model().eval()
    images = torch.randn(2, 3, *model.config.img_size)
    same = {"first": LRPRules(), "second": LRPRules()}
    assert choose_lrp_rules(model, images, candidates=same, steps=2).name == "first"
    with pytest.raises(ValueError, match="at least one image"):
        choose_lrp_rules(model, images[:0])
    with pytest.raises(ValueError, match="at least one LRPRules"):
        choose_lrp_rules(model, images, candidates={})
