"""An attention explorer in the browser: one self-contained HTML file per set of images.

The file holds every embedded layer's attention, ``[H_l, N, N]`` per image, quantised to 8 bits
per weight with one float32 scale per query row (``weight = q * scale``, ``scale = row max / 255``,
so each weight is within half a step, ``row max / 510``, of the float value), the images as PNG
data URIs, and, for each of the ``top_k`` classes of each image, the rollout, gradient-rollout,
Chefer et al. and AttnLRP maps (:mod:`.rollout`, :mod:`.lrp`), each map's deletion and insertion
areas for the predicted class (:mod:`.faithfulness`, :data:`~.faithfulness.SCORE_STEPS` steps) and
the head diagnostics (:mod:`.head_stats`). CSS and
JavaScript are inline and a Content-Security-Policy forbids every request: it opens offline from
``file://``.

Views: the patch view (hover or click a patch to overlay its attention row, or its column: who
attends to it), the model view (a layers x heads grid of that token's maps; a click selects),
the explanations for any of the top classes, and the head diagnostics table. In the page,
``window.vitkitExplorer`` offers ``select({image, layer, head, token, view, target, direction,
opacity, normalization})``, ``currentMap()`` (the displayed map over the patch grid, before colour
mapping), ``state()`` and ``info()``.

Size: per image, ``sum_l H_l * N^2`` bytes of attention, base64-encoded (x 4/3); ViT-S/16 at
224 px is 12 x 6 x 197^2 = 2.8 M weights, 3.7 MB in the file. ``max_bytes`` bounds the file;
``layers`` keeps a subset of the blocks (the explanations always use them all).
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

import numpy as np
import torch
from PIL import Image

from ..data import DataInfo, display_image
from ..errors import VitkitError
from ..method_names import CLASS_METHODS, LABELS, MAP_METHODS
from ..models import VisionTransformer
from .faithfulness import map_scores
from .head_stats import HeadStats, attention_statistics, head_warnings
from .lrp import scaled_relevance
from .maps import AttentionCapture, capture_attention
from .rollout import attention_rollout, chefer_relevance, grad_rollout

#: Default bound on the written file: 50 MB, about 12 images of ViT-S/16 at 224 px, all layers.
DEFAULT_MAX_BYTES = 50_000_000
#: Classes offered in the explanations panel.
TOP_K = 5
#: Decimals kept for the explanation maps and head statistics (small, unquantised JSON numbers).
_DECIMALS = 4
_ASSETS = resources.files(__package__) / "explorer_assets"
#: The Python and command-line spellings of the options that make a file smaller.
_SIZE_HINT = (
    "pass fewer images (vitkit explore --max-images), fewer layers (layers= / --layers, e.g. {example}) "
    "or a higher limit (max_bytes= / --max-bytes {needed})"
)


class ExplorerError(VitkitError, ValueError):
    """Explorer options that cannot be honoured: a layer out of range, a file over its size limit."""


class ExplorerHTML(str):
    """The explorer page; a notebook (IPython's display protocol) shows it in an iframe."""

    def _repr_html_(self) -> str:
        return f'<iframe srcdoc="{html.escape(self)}" style="width: 100%; height: 1100px; border: 0"></iframe>'


@dataclass(frozen=True)
class ExplorerSize:
    """Bytes of the parts of an explorer file that grow with images, layers and tokens.

    Attributes:
        attention_per_layer: ``{layer: base64 bytes of one image's attention and scales}``.
        image: bytes of one image's PNG data URI, bounded from its pixel count.
        fixed: the page's HTML, CSS and JavaScript.
        num_images: images in the file.
    """

    attention_per_layer: dict[int, int]
    image: int
    fixed: int
    num_images: int

    @property
    def per_image(self) -> int:
        return sum(self.attention_per_layer.values()) + self.image

    @property
    def total(self) -> int:
        return self.fixed + self.num_images * self.per_image

    def check(self, limit: int, actual: int | None = None) -> None:
        """Raise :class:`ExplorerError` saying what to pass when the file (``actual`` bytes, or
        this estimate) is over ``limit``."""
        size = self.total if actual is None else actual
        if size <= limit:
            return
        fit = max((limit - self.fixed) // max(self.per_image, 1), 0)
        layers = sorted(self.attention_per_layer)
        example = ",".join(str(layer) for layer in sorted({layers[0], layers[len(layers) // 2], layers[-1]}))
        images = f"at most {fit} image(s) fit with these layers" if fit else "not one image fits with these layers"
        raise ExplorerError(
            f"the explorer of {self.num_images} image(s) over {len(layers)} layer(s) would take "
            f"{'' if actual is not None else 'about '}{_bytes(size)}, over the {_bytes(limit)} limit "
            f"({images}); {_SIZE_HINT.format(example=example, needed=math.ceil(size * 1.05))}."
        )


def _base64_length(num_bytes: int) -> int:
    return 4 * math.ceil(num_bytes / 3)


def _page(title: str, data: str) -> str:
    """The explorer's HTML with its style, code, ``title`` (escaped here) and JSON ``data`` filled in
    in one pass: inserted text is never searched again, so a title holding a placeholder stays a title."""
    values = {
        "/*VITKIT_CSS*/": (_ASSETS / "explorer.css").read_text(encoding="utf-8"),
        "/*VITKIT_JS*/": (_ASSETS / "explorer.js").read_text(encoding="utf-8"),
        "__VITKIT_TITLE__": html.escape(title),
        "__VITKIT_DATA__": data,
    }
    template = (_ASSETS / "explorer.html").read_text(encoding="utf-8")
    return re.sub("|".join(map(re.escape, values)), lambda match: values[match.group(0)], template)


def resolve_layers(layers: Sequence[int] | None, depth: int) -> list[int]:
    """Sorted distinct block indices (negative ones count from the end); all blocks for ``None``."""
    if layers is None:
        return list(range(depth))
    wrong = [layer for layer in layers if not -depth <= layer < depth]
    if wrong:
        raise ExplorerError(f"layers {wrong} are out of range for {depth} blocks (0..{depth - 1}, or -1 for the last).")
    if not layers:
        raise ExplorerError("layers is empty: name at least one block, or pass None for all of them.")
    return sorted({layer % depth for layer in layers})


def _bytes(size: int) -> str:
    """``12.3 MB``, ``45.6 KB`` or ``789 bytes``: never "0.0 MB" for a small size."""
    if size >= 100_000:
        return f"{size / 1e6:.1f} MB"
    return f"{size / 1e3:.1f} KB" if size >= 1_000 else f"{size:,} bytes"


def explorer_size(
    model: VisionTransformer, num_images: int, image_size: tuple[int, int], layers: Sequence[int] | None = None
) -> ExplorerSize:
    """The size of an explorer file of ``num_images`` images of ``image_size`` ``(H, W)``, from the
    model's configuration alone (nothing is run), to refuse a file before computing it."""
    grid = model.patch_embed.grid_size(*image_size)
    tokens = grid[0] * grid[1] + model.num_prefix_tokens
    heads = model.heads_per_layer()
    attention = {
        layer: _base64_length(heads[layer] * tokens * tokens) + _base64_length(4 * heads[layer] * tokens)
        for layer in resolve_layers(layers, len(heads))
    }
    height, width = image_size
    raw_png = height * (3 * width + 1)  # filter byte per row; zlib adds at most ~0.1% to incompressible data
    image = len("data:image/png;base64,") + _base64_length(raw_png + raw_png // 500 + 1024)
    return ExplorerSize(attention, image, len(_page("", "").encode("utf-8")), num_images)


def quantize_rows(attention: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """``[H, N, N]`` weights to ``(uint8 [H, N, N], float32 [H, N] scales)`` with
    ``weight ≈ q * scale``, ``scale = row max / 255`` (an all-zero row has scale 0)."""
    rows = attention.detach().float().cpu().clamp_min(0.0)
    scales = rows.amax(dim=-1) / 255.0
    quantised = torch.round(rows / scales.clamp_min(torch.finfo(torch.float32).tiny)[..., None]).clamp(0, 255)
    return quantised.to(torch.uint8).numpy(), scales.numpy().astype("<f4")


def _b64(array: np.ndarray) -> str:
    return base64.b64encode(array.tobytes()).decode("ascii")


def _png_data_uri(pixels: np.ndarray) -> str:
    """``[H, W, 3]`` floats in ``[0, 1]`` as a PNG data URI."""
    buffer = io.BytesIO()
    Image.fromarray(np.round(np.clip(pixels, 0.0, 1.0) * 255).astype(np.uint8)).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def _rescaled(image: torch.Tensor) -> np.ndarray:
    """A ``[C, H, W]`` input of unknown normalisation as ``[H, W, 3]`` in ``[0, 1]`` (min-max)."""
    pixels = image.float()
    pixels = (pixels - pixels.min()) / (pixels.max() - pixels.min()).clamp_min(1e-12)
    pixels = pixels.permute(1, 2, 0).numpy()
    return np.repeat(pixels, 3, axis=2) if pixels.shape[2] == 1 else pixels


def _numbers(values: torch.Tensor) -> Any:
    """A tensor as nested lists rounded to :data:`_DECIMALS`, NaN as ``None`` (JSON null)."""
    if values.dim() == 0:
        value = float(values)
        return None if math.isnan(value) else round(value, _DECIMALS)
    return [_numbers(row) for row in values]


def _stats_json(stats: HeadStats) -> dict[str, Any]:
    best, partner = stats.most_similar()
    return {
        "entropy": _numbers(stats.entropy),
        "diagonal": _numbers(stats.diagonal),
        "cls_share": _numbers(stats.cls_share),
        "max_similarity": _numbers(best),
        "most_similar_head": partner.tolist(),
    }


def _batch_payload(
    model: VisionTransformer, images: torch.Tensor, layers: list[int], top_k: int
) -> tuple[list[dict[str, Any]], HeadStats]:
    """The per-image records of one batch (without names and pixels) and its head statistics."""
    capture = capture_attention(model, images)
    prefix, pooling = capture.num_prefix_tokens, capture.pooling
    probabilities = capture.logits.softmax(dim=-1)
    top = probabilities.topk(top_k, dim=-1)
    rollout = attention_rollout(capture.attentions, "mean", 0.0, prefix, pooling)
    by_rank: list[AttentionCapture] = [
        capture_attention(model, images, top.indices[:, rank], with_gradients=True, with_relevance=True)
        for rank in range(top_k)
    ]
    grad = [grad_rollout(c.attentions, c.gradients, 0.0, prefix, pooling) for c in by_rank]
    chefer = [chefer_relevance(c.attentions, c.gradients, prefix, pooling) for c in by_rank]
    relevance = [c.relevance.flatten(1) for c in by_rank]
    scores = {}
    if top_k:  # the predicted class's maps
        first = {"rollout": rollout, "grad_rollout": grad[0], "chefer": chefer[0], "lrp": relevance[0]}
        grids = {name: values.view(len(images), *capture.grid) for name, values in first.items()}
        scores = map_scores(model, images, grids, tuple(model.config.patch_size), capture.targets)
    records = []
    for i in range(len(images)):
        attention = []
        for layer in layers:
            weights, scales = quantize_rows(capture.attentions[layer][i])
            attention.append({"heads": int(weights.shape[0]), "weights": _b64(weights), "scales": _b64(scales)})
        stats = attention_statistics([a[i : i + 1] for a in capture.attentions], prefix)
        records.append({
            "top": [{"index": int(c), "probability": round(float(p), 6)} for c, p in zip(top.indices[i], top.values[i])],
            "attention": attention,
            "explanations": {
                "rollout": _numbers(rollout[i]),
                "grad_rollout": [_numbers(maps[i]) for maps in grad],
                "chefer": [_numbers(maps[i]) for maps in chefer],
                "lrp": [_numbers(scaled_relevance(maps[i : i + 1])[0]) for maps in relevance],
            },
            "scores": {method: {test: round(float(area[i]), 4) for test, area in areas.items()}
                       for method, areas in scores.items()},
            "stats": _stats_json(stats),
        })
    return records, attention_statistics(capture.attentions, prefix)


def explorer_payload(
    model: VisionTransformer,
    images: torch.Tensor,
    *,
    info: DataInfo | None = None,
    names: Sequence[str] | None = None,
    labels: Sequence[int | None] | None = None,
    layers: Sequence[int] | None = None,
    top_k: int = TOP_K,
    batch_size: int = 8,
) -> dict[str, Any]:
    """What :func:`explorer_html` embeds, as a JSON-ready dict (see the module docstring)."""
    if images.dim() != 4 or len(images) == 0:
        raise ExplorerError(f"images must be a non-empty [B, C, H, W] batch, got shape {tuple(images.shape)}.")
    for what, given in (("names", names), ("labels", labels)):
        if given is not None and len(given) != len(images):
            raise ExplorerError(f"{what} has {len(given)} entries for {len(images)} images.")
    num_classes = model.config.num_classes  # 0: a headless model (DINOv2), explained by rollout and raw attention
    heads = model.heads_per_layer()
    kept = resolve_layers(layers, len(heads))
    top_k = min(top_k, num_classes)
    grid = model.patch_embed.grid_size(images.shape[2], images.shape[3])
    class_names = info.class_names if info is not None else tuple(f"class {c}" for c in range(num_classes))
    records: list[dict[str, Any]] = []
    stats: HeadStats | None = None
    for first in range(0, len(images), batch_size):
        batch = images[first : first + batch_size]
        batch_records, batch_stats = _batch_payload(model, batch, kept, top_k)
        records += batch_records
        stats = batch_stats if stats is None else stats.merge(batch_stats)
    assert stats is not None
    for index, record in enumerate(records):
        image = images[index]
        label = labels[index] if labels is not None else None
        record["name"] = names[index] if names is not None else f"image {index}"
        record["label"] = label
        record["png"] = _png_data_uri(display_image(image, info) if info is not None else _rescaled(image))
        for entry in record["top"]:
            entry["name"] = class_names[entry["index"]]
        record["labelName"] = class_names[label] if label is not None else None
    config = model.config
    # The per-head attention, then the maps (a model without a classifier has no class to explain).
    maps = [method for method in MAP_METHODS if num_classes or method not in CLASS_METHODS]
    return {
        "version": 1,
        "grid": list(grid),
        "tokens": grid[0] * grid[1] + model.num_prefix_tokens,
        "prefixTokens": model.num_prefix_tokens,
        "pooling": config.global_pool,
        "headless": num_classes == 0,
        "views": ["attention", *maps],
        "viewNames": {"attention": "attention", **{method: LABELS[method] for method in maps}},
        "depth": len(heads),
        "layers": kept,
        "heads": heads,
        # Pruning renumbers the kept heads 0..H_l-1; the original count is embed_dim / head_dim.
        "maxHeads": max(max(heads), config.embed_dim // config.resolved_head_dim()),
        "images": records,
        "stats": _stats_json(stats),
        "warnings": head_warnings(stats),
    }


def explorer_html(
    model: VisionTransformer,
    images: torch.Tensor,
    *,
    info: DataInfo | None = None,
    names: Sequence[str] | None = None,
    labels: Sequence[int | None] | None = None,
    layers: Sequence[int] | None = None,
    top_k: int = TOP_K,
    max_bytes: int = DEFAULT_MAX_BYTES,
    batch_size: int = 8,
    title: str = "vitkit attention explorer",
) -> ExplorerHTML:
    """The explorer page of ``images`` as one self-contained HTML string (a ``str``; notebooks
    display it through ``_repr_html_``, no IPython import needed).

    Args:
        model: a vitkit ``VisionTransformer`` in eval mode (pruned heads and layers welcome).
        images: ``[B, C, H, W]`` model inputs, normalised as for training.
        info: the model's preprocessing (``DataInfo.from_extra(extra)``): undoes the normalisation
            for display and names the classes; without it images are min-max rescaled and classes
            are called ``class <i>``.
        names: a title per image (default ``image <i>``).
        labels: the true class per image, or ``None`` where unknown.
        layers: blocks whose attention is embedded (default: all; negative counts from the end).
        top_k: classes per image offered in the explanations (at most the number of classes).
        max_bytes: refuse a page larger than this; checked from the configuration before
            anything is computed, and on the finished page.
        batch_size: images per forward pass.
        title: the page's title.

    Raises:
        ExplorerError: a layer out of range, or a page over ``max_bytes`` (the message says what to pass).
    """
    size = explorer_size(model, len(images), (images.shape[2], images.shape[3]), layers)
    size.check(max_bytes)
    payload = explorer_payload(
        model, images, info=info, names=names, labels=labels, layers=layers, top_k=top_k, batch_size=batch_size
    )
    data = json.dumps(payload, separators=(",", ":"), allow_nan=False).replace("<", "\\u003c")
    page = _page(title, data)
    size.check(max_bytes, actual=len(page.encode("utf-8")))
    return ExplorerHTML(page)
