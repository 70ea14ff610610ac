"""``--merge-tokens R`` on the commands: each runs the model with token merging (ToMe), the maps
stay on the full patch grid, the ONNX export matches torch at 1e-4, and a bad R is refused."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from tiny_models import save_tiny, tiny_shapes_model

import vitkit


@pytest.fixture
def model_file(tmp_path: Path) -> Path:
    torch.manual_seed(0)
    return save_tiny(tiny_shapes_model(), tmp_path / "m.safetensors")  # 16 patches and a class token


@pytest.fixture
def image_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "images"
    folder.mkdir()
    for index in range(2):
        pixels = np.random.default_rng(index).integers(0, 255, (32, 32, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(folder / f"{index}.png")
    return folder


def test_evaluate_records_the_merging_and_changes_the_loss(model_file: Path, tmp_path: Path, load_tool) -> None:
    evaluate = load_tool("evaluate").main
    assert evaluate([str(model_file), "--out", str(tmp_path / "plain")]) == 0
    assert evaluate([str(model_file), "--merge-tokens", "4", "--out", str(tmp_path / "merged")]) == 0
    plain, merged = (json.loads((tmp_path / name / "eval.json").read_text()) for name in ("plain", "merged"))
    assert plain["merge_tokens"] == 0 and merged["merge_tokens"] == 4
    assert merged["loss"] != plain["loss"] and merged["num_images"] == plain["num_images"]


def test_maps_of_a_merged_model_are_drawn_on_the_full_grid(model_file: Path, image_folder: Path, tmp_path: Path,
                                                           load_tool) -> None:
    maps = load_tool("attention_maps").main
    for name, extra in (("plain", []), ("merged", ["--merge-tokens", "3:decreasing"])):
        argv = [str(model_file), str(image_folder), "--method", "rollout", "--no-scores", "--out", str(tmp_path / name)]
        assert maps(argv + extra) == 0
    plain, merged = (sorted((tmp_path / name).rglob("*.png")) for name in ("plain", "merged"))
    assert [p.name for p in plain] == [p.name for p in merged] and plain
    for a, b in zip(plain, merged):
        assert Image.open(a).size == Image.open(b).size


def test_predict_explore_and_faithfulness_run_merged(model_file: Path, image_folder: Path, tmp_path: Path,
                                                      load_tool, capsys) -> None:
    assert load_tool("predict").main([str(model_file), str(image_folder), "--merge-tokens", "2,2"]) == 0
    assert "0.png" in capsys.readouterr().out
    out = tmp_path / "explorer.html"
    assert load_tool("explore").main([str(model_file), str(image_folder), "--merge-tokens", "4", "--out", str(out)]) == 0
    assert out.is_file()
    argv = [str(model_file), "--merge-tokens", "4", "--images", "4", "--methods", "rollout", "random", "--steps", "4",
            "--no-sanity", "--out", str(tmp_path / "faith")]
    assert load_tool("faithfulness").main(argv) == 0
    assert (tmp_path / "faith" / "faithfulness.csv").is_file()


def test_the_onnx_export_of_a_merged_model_matches_torch(model_file: Path, tmp_path: Path, load_tool) -> None:
    ort = pytest.importorskip("onnxruntime")
    out = tmp_path / "m.onnx"
    assert load_tool("export").main([str(model_file), "--merge-tokens", "4", "--out", str(out)]) == 0
    model = vitkit.merge_tokens(vitkit.load_model(model_file).eval(), 4)
    images = torch.randn(3, 3, 32, 32)
    session = ort.InferenceSession(str(out))
    onnx_logits = session.run(None, {session.get_inputs()[0].name: images.numpy()})[0]
    with torch.no_grad():
        expected = model(images).numpy()
    assert np.abs(onnx_logits - expected).max() < 1e-4


@pytest.mark.parametrize(
    ("value", "words"),
    [("9", "asks the first block to merge 9 tokens, but at most 8"), ("1,2,3", "lists 3 blocks, but the model has 2")],
)
def test_an_r_the_model_cannot_take_is_one_error_line(model_file: Path, tmp_path: Path, load_tool, capsys,
                                                      value: str, words: str) -> None:
    code = load_tool("evaluate").main([str(model_file), "--merge-tokens", value, "--out", str(tmp_path / "e")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("error: ") and words in err[0]
    assert not (tmp_path / "e").exists()


@pytest.mark.parametrize("value", ["x", "-1", "2:increasing", "1,2:decreasing", ""])
def test_an_r_that_is_no_count_is_a_usage_error(model_file: Path, load_tool, capsys, value: str) -> None:
    with pytest.raises(SystemExit) as stopped:
        load_tool("predict").main([str(model_file), "x.png", "--merge-tokens", value])
    assert stopped.value.code == 2
    assert "--merge-tokens: expected R (tokens merged per block" in capsys.readouterr().err.splitlines()[-1]
