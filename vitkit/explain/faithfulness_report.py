"""Attribution methods measured side by side on one model and one set of images: the four
perturbation tests of :mod:`.faithfulness`, the time each method takes, and the parameter
randomisation sanity check (Adebayo et al. 2018, arXiv 1810.03292): a map that explains the model
should change when the model's weights are re-drawn, so the rank correlation between the trained
and the randomised model's maps of the same images should be well below 1.
"""

from __future__ import annotations

import copy
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from tqdm import tqdm

from ..models import VisionTransformer
from .faithfulness import HIGHER_IS_BETTER, TESTS, Baseline, perturbation_curves
from .lrp import LRPRules
from .map_methods import BUILTIN_METHODS, MapMethod, map_method
from .targets import HeadlessModelError

#: What :func:`faithfulness` measures unless told otherwise.
DEFAULT_METHODS: tuple[str, ...] = BUILTIN_METHODS
MethodSpec = str | tuple[str, MapMethod]


@dataclass(frozen=True)
class MethodResult:
    """One method's measurements.

    Attributes:
        name: the method's name.
        scores: per test (:data:`~vitkit.explain.faithfulness.TESTS`), the area of each image ``[N]``.
        curves: per test, the curve averaged over the images ``[steps + 1]`` (probabilities; the
            share of correct predictions for ``positive`` and ``negative``).
        seconds_per_image: time to compute the maps (not the tests), per image.
        sanity: mean Spearman rank correlation between the trained and the randomised model's
            maps of each image (``None`` when not measured, or for ``random``).
    """

    name: str
    scores: dict[str, torch.Tensor]
    curves: dict[str, torch.Tensor]
    seconds_per_image: float
    sanity: float | None

    def mean(self, test: str) -> float:
        """The test's area averaged over the images."""
        return float(self.scores[test].mean())


@dataclass(frozen=True)
class FaithfulnessReport:
    """Every method's :class:`MethodResult` on the same images, and how they were perturbed."""

    results: list[MethodResult]
    fractions: torch.Tensor
    baseline: Baseline
    num_images: int

    def result(self, name: str) -> MethodResult:
        return next(result for result in self.results if result.name == name)

    def ranking(self) -> list[str]:
        """Method names from the most to the least faithful by insertion minus deletion area."""
        return sorted((r.name for r in self.results),
                      key=lambda name: self.result(name).mean("deletion") - self.result(name).mean("insertion"))

    def best(self, test: str) -> str:
        """The method with the best mean area in ``test``."""
        sign = 1 if HIGHER_IS_BETTER[test] else -1
        return max(self.results, key=lambda result: sign * result.mean(test)).name

    def rows(self) -> list[dict[str, object]]:
        """One row per method: the mean areas, the sanity correlation and ms per image."""
        return [
            {"method": r.name, **{f"{test}_auc": round(r.mean(test), 4) for test in TESTS},
             "sanity_spearman": None if r.sanity is None else round(r.sanity, 3),
             "ms_per_image": round(1000 * r.seconds_per_image, 2), "images": self.num_images}
            for r in self.results
        ]


def spearman(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Spearman rank correlation of each row of ``a`` and ``b`` ``[B, n]`` (ties ranked by position), ``[B]``."""
    def ranks(x: torch.Tensor) -> torch.Tensor:
        order = torch.sort(x.float(), dim=-1, stable=True).indices
        return torch.empty_like(order, dtype=torch.float32).scatter_(
            1, order, torch.arange(x.shape[-1], dtype=torch.float32).expand_as(order).contiguous())
    ra, rb = ranks(a), ranks(b)
    ra, rb = ra - ra.mean(-1, keepdim=True), rb - rb.mean(-1, keepdim=True)
    return (ra * rb).sum(-1) / (ra.norm(dim=-1) * rb.norm(dim=-1)).clamp_min(1e-12)


#: Offsets the seed of the re-drawn weights, so that a model built right after
#: ``torch.manual_seed(seed)`` is not its own randomisation.
REDRAW_STREAM = 0x5EED


def randomized_copy(model: VisionTransformer, seed: int = 0) -> VisionTransformer:
    """A copy of ``model`` with every parameter re-drawn as at construction (the same
    architecture, pruned heads included) from ``seed`` (:data:`REDRAW_STREAM`), in eval mode."""
    twin = copy.deepcopy(model)
    with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Initializing zero-element tensors")  # a layer with every head pruned
        torch.manual_seed(REDRAW_STREAM + seed)
        twin.reset_parameters()
    return twin.eval()


def _named(method: MethodSpec, seed: int, rules: LRPRules | None) -> tuple[str, MapMethod]:
    if isinstance(method, str):
        return method, map_method(method, seed=seed, rules=rules)
    name, function = method
    return name, function


def faithfulness(
    model: VisionTransformer,
    images: torch.Tensor,
    labels: torch.Tensor | None = None,
    methods: Sequence[MethodSpec] = DEFAULT_METHODS,
    *,
    baseline: Baseline = "mean",
    steps: int | None = None,
    batch_size: int = 32,
    sanity: bool = True,
    seed: int = 0,
    rules: LRPRules | None = None,
    progress: bool = False,
    on_batch: Callable[[int], bool] | None = None,
) -> FaithfulnessReport:
    """Measure ``methods`` on ``model`` and ``images`` ``[N, C, H, W]`` (normalised as for evaluation).

    Each method explains the model's predicted class of each image; the positive and negative
    tests count a prediction as correct when it equals ``labels`` ``[N]`` (default: the
    unperturbed prediction). Every method sees the same images, baseline and steps; a method is
    called with gradients enabled (it may need them) and timed alone.

    Args:
        model: a vitkit ``VisionTransformer`` with a classifier, in eval mode.
        methods: names of :data:`~vitkit.explain.map_methods.BUILTIN_METHODS`, or ``(name, callable)``
            pairs (:data:`~vitkit.explain.map_methods.MapMethod`).
        baseline: what replaces a deleted patch (``"mean"`` or ``"blur"``).
        steps: perturbation steps over the patch grid (default one patch per step).
        batch_size: images per forward pass.
        sanity: also run the parameter randomisation check (twice the maps' time).
        seed: seeds ``random`` and the randomised model.
        rules: ``lrp``'s rules (default :class:`~vitkit.explain.lrp.LRPRules()`).
        progress: show a tqdm bar over batches and methods.
        on_batch: called after each batch with the number of images measured so far; ``True``
            stops there, and the report covers those images (a command stopped by a signal
            writes a partial table).
    """
    named = _checked_methods(model, images, labels, methods, seed, rules)
    names = [name for name, _ in named]
    randomized = randomized_copy(model, seed) if sanity else None
    patch_size = tuple(model.config.patch_size)
    collected: dict[str, dict[str, list[torch.Tensor]]] = {name: {} for name in names}
    seconds = dict.fromkeys(names, 0.0)
    correlations: dict[str, list[torch.Tensor]] = {name: [] for name in names}
    fractions, done = None, 0
    batches = range(0, len(images), batch_size)
    bar = tqdm(total=len(batches) * len(named), desc="faithfulness", disable=not progress, leave=False)
    for first in batches:
        batch = images[first : first + batch_size].to(next(model.parameters()))  # its device and dtype
        with torch.no_grad():
            targets = model(batch).argmax(dim=-1)
        reference = None if labels is None else labels[first : first + batch_size].to(targets.device)
        for name, method in named:
            start = time.perf_counter()
            maps = method(model, batch, targets)
            seconds[name] += time.perf_counter() - start
            curves = perturbation_curves(model, batch, maps, patch_size, targets, reference=reference,
                                         steps=steps, baseline=baseline)
            fractions = curves.fractions
            for test, area in curves.auc().items():
                collected[name].setdefault(test, []).append(area.cpu())
                collected[name].setdefault(f"curve_{test}", []).append(getattr(curves, test).float().sum(0).cpu())
            if randomized is not None and name != "random":
                correlations[name].append(spearman(maps.flatten(1), method(randomized, batch, targets).flatten(1)).cpu())
            bar.update(1)
        done = min(first + batch_size, len(images))
        if on_batch is not None and on_batch(done):
            break
    bar.close()
    results = [
        MethodResult(
            name=name,
            scores={test: torch.cat(collected[name][test]) for test in TESTS},
            curves={test: torch.stack(collected[name][f"curve_{test}"]).sum(0) / done for test in TESTS},
            seconds_per_image=seconds[name] / done,
            sanity=float(torch.cat(correlations[name]).mean()) if correlations[name] else None,
        )
        for name in names
    ]
    return FaithfulnessReport(results=results, fractions=fractions, baseline=baseline, num_images=done)


def _checked_methods(
    model: VisionTransformer, images: torch.Tensor, labels: torch.Tensor | None, methods: Sequence[MethodSpec],
    seed: int, rules: LRPRules | None,
) -> list[tuple[str, MapMethod]]:
    """``methods`` as ``(name, map method)``, once the model, labels and names are checked."""
    if model.config.num_classes == 0:
        raise HeadlessModelError("faithfulness measures how a map explains a class, and this model has no classifier.")
    if labels is not None and len(labels) != len(images):
        raise ValueError(f"labels must have one class per image ({len(images)}), got {len(labels)}.")
    named = [_named(method, seed, rules) for method in methods]
    names = [name for name, _ in named]
    if len(set(names)) != len(names):
        raise ValueError(f"method names must differ, got {names}.")
    return named
