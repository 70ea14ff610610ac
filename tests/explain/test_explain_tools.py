"""tools/attention_maps.py, tools/attention_report.py and tools/localization.py on tiny models."""

from __future__ import annotations

import csv
import importlib
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import timm
import torch
from PIL import Image
from tiny_models import save_tiny, tiny_shapes_model

import vitkit
from vitkit.cli.explain_io import load_explained_model
from vitkit.output_dirs import MARKER


def tool_main(name: str) -> Callable[[list[str]], int]:
    """The ``main(argv)`` of ``tools/<name>.py`` (``vitkit.cli.<name>``)."""
    return importlib.import_module(f"vitkit.cli.{name}").main


@pytest.fixture
def checkpoint(seed: int, tmp_path: Path) -> Path:
    return save_tiny(tiny_shapes_model(), tmp_path / "model.safetensors")


@pytest.fixture
def mixed_folder(tmp_path: Path) -> Path:
    """RGB png, RGBA png, grayscale jpg and a broken png."""
    folder = tmp_path / "images"
    folder.mkdir()
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 255, (40, 50, 3), dtype=np.uint8)).save(folder / "rgb.png")
    Image.fromarray(rng.integers(0, 255, (36, 36, 4), dtype=np.uint8), "RGBA").save(folder / "rgba.png")
    Image.fromarray(rng.integers(0, 255, (64, 48), dtype=np.uint8), "L").save(folder / "gray.jpg")
    (folder / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n this is not really a png")
    return folder


def test_attention_maps_on_mixed_folder_writes_figures_and_names_the_broken_file(
    checkpoint: Path, mixed_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "maps"
    code = tool_main("attention_maps")(["--checkpoint", str(checkpoint), str(mixed_folder), "--out", str(out)])
    assert code == 3
    written = sorted(p.name for p in out.glob("*.png"))
    assert written == ["gray.png", "rgb.png", "rgba.png"]
    # image + AttnLRP + Chefer + grad rollout + rollout in the first row, 3 heads in the second: 32 px shown 4x
    with Image.open(out / "rgb.png") as figure:
        assert figure.mode == "RGB" and figure.width == 5 * (128 + 6) + 6 and figure.height > 2 * 128
    err = capsys.readouterr().err
    assert "broken.png" in err and "1 file(s) could not be read" in err


def test_each_maps_title_gives_its_deletion_and_insertion_area_for_the_image(
    checkpoint: Path, mixed_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vitkit.cli import attention_maps
    from vitkit.cli.explain_io import load_explained_model
    from vitkit.explain import capture_attention, patch_maps
    from vitkit.explain.faithfulness import perturbation_curves

    drawn: list[list[str]] = []
    monkeypatch.setattr(attention_maps, "attention_figure",
                        lambda picture, panels, *rest: drawn.append([title for title, _ in panels]))
    image = str(mixed_folder / "rgb.png")
    run = ["--checkpoint", str(checkpoint), image, "--out", str(tmp_path / "maps")]
    assert attention_maps.main(run) == 0
    assert attention_maps.main([*run, "--score-steps", "4"]) == 0
    assert attention_maps.main([*run, "--no-scores"]) == 0
    scored, coarse, plain = drawn
    assert [title.split(":")[0].split(" (")[0] for title in scored] == ["AttnLRP", "Chefer et al.", "grad rollout",
                                                                        "attention rollout"]
    assert all("(del " not in title for title in plain) and scored != coarse
    # recomputed here: the image as the command prepares it, each map's curves over 16 steps
    model, extra = load_explained_model(checkpoint)
    from vitkit.cli.explain_io import ConversionNote, load_image_files
    from vitkit.data import DataInfo

    info = DataInfo.from_extra(extra)
    (loaded,), _ = load_image_files([Path(image)], info, ConversionNote(info))
    images = loaded.image[None]
    capture = capture_attention(model, images, with_gradients=True, with_relevance=True)
    for method, title in zip(("lrp", "chefer", "grad_rollout", "rollout"), scored):
        maps = patch_maps(capture, method).view(1, *capture.grid)
        areas = perturbation_curves(model, images, maps, (8, 8), capture.targets, steps=16).auc()
        assert title.endswith(f"(del {float(areas['deletion'][0]):.2f}, ins {float(areas['insertion'][0]):.2f})"), title


def test_attention_maps_computes_each_map_once_per_batch_for_drawing_and_scoring(
    checkpoint: Path, mixed_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vitkit.cli import attention_maps
    from vitkit.explain import maps

    calls: dict[str, int] = {}

    def counting(name: str) -> Callable[..., torch.Tensor]:
        original = getattr(maps, name)

        def counted(*args: object) -> torch.Tensor:
            calls[name] = calls.get(name, 0) + 1
            return original(*args)
        return counted

    for name in ("attention_rollout", "grad_rollout", "chefer_relevance"):
        monkeypatch.setattr(maps, name, counting(name))
    monkeypatch.setattr(attention_maps, "attention_figure", lambda *args: None)
    images = [str(mixed_folder / name) for name in ("rgb.png", "rgba.png")]  # one batch of two
    assert attention_maps.main(["--checkpoint", str(checkpoint), *images, "--out", str(tmp_path / "maps")]) == 0
    assert calls == {"attention_rollout": 1, "grad_rollout": 1, "chefer_relevance": 1}


def test_attention_maps_single_method_and_bad_target_or_layer(
    checkpoint: Path, mixed_folder: Path, tmp_path: Path
) -> None:
    main = tool_main("attention_maps")
    out = tmp_path / "maps"
    image = str(mixed_folder / "rgb.png")
    assert main(["--checkpoint", str(checkpoint), image, "--out", str(out), "--method", "rollout"]) == 0
    with Image.open(out / "rgb.png") as figure:
        assert figure.width == 2 * (128 + 6) + 6  # image and rollout only
    bf16 = ["--precision", "bf16", "--target", "5"]
    assert main(["--checkpoint", str(checkpoint), image, "--out", str(out), *bf16]) == 0
    assert main(["--checkpoint", str(checkpoint), image, "--out", str(out), "--target", "6"]) == 2
    assert main(["--checkpoint", str(checkpoint), image, "--out", str(out), "--layer", "2"]) == 2


def test_attention_maps_loads_timm_weights(seed: int, mixed_folder: Path, tmp_path: Path) -> None:
    weights = tmp_path / "timm.pth"
    model = vitkit.create_model("vit_tiny_patch16_224", depth=1, num_classes=4)
    torch.save(vitkit.to_timm_state_dict(model), weights)
    out = tmp_path / "maps"
    image = str(mixed_folder / "gray.jpg")
    argv = ["--model", "vit_tiny_patch16_224", "--timm-weights", str(weights), image, "--out", str(out)]
    assert tool_main("attention_maps")(argv) == 0
    assert (out / "gray.png").is_file()


def test_attention_maps_renders_timm_dinov2_with_registers_like_a_vitkit_model(
    seed: int, mixed_folder: Path, tmp_path: Path
) -> None:
    source = timm.create_model("vit_small_patch14_reg4_dinov2", pretrained=False, depth=2, img_size=28, num_classes=4)
    weights = tmp_path / "dinov2_reg4.pth"
    torch.save(source.state_dict(), weights)
    model, _ = load_explained_model(model_name="vit_small_patch14_reg4_dinov2", timm_weights=weights)
    assert (model.config.reg_tokens, model.num_prefix_tokens, model.config.no_embed_class) == (4, 5, True)
    image = str(mixed_folder / "gray.jpg")
    out = tmp_path / "maps"
    argv = ["--model", "vit_small_patch14_reg4_dinov2", "--timm-weights", str(weights), image, "--out", str(out)]
    assert tool_main("attention_maps")(argv) == 0
    vitkit_out = tmp_path / "vitkit_maps"
    checkpoint = save_tiny(tiny_shapes_model(), tmp_path / "model.safetensors")
    assert tool_main("attention_maps")(["--checkpoint", str(checkpoint), image, "--out", str(vitkit_out)]) == 0
    figures = [sorted(p.name for p in folder.iterdir() if p.name != MARKER) for folder in (out, vitkit_out)]
    assert figures == [["gray.png"], ["gray.png"]]


def collapse_heads(model: vitkit.VisionTransformer, layer: int, heads: tuple[int, int], sharpen: float) -> None:
    """Give two heads of ``layer`` the same, sharpened query and key projections."""
    attn = model.blocks[layer].attn
    d, inner = attn.head_dim, attn.num_heads * attn.head_dim
    source, copy = heads
    with torch.no_grad():
        for offset, scale in ((0, sharpen), (inner, 1.0)):  # q rows, then k rows
            rows = slice(offset + source * d, offset + (source + 1) * d)
            attn.qkv.weight[rows] *= scale
            attn.qkv.weight[offset + copy * d : offset + (copy + 1) * d] = attn.qkv.weight[rows]
            attn.qkv.bias[offset + copy * d : offset + (copy + 1) * d] = attn.qkv.bias[rows]


@pytest.mark.slow
def test_attention_report_writes_csv_and_heatmaps_and_warns_of_collapse(
    seed: int, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    model = tiny_shapes_model()
    collapse_heads(model, layer=1, heads=(0, 2), sharpen=30.0)
    checkpoint = save_tiny(model, tmp_path / "model.safetensors")
    out = tmp_path / "report"
    code = tool_main("attention_report")(["--checkpoint", str(checkpoint), "--out", str(out), "--num-images", "8"])
    assert code == 0
    with open(out / "head_stats.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 2 * 3
    assert set(rows[0]) >= {"layer", "head", "entropy", "diagonal", "cls_share", "max_similarity"}
    assert {p.name for p in out.glob("*.png")} == {"entropy.png", "diagonal.png", "cls_share.png", "similarity.png"}
    printed = capsys.readouterr().out
    assert "warning: layer 1, heads [0, 2]: these heads attend alike" in printed
    assert (out / "warnings.txt").read_text().count("attend alike") == 1
    assert printed.index("information, not warnings") < printed.index("warning: layer 1")


@pytest.mark.slow
def test_attention_report_without_warnings_writes_no_warnings_file_and_says_so_last(
    seed: int, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    checkpoint = save_tiny(tiny_shapes_model(), tmp_path / "model.safetensors")
    out = tmp_path / "report"
    thresholds = ["--uniform-entropy", "1.01", "--self-attention", "1.01", "--cls-sink", "1.01", "--collapse-similarity", "1.01"]
    assert tool_main("attention_report")(["--checkpoint", str(checkpoint), "--out", str(out), "--num-images", "4",
                                          *thresholds]) == 0
    printed = capsys.readouterr().out.strip().splitlines()
    assert not (out / "warnings.txt").exists() and printed[-1].startswith("no warnings")


@pytest.mark.slow
def test_localization_tool_prints_trained_and_random_rows(checkpoint: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "loc"
    assert tool_main("localization")([str(checkpoint), "--num-images", "8", "--out", str(out)]) == 0
    table = (out / "localization.md").read_text()
    printed = capsys.readouterr().out
    assert tool_main("localization")([str(checkpoint), "trainer.max_epochs=1"]) == 2  # overrides need --recipe
    assert capsys.readouterr().err.startswith("error: recipe overrides (trainer.max_epochs=1) need --recipe")
    assert table in printed and "explaining the label class, pointing tolerance 2 px" in printed
    for row in ("| trained | rollout |", "| trained | grad_rollout |", "| trained | chefer |",
                "| random weights | rollout |"):
        assert row in table
    with open(out / "localization.csv") as handle:
        assert len(list(csv.DictReader(handle))) == 6


def test_attention_maps_tool_works_on_a_model_whose_last_block_lost_every_head(
    mixed_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    model = tiny_shapes_model()
    model.blocks[-1].attn.prune_heads(list(range(model.blocks[-1].attn.num_heads)))
    checkpoint = save_tiny(model, tmp_path / "pruned.safetensors")
    out = tmp_path / "maps"
    image = str(mixed_folder / "rgb.png")
    assert tool_main("attention_maps")(["--checkpoint", str(checkpoint), image, "--out", str(out)]) == 0
    with Image.open(out / "rgb.png") as figure:  # one row: image, rollout, grad rollout, Chefer, AttnLRP; no heads
        assert figure.width == 5 * (128 + 6) + 6 and figure.height < 3 * 128  # a head row would add 150 px
    assert "note: every head of layer 1 was pruned: the figures have no per-head grid" in capsys.readouterr().out
    assert json.loads((out / ".vitkit").read_text())["state"] == "complete"  # unlocked, finished
    assert tool_main("attention_maps")(["--checkpoint", str(checkpoint), image, "--out", str(out), "--layer", "0",
                                        "--method", "heads"]) == 0
