"""vitkit's methods measured side by side: on a ViT trained so that one patch alone decides the
class, every method's deletion curve drops at the first step and the random map's does not; the
parameter randomisation check separates the trained model from a randomised one; a method of
one's own plugs in; every architecture runs; Spearman's correlation against scipy."""

from __future__ import annotations

import pytest
import torch
from scipy.stats import spearmanr

import vitkit
from vitkit.explain.faithfulness import TESTS
from vitkit.explain.faithfulness_report import faithfulness, randomized_copy, spearman
from vitkit.explain.map_methods import BUILTIN_METHODS
from vitkit.prune.pruning import prune_heads

#: The deciding patch: row 1, column 2 of the 4x4 grid of 4x4 patches (index 6).
ROWS, COLUMNS, DECIDING = slice(4, 8), slice(8, 12), 6


def one_patch_data(count: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """16x16 noise images whose patch 6 is +1 (class 1) or -1 (class 0)."""
    labels = torch.randint(0, 2, (count,), generator=generator)
    images = torch.randn(count, 1, 16, 16, generator=generator) * 0.5
    images[:, :, ROWS, COLUMNS] = (labels.float() * 2 - 1)[:, None, None, None]
    return images, labels


@pytest.fixture(scope="module")
def one_patch_model() -> tuple[vitkit.VisionTransformer, torch.Tensor, torch.Tensor]:
    """A 2-block ViT trained (150 AdamW steps, about a second) until only patch 6 decides its class."""
    torch.manual_seed(0)
    model = vitkit.create_model("vit_cifar_tiny", img_size=16, patch_size=4, in_chans=1, embed_dim=32, depth=2,
                                num_heads=2, num_classes=2)
    generator = torch.Generator().manual_seed(0)
    optimizer = torch.optim.AdamW(model.parameters(), 3e-3)
    for _ in range(150):
        images, labels = one_patch_data(64, generator)
        loss = torch.nn.functional.cross_entropy(model(images), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    images, labels = one_patch_data(32, generator)
    with torch.no_grad():
        assert (model(images).argmax(-1) == labels).float().mean() == 1.0
    return model, images, labels


def test_every_method_finds_the_deciding_patch_first_and_the_random_map_does_not(one_patch_model) -> None:
    model, images, labels = one_patch_model
    report = faithfulness(model, images, labels, batch_size=16, sanity=False)
    assert [r.name for r in report.results] == list(BUILTIN_METHODS)
    random = report.result("random")
    assert random.curves["deletion"][1] > 0.95 and random.curves["positive"][1] > 0.9  # still confident, still right
    for result in report.results:
        assert result.curves["deletion"][0] > 0.99 and result.scores["deletion"].shape == (32,)
        if result.name != "random":
            assert result.curves["deletion"][1] < 0.8, result.name  # the deciding patch went first
            assert result.mean("deletion") < random.mean("deletion") - 0.1
            assert result.mean("insertion") > random.mean("insertion") + 0.1
    assert report.ranking()[-1] == "random" and report.best("deletion") != "random"
    assert report.fractions.tolist() == [k / 16 for k in range(17)]


def test_the_sanity_check_separates_the_trained_model_from_a_randomised_one(one_patch_model) -> None:
    model, images, labels = one_patch_model
    methods = ("chefer", "lrp", "rollout")
    trained = faithfulness(model, images, labels, methods, sanity=True, seed=3)
    for name in methods:
        assert trained.result(name).sanity < 0.5, name
    # a model whose re-drawn weights are its own (seed 3 again) gives the same maps: correlation 1
    redrawn = randomized_copy(model, seed=3)
    same = faithfulness(redrawn, images, labels, methods, sanity=True, seed=3)
    for name in methods:
        assert same.result(name).sanity == pytest.approx(1.0)
    assert any((a - b).abs().max() > 0 for a, b in zip(model.state_dict().values(), redrawn.state_dict().values()))


def test_a_method_of_ones_own_plugs_in_and_the_options_are_used(one_patch_model) -> None:
    model, images, labels = one_patch_model

    def oracle(model, images, targets):  # knows the deciding patch
        maps = torch.zeros(len(images), 4, 4)
        maps.view(len(images), -1)[:, DECIDING] = 1
        return maps

    report = faithfulness(model, images, labels, [("oracle", oracle), "random"], sanity=False, steps=4)
    assert report.fractions.tolist() == [0, 0.25, 0.5, 0.75, 1.0]
    assert report.result("oracle").curves["deletion"][1] < 0.8
    blurred = faithfulness(model, images, labels, [("oracle", oracle)], sanity=False, steps=4, baseline="blur")
    assert blurred.result("oracle").mean("deletion") != report.result("oracle").mean("deletion")
    wrong = faithfulness(model, images, 1 - labels, [("oracle", oracle)], sanity=False, steps=4)
    assert wrong.result("oracle").mean("positive") < 30 < report.result("oracle").mean("positive")  # labels count
    reseeded = faithfulness(model, images, labels, ["random"], sanity=False, seed=5)
    again = faithfulness(model, images, labels, ["random"], sanity=False, seed=5)
    torch.testing.assert_close(reseeded.result("random").scores["deletion"], again.result("random").scores["deletion"])
    with pytest.raises(ValueError, match="method must be one of"):
        faithfulness(model, images, labels, ["gradcam"])
    rows = report.rows()
    assert [row["method"] for row in rows] == ["oracle", "random"] and all(f"{t}_auc" in rows[0] for t in TESTS)


@pytest.mark.parametrize("options", [{"reg_tokens": 2}, {"distilled": True}, {"global_pool": "map", "class_token": False},
                                     {"rope": "axial", "pos_embed": "none"}, {"pruned": True}])
def test_every_architecture_is_measured(options: dict) -> None:
    torch.manual_seed(0)
    pruned = options.pop("pruned", False)
    model = vitkit.create_model("vit_cifar_tiny", img_size=16, patch_size=8, embed_dim=24, depth=2, num_heads=3,
                                num_classes=3, **options).eval()
    if pruned:
        model = prune_heads(model, {1: [0, 1, 2], 0: [1]}).eval()  # the last block has no heads left
    report = faithfulness(model, torch.randn(3, 3, 16, 16), methods=BUILTIN_METHODS, batch_size=2)
    for result in report.results:
        for test in TESTS:
            scale = 100 if test in ("positive", "negative") else 1
            assert 0 <= result.mean(test) <= scale
        assert result.seconds_per_image >= 0


def test_spearman_equals_scipy_and_headless_models_are_refused() -> None:
    a, b = torch.randn(4, 10), torch.randn(4, 10)
    expected = [spearmanr(x, y).statistic for x, y in zip(a.numpy(), b.numpy())]
    torch.testing.assert_close(spearman(a, b), torch.tensor(expected, dtype=torch.float32), atol=1e-6, rtol=1e-5)
    assert spearman(torch.arange(5.0)[None], -torch.arange(5.0)[None]).item() == pytest.approx(-1)
    headless = vitkit.create_model("vit_cifar_tiny", img_size=16, patch_size=8, num_classes=0).eval()
    with pytest.raises(vitkit.explain.HeadlessModelError):
        faithfulness(headless, torch.randn(1, 3, 16, 16))
