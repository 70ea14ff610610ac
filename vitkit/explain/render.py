"""Figures for attention maps (composed with PIL), head diagnostics and faithfulness curves
(matplotlib, Agg, no pyplot state).

Overlays are blended in numpy and pasted as tiles: building one matplotlib axes per tile cost
about 1 s per image, more than the model itself.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence

import numpy as np
import torch
from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from PIL import Image, ImageDraw, ImageFont
from PIL.PngImagePlugin import PngInfo

from .faithfulness import PERCENT
from .faithfulness_report import FaithfulnessReport

DPI = 100
HEAD_COLUMNS = 6
MIN_TILE_PX = 128  # small images (32x32 CIFAR, shapes) are enlarged by an integer factor
GAP, LABEL_PX, LINE_PX, TITLE_LINE_PX, FONT_PX = 6, 16, 16, 18, 12
COLOR_BAR_PX, COLOR_BAR_MAX_WIDTH = 10, 256
CMAP = "jet"
#: What the colours of every overlay mean (drawn under the colour bar).
SCALE_NOTE = "colour: attention from 0 to each map's own maximum"


def overlay(image: np.ndarray, heat: torch.Tensor, alpha: float = 0.5, cmap: str = CMAP) -> np.ndarray:
    """Blend an ``[H, W]`` map (scaled to its own maximum) over an ``[H, W, 3]`` float image in
    ``[0, 1]``; returns ``[H, W, 3]`` float in ``[0, 1]``."""
    values = heat.detach().float().cpu().numpy()  # numpy from here: tiny torch ops pay thread overhead
    values = values / max(float(values.max()), np.finfo(np.float32).tiny)
    colored = colormaps[cmap](values)[..., :3]
    return (1 - alpha) * image + alpha * colored


#: A map whose minimum is at least this share of its maximum is near-uniform: scaled to its own
#: maximum it would look solidly hot, so its label says how flat it is.
FLAT_RATIO = 0.9


def flat_note(heat: torch.Tensor) -> str:
    """`` (flat: min 0.97 of max)`` for a near-uniform ``[H, W]`` map (:data:`FLAT_RATIO`), else ``''``."""
    values = heat.detach().float()
    top = float(values.max())
    ratio = float(values.min()) / top if top > 0 else 1.0
    return f" (flat: min {ratio:.2f} of max)" if ratio >= FLAT_RATIO else ""


def _save(figure: Figure, path: str | os.PathLike) -> None:
    FigureCanvasAgg(figure)
    figure.savefig(path, format="png", dpi=DPI)


def _to_pil(picture: np.ndarray) -> Image.Image:
    return Image.fromarray((np.clip(picture, 0.0, 1.0) * 255).astype(np.uint8))


def attention_figure(
    image: np.ndarray,
    panels: Sequence[tuple[str, torch.Tensor]],
    head_maps: torch.Tensor | None,
    layer: int,
    num_layers: int,
    title: str,
    path: str | os.PathLike,
) -> None:
    """Write one PNG: the title, the image, one overlay per ``(label, [H, W] map)`` panel, a grid
    of per-head overlays of block ``layer`` (``[heads, H, W]``, under a line saying that layers
    and heads count from 0), and a colour bar. The title and every label are also stored as the
    PNG's ``Title`` and ``Description`` text.

    The tiles are composed with PIL rather than as matplotlib axes, which is ~20x faster; images
    smaller than ``MIN_TILE_PX`` are enlarged (nearest neighbour) by an integer factor.

    Args:
        image: ``[H, W, 3]`` float RGB in ``[0, 1]`` (what the model saw, denormalised).
        panels: e.g. ``[("rollout", map), ("grad rollout: cat", map)]``.
        head_maps: ``[heads, H, W]`` or ``None`` to leave the grid out.
        layer: 0-based index of the block shown in the head grid.
        num_layers: blocks of the model (named in the grid's caption).
        title: the figure's title (e.g. the predicted class, its probability, the true class).
        path: output ``.png``.
    """
    tiles = [("image", image)] + [(label + flat_note(heat), overlay(image, heat)) for label, heat in panels]
    heads = 0 if head_maps is None else head_maps.shape[0]
    head_tiles = [(f"head {h}{flat_note(head_maps[h])}", overlay(image, head_maps[h])) for h in range(heads)]
    cols = max(len(tiles), min(heads, HEAD_COLUMNS))
    zoom = max(1, math.ceil(MIN_TILE_PX / min(image.shape[:2])))
    tile_size = (image.shape[1] * zoom, image.shape[0] * zoom)
    canvas_width = cols * (tile_size[0] + GAP) + GAP
    font, title_font = ImageFont.load_default(size=FONT_PX), ImageFont.load_default(size=FONT_PX + 2)
    head_note = (
        f"attention of each head in layer {layer} (counted from 0: layers 0-{num_layers - 1}, heads 0-{heads - 1})"
    )
    title_lines = _wrap(title, title_font, canvas_width - 2 * GAP)
    note_lines = _wrap(head_note, font, canvas_width - 2 * GAP) if heads else []
    scale_lines = _wrap(SCALE_NOTE, font, canvas_width - 2 * GAP)
    rows = [tiles] + [head_tiles[i : i + cols] for i in range(0, heads, cols)]
    # each label wrapped to its tile's width; a row is as tall as its longest label
    wrapped = [[_wrap(label, font, tile_size[0]) for label, _ in row] for row in rows]
    label_px = [LABEL_PX + LINE_PX * (max(len(lines) for lines in row) - 1) for row in wrapped]
    height = (
        GAP
        + TITLE_LINE_PX * len(title_lines)
        + sum(px + tile_size[1] + GAP for px in label_px)
        + LINE_PX * len(note_lines)
        + COLOR_BAR_PX
        + LINE_PX * (1 + len(scale_lines))
        + GAP
    )
    canvas = Image.new("RGB", (canvas_width, height), "white")
    draw = ImageDraw.Draw(canvas)
    y = _draw_lines(draw, title_lines, title_font, GAP, TITLE_LINE_PX)
    for index, row in enumerate(rows):
        if index == 1:
            y = _draw_lines(draw, note_lines, font, y, LINE_PX)
        for col, ((_, picture), lines) in enumerate(zip(row, wrapped[index])):
            x = GAP + col * (tile_size[0] + GAP)
            for number, line in enumerate(lines):
                draw.text((x, y + 1 + LINE_PX * number), line, fill="black", font=font)
            canvas.paste(_to_pil(picture).resize(tile_size, Image.NEAREST), (x, y + label_px[index]))
        y += label_px[index] + tile_size[1] + GAP
    _draw_color_bar(canvas, draw, font, y, min(canvas_width - 2 * GAP, COLOR_BAR_MAX_WIDTH))
    _draw_lines(draw, scale_lines, font, y + COLOR_BAR_PX + LINE_PX, LINE_PX)
    texts = PngInfo()
    texts.add_text("Title", title)
    labels = [label for row in rows for label, _ in row]
    texts.add_text("Description", "\n".join([" | ".join(labels), *([head_note] if heads else []), SCALE_NOTE]))
    canvas.save(path, format="PNG", compress_level=3, pnginfo=texts)  # level 3: ~2x faster than 6, ~10% larger


def _wrap(text: str, font: ImageFont.FreeTypeFont, width: int) -> list[str]:
    """``text`` broken at spaces into lines of at most ``width`` pixels (a longer word stays whole)."""
    lines: list[str] = []
    for word in text.split(" "):
        if lines and font.getlength(f"{lines[-1]} {word}") <= width:
            lines[-1] += f" {word}"
        else:
            lines.append(word)
    return lines


def _draw_lines(
    draw: ImageDraw.ImageDraw, lines: Sequence[str], font: ImageFont.FreeTypeFont, y: int, step: int
) -> int:
    """Draw ``lines`` from ``y`` down, ``step`` pixels apart; returns the ``y`` below them."""
    for line in lines:
        draw.text((GAP, y), line, fill="black", font=font)
        y += step
    return y


def _draw_color_bar(
    canvas: Image.Image, draw: ImageDraw.ImageDraw, font: ImageFont.FreeTypeFont, y: int, width: int
) -> None:
    """The overlays' colour map from 0 (left) to the maximum (right), ``width`` pixels wide at ``y``."""
    colors = colormaps[CMAP](np.linspace(0.0, 1.0, width))[:, :3]
    canvas.paste(_to_pil(np.broadcast_to(colors, (COLOR_BAR_PX, width, 3))), (GAP, y))
    draw.text((GAP, y + COLOR_BAR_PX + 1), "0", fill="black", font=font)
    draw.text((GAP + width, y + COLOR_BAR_PX + 1), "max", fill="black", font=font, anchor="ra")


def head_grid_figure(
    values: torch.Tensor, title: str, path: str | os.PathLike, vmin: float = 0.0, vmax: float = 1.0
) -> None:
    """Heat map of a ``[layers, heads]`` metric (NaN cells blank), each cell annotated."""
    layers, heads = values.shape
    figure = Figure(figsize=(1.2 + 0.55 * heads, 0.9 + 0.4 * layers))
    axis = figure.add_subplot()
    image = axis.imshow(values.numpy(), cmap="viridis", vmin=vmin, vmax=vmax, aspect="auto")
    for layer in range(layers):
        for head in range(heads):
            value = values[layer, head].item()
            if not math.isnan(value):
                color = "black" if value > vmin + 0.6 * (vmax - vmin) else "white"
                axis.text(head, layer, f"{value:.2f}", ha="center", va="center", fontsize=7, color=color)
    axis.set_xticks(range(heads))
    axis.set_yticks(range(layers))
    axis.set_xlabel("head")
    axis.set_ylabel("layer")
    axis.set_title(title, fontsize=10)
    figure.colorbar(image, ax=axis, fraction=0.05)
    figure.tight_layout()
    _save(figure, path)


#: How the faithfulness figure names each test (and which way is better).
TEST_TITLES = {
    "deletion": "deletion: most relevant patches removed (lower area is better)",
    "insertion": "insertion: most relevant patches revealed (higher is better)",
    "positive": "positive perturbation: accuracy, most relevant removed (lower)",
    "negative": "negative perturbation: accuracy, least relevant removed (higher)",
}


def faithfulness_figure(report: FaithfulnessReport, path: str | os.PathLike, title: str) -> None:
    """Four panels, one per test: each method's mean curve against the share of patches perturbed,
    its area in the legend; written as PNG to ``path``."""
    figure = Figure(figsize=(12, 8.5))
    fractions = report.fractions.numpy()
    methods = [result.name for result in report.results if result.name != "random"]
    palette, dashes = colormaps["tab10"], ("-", ":", "-.")  # more than ten methods: the colours again, dotted
    styles = {name: {"color": palette(index % palette.N), "linestyle": dashes[index // palette.N % len(dashes)]}
              for index, name in enumerate(methods)}
    styles["random"] = {"color": "0.5", "linestyle": "--"}
    for index, (test, label) in enumerate(TEST_TITLES.items()):
        axes = figure.add_subplot(2, 2, index + 1)
        scale = 100 if test in PERCENT else 1
        for result in report.results:
            style = styles[result.name]
            area = result.mean(test)
            axes.plot(fractions, result.curves[test].numpy() * scale, label=f"{result.name} ({area:.3g})", **style)
        axes.set_title(label, fontsize=10)
        axes.set_xlabel("share of patches perturbed")
        axes.set_ylabel("accuracy (%)" if scale == 100 else "probability of the explained class")
        axes.set_xlim(0, 1)
        axes.grid(alpha=0.3)
        axes.legend(fontsize=8, title="method (area)", title_fontsize=8)
    figure.suptitle(title)
    figure.tight_layout()
    _save(figure, path)
