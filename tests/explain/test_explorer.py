"""The attention explorer: its HTML payload (decoded in Python), tools/explore.py, and the page in
headless Chromium (skipped where Debian's chromium / chromium-driver or selenium are missing)."""

from __future__ import annotations

import base64
import dataclasses
import html
import json
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import torch
from matplotlib import colormaps
from PIL import Image

import vitkit
from vitkit.data import shapes_info
from vitkit.explain import ExplorerError, ExplorerHTML, capture_attention, explorer_html, explorer_size
from vitkit.explain import explorer as explorer_module
from vitkit.explain.faithfulness import perturbation_curves
from vitkit.explain.lrp import lrp_relevance
from vitkit.explain.rollout import attention_rollout, chefer_relevance, grad_rollout
from vitkit.prune import prune_heads

TINY_SHAPES = {"name": "shapes", "img_size": 32, "num_workers": 0, "shapes_num_samples": 60, "test_fraction": 0.2}
CHROMIUM = shutil.which("chromium")
CHROMEDRIVER = shutil.which("chromedriver")
#: The flags the explorer is tested under: headless, and nothing Chromium itself would fetch.
CHROMIUM_FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync", "--window-size=1400,1100",
)


def sharpen(model: vitkit.VisionTransformer) -> vitkit.VisionTransformer:
    """Scale the query/key weights up so random-init attention is peaked, not near uniform (a map
    of the wrong token or head then differs clearly from the right one)."""
    with torch.no_grad():
        for block in model.blocks:
            if block.attn.num_heads:
                block.attn.qkv.weight.mul_(4.0)
    return model.eval()


def token_model() -> vitkit.VisionTransformer:
    """Class token + token pooling, a 4 x 6 patch grid (rows and columns differ)."""
    return sharpen(vitkit.create_model(
        "vit_cifar_tiny", img_size=(32, 48), patch_size=8, embed_dim=24, depth=3, num_heads=3, num_classes=6
    ))


def avg_model() -> vitkit.VisionTransformer:
    """No class token, average pooling."""
    return sharpen(vitkit.create_model(
        "vit_cifar_tiny", img_size=32, patch_size=8, embed_dim=24, depth=2, num_heads=2, num_classes=4,
        class_token=False, global_pool="avg",
    ))


def pruned_model() -> vitkit.VisionTransformer:
    """Heads per layer [2, 0, 3]: head 1 of layer 0 and every head of layer 1 pruned."""
    return prune_heads(token_model(), {0: [1], 1: [0, 1, 2]})


def payload_of(page: str) -> dict:
    found = re.search(r'<script type="application/json" id="vitkit-data">(.*?)</script>', page, re.S)
    assert found is not None
    return json.loads(found.group(1))


def decode(entry: dict, tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """One embedded layer as ``(dequantised [H, N, N], scales [H, N])``."""
    heads = entry["heads"]
    weights = np.frombuffer(base64.b64decode(entry["weights"]), dtype=np.uint8).reshape(heads, tokens, tokens)
    scales = np.frombuffer(base64.b64decode(entry["scales"]), dtype="<f4").reshape(heads, tokens)
    return weights * scales[..., None].astype(np.float64), scales.astype(np.float64)


# ---- the payload, without a browser ----


def test_payload_decodes_to_the_captured_attention_within_half_a_quantisation_step() -> None:
    model, images = token_model(), torch.randn(2, 3, 32, 48)
    payload = payload_of(explorer_html(model, images))
    attentions = capture_attention(model, images).attentions
    assert payload["tokens"] == 25 and payload["grid"] == [4, 6] and payload["prefixTokens"] == 1
    for i in range(2):
        for layer, entry in zip(payload["layers"], payload["images"][i]["attention"]):
            expected = attentions[layer][i].double().numpy()
            values, scales = decode(entry, 25)
            np.testing.assert_allclose(scales, expected.max(-1) / 255, rtol=1e-6)  # the step is row max / 255
            assert np.all(np.abs(values - expected) <= scales[..., None] / 2 + 1e-7)
            assert np.abs(values - expected).max() > 0  # quantised, not stored as floats


def test_layers_keeps_only_the_named_blocks() -> None:
    model, images = token_model(), torch.randn(1, 3, 32, 48)
    payload = payload_of(explorer_html(model, images, layers=[-1, 0]))
    assert payload["layers"] == [0, 2] and payload["depth"] == 3
    last = capture_attention(model, images).attentions[2][0].double().numpy()
    values, scales = decode(payload["images"][0]["attention"][1], 25)
    assert np.all(np.abs(values - last) <= scales[..., None] / 2 + 1e-7)
    with pytest.raises(ExplorerError, match=r"layers \[3\] are out of range for 3 blocks"):
        explorer_html(model, images, layers=[3])


def test_explanations_are_vitkits_maps_for_each_top_class_and_the_top_classes_are_the_models() -> None:
    model, images = token_model(), torch.randn(2, 3, 32, 48)
    payload = payload_of(explorer_html(model, images, top_k=3))
    with torch.no_grad():
        probabilities = model(images).softmax(-1)
    for i, record in enumerate(payload["images"]):
        order = probabilities[i].argsort(descending=True)[:3].tolist()
        assert [entry["index"] for entry in record["top"]] == order
        assert [entry["name"] for entry in record["top"]] == [f"class {c}" for c in order]
        capture = capture_attention(model, images[i : i + 1])
        rollout = attention_rollout(capture.attentions, num_prefix_tokens=1, pooling="token")[0]
        np.testing.assert_allclose(record["explanations"]["rollout"], rollout, atol=6e-5)
        predicted_maps = {"rollout": rollout}
        for rank, target in enumerate(order):
            with_grads = capture_attention(model, images[i : i + 1], target, with_gradients=True)
            chefer = chefer_relevance(with_grads.attentions, with_grads.gradients, 1, "token")[0]
            predicted_maps.setdefault("chefer", chefer)
            grad = grad_rollout(with_grads.attentions, with_grads.gradients, 0.0, 1, "token")[0]
            np.testing.assert_allclose(record["explanations"]["chefer"][rank], chefer, atol=6e-5)
            np.testing.assert_allclose(record["explanations"]["grad_rollout"][rank], grad, atol=6e-5)
        assert record["explanations"]["chefer"][0] != record["explanations"]["chefer"][1]  # per class
        for rank, target in enumerate(order):  # AttnLRP per patch, scaled from its minimum (0) to its maximum (1)
            relevance = lrp_relevance(model, images[i : i + 1], target).per_patch((8, 8)).flatten()
            predicted_maps.setdefault("lrp", relevance)
            expected = (relevance - relevance.min()) / (relevance.max() - relevance.min())
            np.testing.assert_allclose(record["explanations"]["lrp"][rank], expected, atol=6e-5)
        # the scores: deletion and insertion areas of each map for the predicted class, 16 steps over 24 patches
        for method, values in predicted_maps.items():
            areas = perturbation_curves(model, images[i : i + 1], values.view(1, 4, 6), (8, 8), torch.tensor([order[0]]),
                                        steps=16).auc()
            for test in ("deletion", "insertion"):
                assert record["scores"][method][test] == pytest.approx(float(areas[test][0]), abs=2e-4), (method, test)


def test_head_diagnostics_match_a_hand_computation_per_image() -> None:
    model, images = token_model(), torch.randn(2, 3, 32, 48)
    payload = payload_of(explorer_html(model, images))
    attentions = capture_attention(model, images).attentions
    for i, record in enumerate(payload["images"]):
        for layer, attention in enumerate(attentions):
            a = attention[i].double()  # [H, N, N]
            entropy = (-(a * a.clamp_min(1e-12).log()).sum(-1) / np.log(25)).mean(-1)
            np.testing.assert_allclose(record["stats"]["entropy"][layer], entropy, atol=6e-5)
            np.testing.assert_allclose(record["stats"]["diagonal"][layer], a.diagonal(dim1=-2, dim2=-1).mean(-1), atol=6e-5)
            np.testing.assert_allclose(record["stats"]["cls_share"][layer], a[:, :, 0].mean(-1), atol=6e-5)
    everything = attentions[0].double().diagonal(dim1=-2, dim2=-1).mean(dim=(0, 2))
    np.testing.assert_allclose(payload["stats"]["diagonal"][0], everything, atol=6e-5)


def test_the_views_and_their_names_come_from_the_method_registry() -> None:
    from vitkit.method_names import LABELS

    page = explorer_html(token_model(), torch.randn(1, 3, 32, 48))
    payload = payload_of(page)
    assert payload["views"] == ["attention", "rollout", "grad_rollout", "chefer", "lrp"]
    assert payload["viewNames"] == {"attention": "attention", **{view: LABELS[view] for view in payload["views"][1:]}}
    assert 'value="grad_rollout"' not in page  # the radio buttons are drawn from the payload's views


def test_pruned_heads_and_a_fully_pruned_layer_are_embedded_and_marked() -> None:
    model = pruned_model()
    payload = payload_of(explorer_html(model, torch.randn(1, 3, 32, 48)))
    assert payload["heads"] == [2, 0, 3] and payload["maxHeads"] == 3
    assert [entry["heads"] for entry in payload["images"][0]["attention"]] == [2, 0, 3]
    assert payload["images"][0]["stats"]["entropy"][1] == [None, None, None]
    assert payload["images"][0]["stats"]["entropy"][0][2] is None and payload["images"][0]["stats"]["entropy"][0][1] is not None


def test_the_size_is_refused_before_anything_is_computed(monkeypatch: pytest.MonkeyPatch) -> None:
    model, images = token_model(), torch.randn(4, 3, 32, 48)
    estimate = explorer_size(model, 4, (32, 48))
    assert estimate.attention_per_layer == {layer: 4 * -(-3 * 625 // 3) + 4 * -(-4 * 3 * 25 // 3) for layer in range(3)}

    def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError("attention was computed for a file that is refused")

    monkeypatch.setattr(explorer_module, "capture_attention", forbidden)
    limit = estimate.fixed + 2 * estimate.per_image + 10
    with pytest.raises(ExplorerError, match=r"at most 2 image\(s\) fit.*--max-images.*--layers.*--max-bytes") as error:
        explorer_html(model, images, max_bytes=limit)
    assert "\n" not in str(error.value)
    shown = f"{limit / 1e3:.1f} KB limit" if limit >= 1000 else f"{limit:,} bytes limit"  # never "0.0 MB"
    assert shown in str(error.value) and "0.0 MB" not in str(error.value)


def test_the_finished_page_is_checked_too_and_the_estimate_counts_its_bulk() -> None:
    model, images = token_model(), torch.randn(2, 3, 32, 48)
    estimate = explorer_size(model, 2, (32, 48))
    page = explorer_html(model, images)
    payload = payload_of(page)
    attention = sum(len(e["weights"]) + len(e["scales"]) for r in payload["images"] for e in r["attention"])
    assert attention == 2 * sum(estimate.attention_per_layer.values())
    assert all(len(r["png"]) <= estimate.image for r in payload["images"])
    actual = len(page.encode("utf-8"))
    assert estimate.total < actual < 1.5 * estimate.total  # the JSON around the bulk is not in the estimate
    with pytest.raises(ExplorerError, match=r"would take [0-9.]+ KB, over the [0-9.]+ KB limit"):
        explorer_html(model, images, max_bytes=actual - 1)
    assert len(explorer_html(model, images, max_bytes=actual)) == len(page)


def test_the_page_is_self_contained_and_shows_in_a_notebook_iframe() -> None:
    page = explorer_html(avg_model(), torch.randn(1, 3, 32, 32))
    assert isinstance(page, ExplorerHTML) and isinstance(page, str)
    assert "default-src 'none'" in page  # Content-Security-Policy: no request of any kind
    assert not re.search(r"(src|href)=\"(?!data:)", page)  # no external script, style or image
    assert "/*VITKIT_JS*/" not in page and "__VITKIT_DATA__" not in page
    frame = page._repr_html_()
    srcdoc = re.fullmatch(r'<iframe srcdoc="(.*)" style="[^"]*"></iframe>', frame, re.S)
    assert srcdoc is not None and html.unescape(srcdoc.group(1)) == page


def test_a_title_holding_a_placeholder_stays_the_title() -> None:
    title = "run __VITKIT_DATA__ /*VITKIT_JS*/"
    page = explorer_html(avg_model(), torch.randn(1, 3, 32, 32), title=title)
    assert re.search(r"<title>(.*?)</title>", page).group(1) == title
    assert re.search(r"<h1>(.*?)</h1>", page).group(1) == title
    assert page.count('"images":') == 1 and page.count("<script>") == 1  # one payload, one copy of the code


def test_a_script_end_tag_in_a_class_name_cannot_close_the_payload() -> None:
    model = avg_model()
    info = shapes_info(32)
    names = ("</script><script>alert(1)</script>", *info.class_names[1:4])
    info = dataclasses.replace(info, num_classes=4, class_names=names)
    page = explorer_html(model, torch.randn(1, 3, 32, 32), info=info)
    assert page.count("</script>") == 2  # the payload's and the code's
    assert names[0] in {entry["name"] for entry in payload_of(page)["images"][0]["top"]}


# ---- tools/explore.py ----


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    model = sharpen(vitkit.create_model("vit_cifar_tiny", patch_size=8, embed_dim=24, depth=2, num_heads=3, num_classes=6))
    return vitkit.save_model(model, tmp_path / "model.safetensors", extra={**shapes_info(32).to_extra(), "data_config": TINY_SHAPES})


def test_explore_writes_one_file_of_test_images(
    load_tool: Callable[[str], ModuleType], checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "page" / "explorer.html"
    assert load_tool("explore").main(["--checkpoint", str(checkpoint), "--test-images", "2", "--out", str(out)]) == 0
    assert sorted(p.name for p in out.parent.iterdir()) == ["explorer.html"]
    payload = payload_of(out.read_text())
    assert [r["name"].split(" ")[:2] for r in payload["images"]] == [["test", "image"]] * 2
    assert all(r["label"] is not None and r["labelName"] for r in payload["images"])
    assert payload["images"][0]["label"] != payload["images"][1]["label"]  # drawn across the classes
    assert "wrote" in capsys.readouterr().out


def test_explore_options_layers_and_max_images(
    load_tool: Callable[[str], ModuleType], checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "explorer.html"
    argv = ["--checkpoint", str(checkpoint), "--test-images", "5", "--max-images", "3", "--layers", "1", "--out", str(out)]
    assert load_tool("explore").main(argv) == 0
    payload = payload_of(out.read_text())
    assert len(payload["images"]) == 3 and payload["layers"] == [1]
    assert "kept the first 3 of 5 images" in capsys.readouterr().out


def test_explore_refuses_a_file_over_max_bytes_with_one_error_line(
    load_tool: Callable[[str], ModuleType], checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "explorer.html"
    code = load_tool("explore").main(["--checkpoint", str(checkpoint), "--test-images", "2", "--max-bytes", "1000", "--out", str(out)])
    assert code == 2 and not out.exists()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "--max-bytes" in err[0] and "--layers" in err[0]


def test_explore_reads_image_files_and_names_unreadable_ones(
    load_tool: Callable[[str], ModuleType], checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    folder = tmp_path / "images"
    folder.mkdir()
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (40, 50, 3), dtype=np.uint8)).save(folder / "a.png")
    (folder / "broken.png").write_bytes(b"not a png")
    out = tmp_path / "explorer.html"
    assert load_tool("explore").main(["--checkpoint", str(checkpoint), str(folder), "--out", str(out)]) == 3
    assert [r["name"] for r in payload_of(out.read_text())["images"]] == [str(folder / "a.png")]
    captured = capsys.readouterr()
    assert "broken.png" in captured.err and "resized" in captured.out
    code = load_tool("explore").main(["--checkpoint", str(checkpoint), str(folder), "--out", str(folder / "a.png")])
    assert code == 2 and "is one of this command's inputs" in capsys.readouterr().err


def test_explore_never_replaces_another_file_a_symlinks_target_or_its_input(
    load_tool: Callable[[str], ModuleType], checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    explore = load_tool("explore").main
    argv = ["--checkpoint", str(checkpoint), "--test-images", "1", "--out"]
    other = tmp_path / "other.safetensors"
    other.write_bytes(b"another run's model")
    link = tmp_path / "page.html"
    link.symlink_to(other)
    checkpoint_bytes = checkpoint.read_bytes()
    for out in (other, link, checkpoint):
        assert explore([*argv, str(out)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"error: --out {out} ") and ("--force" in err[0] or "inputs" in err[0])
    assert other.read_bytes() == b"another run's model" and checkpoint.read_bytes() == checkpoint_bytes
    assert explore([*argv, str(checkpoint), "--force"]) == 2  # an input, even with --force
    assert checkpoint.read_bytes() == checkpoint_bytes
    assert explore([*argv, str(link), "--force"]) == 0  # the link itself is replaced, not its target
    assert not link.is_symlink() and "<html" in link.read_text() and other.read_bytes() == b"another run's model"
    assert explore([*argv, str(link)]) == 2  # a second explore to one --out is refused too


# ---- the page in headless Chromium ----


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if CHROMIUM is None or CHROMEDRIVER is None:
        pytest.skip("needs Debian's chromium and chromium-driver (apt-get install -y chromium chromium-driver)")
    webdriver = pytest.importorskip("selenium.webdriver", reason="needs selenium (pip install -e '.[dev]')")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    profile = tempfile.mkdtemp(prefix="vitkit-chromium-")
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    yield driver
    driver.quit()
    shutil.rmtree(profile, ignore_errors=True)


def open_page(driver: Any, page: str, folder: Path) -> None:
    """Write ``page`` and open it from file://, with the logs of earlier pages drained."""
    path = folder / "explorer.html"
    path.write_text(page, encoding="utf-8")
    driver.get("about:blank")
    driver.get_log("browser"), driver.get_log("performance")
    driver.get(path.as_uri())


def problems(driver: Any, levels: tuple[str, ...] = ("SEVERE",)) -> tuple[list[str], list[str]]:
    """``(console messages at ``levels``, URLs requested other than file:// and data:)`` since the page opened."""
    console = [entry["message"] for entry in driver.get_log("browser") if entry["level"] in levels]
    requests = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            url = message["params"]["request"]["url"]
            if not url.startswith(("file://", "data:")):
                requests.append(url)
    return console, requests


def api(driver: Any, call: str) -> Any:
    return driver.execute_script(f"return window.vitkitExplorer.{call};")


def assert_quiet(driver: Any, levels: tuple[str, ...] = ("SEVERE",)) -> None:
    """No console error (or message at ``levels``) and no request since the page opened."""
    console, requests = problems(driver, levels)
    assert console == [] and requests == []


def attention_row(attentions: list[torch.Tensor], image: int, layer: int, head: int | str, token: int,
                  direction: str = "row") -> tuple[np.ndarray, np.ndarray]:
    """What the page should show over the patches, and half the quantisation step of each value."""
    a = attentions[layer][image].double().numpy()  # [H, N, N]
    steps = a.max(-1) / 255 / 2  # [H, N]: half a step per query row
    heads = list(range(a.shape[0])) if head == "mean" else [head]
    if direction == "row":
        values, step = a[heads, token, :], np.repeat(steps[heads, token][:, None], a.shape[-1], axis=1)
    else:
        values, step = a[heads, :, token], steps[heads, :]
    return values.mean(0), step.mean(0) if head == "mean" else step[0]


def test_the_problem_detectors_see_a_console_error_and_a_request(browser: Any, tmp_path: Path) -> None:
    # The control: without it, an empty report would not show that the page is quiet.
    open_page(browser, '<script>console.error("boom"); fetch("http://127.0.0.1:9/x").catch(() => {});</script>', tmp_path)
    browser.execute_script("return new Promise((resolve) => setTimeout(resolve, 300));")
    console, requests = problems(browser)
    assert any("boom" in message for message in console)
    assert "http://127.0.0.1:9/x" in requests


def test_page_opens_quietly_and_select_then_current_map_is_the_attention_row(browser: Any, tmp_path: Path) -> None:
    model, images = token_model(), torch.randn(2, 3, 32, 48)
    open_page(browser, explorer_html(model, images), tmp_path)
    assert api(browser, "info()") == {
        "layers": 3, "depth": 3, "embeddedLayers": [0, 1, 2], "heads": [3, 3, 3], "maxHeads": 3, "tokens": 25,
        "prefixTokens": 1, "grid": [4, 6], "images": 2, "pooling": "token",
        "views": ["attention", "rollout", "grad_rollout", "chefer", "lrp"],
    }
    attentions = capture_attention(model, images).attentions
    for image, layer, head, token, direction in [
        (0, 2, "mean", 0, "row"), (1, 0, 1, 7, "row"), (1, 1, 2, 12, "column"), (0, 2, "mean", 24, "column"),
    ]:
        selection = {"image": image, "layer": layer, "head": head, "token": token, "direction": direction}
        api(browser, f"select({json.dumps(selection)})")
        shown = np.array(api(browser, "currentMap()"))
        assert shown.shape == (4, 6)
        expected, half_step = attention_row(attentions, image, layer, head, token, direction)
        assert np.all(np.abs(shown.ravel() - expected[1:]) <= half_step[1:] + 1e-7), selection
    assert_quiet(browser, ("SEVERE", "WARNING"))


def test_a_click_on_a_patch_selects_it_and_hovering_previews(browser: Any, tmp_path: Path) -> None:
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    model, images = token_model(), torch.randn(1, 3, 32, 48)
    open_page(browser, explorer_html(model, images), tmp_path)
    api(browser, 'select({layer: 1, head: 0, token: 0})')
    canvas = browser.find_element(By.ID, "main")
    width, height = canvas.size["width"], canvas.size["height"]

    def offset(row: int, col: int) -> tuple[int, int]:  # from the canvas centre, as selenium counts
        return round((col + 0.5) * width / 6 - width / 2), round((row + 0.5) * height / 4 - height / 2)

    ActionChains(browser).move_to_element_with_offset(canvas, *offset(1, 3)).perform()
    state = api(browser, "state()")
    assert state["token"] == 0 and state["hoverToken"] == 1 + 1 * 6 + 3
    ActionChains(browser).move_to_element_with_offset(canvas, *offset(2, 5)).click().perform()
    assert api(browser, "state()")["token"] == 1 + 2 * 6 + 5
    expected, half_step = attention_row(capture_attention(model, images).attentions, 0, 1, 0, 1 + 2 * 6 + 5)
    assert np.all(np.abs(np.ravel(api(browser, "currentMap()")) - expected[1:]) <= half_step[1:] + 1e-7)
    # a click on a model-view thumbnail selects its layer and head
    browser.find_element(By.CSS_SELECTOR, 'canvas[data-layer="2"][data-head="1"]').click()
    state = api(browser, "state()")
    assert (state["layer"], state["head"]) == (2, 1)
    assert_quiet(browser)


def test_pruned_heads_are_marked_and_a_fully_pruned_layer_opens(browser: Any, tmp_path: Path) -> None:
    from selenium.common.exceptions import JavascriptException
    from selenium.webdriver.common.by import By

    model, images = pruned_model(), torch.randn(1, 3, 32, 48)
    open_page(browser, explorer_html(model, images), tmp_path)
    assert api(browser, "info()")["heads"] == [2, 0, 3]
    # model view: layer 0 lacks one head, layer 1 all three and its mean
    assert len(browser.find_elements(By.CSS_SELECTOR, "#model-grid td.pruned")) == 1 + 4
    assert len(browser.find_elements(By.CSS_SELECTOR, "#stats-grid td.pruned")) == 1 + 3
    api(browser, 'select({layer: 1, head: "mean", token: 3})')
    assert api(browser, "currentMap()") is None
    assert "every head was pruned" in browser.find_element(By.ID, "caption").text
    with pytest.raises(JavascriptException, match="head must be"):
        api(browser, "select({layer: 0, head: 2})")
    api(browser, "select({layer: 2, head: 2, token: 5})")
    expected, half_step = attention_row(capture_attention(model, images).attentions, 0, 2, 2, 5)
    assert np.all(np.abs(np.ravel(api(browser, "currentMap()")) - expected[1:]) <= half_step[1:] + 1e-7)
    assert_quiet(browser)


def test_average_pooling_without_a_class_token(browser: Any, tmp_path: Path) -> None:
    model, images = avg_model(), torch.randn(1, 3, 32, 32)
    open_page(browser, explorer_html(model, images), tmp_path)
    info = api(browser, "info()")
    assert (info["prefixTokens"], info["tokens"], info["pooling"]) == (0, 16, "avg")
    assert api(browser, "state()")["token"] == 2 * 4 + 2  # the centre patch: there is no class token
    attentions = capture_attention(model, images).attentions
    api(browser, 'select({layer: 1, head: "mean", token: 5, direction: "column"})')
    expected, half_step = attention_row(attentions, 0, 1, "mean", 5, "column")
    assert np.all(np.abs(np.ravel(api(browser, "currentMap()")) - expected) <= half_step + 1e-7)
    api(browser, 'select({view: "rollout"})')
    rollout = attention_rollout(attentions, num_prefix_tokens=0, pooling="avg")[0]
    np.testing.assert_allclose(np.ravel(api(browser, "currentMap()")), rollout, atol=6e-5)
    assert_quiet(browser)


def test_explanations_follow_the_picked_class(browser: Any, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    model, images = token_model(), torch.randn(1, 3, 32, 48)
    open_page(browser, explorer_html(model, images), tmp_path)
    classes = [entry.text for entry in browser.find_elements(By.CSS_SELECTOR, "#top-classes li")]
    assert len(classes) == 5
    with torch.no_grad():
        third = int(model(images)[0].argsort(descending=True)[2])
    browser.find_elements(By.CSS_SELECTOR, "#top-classes li")[2].click()
    api(browser, 'select({view: "chefer"})')
    capture = capture_attention(model, images, third, with_gradients=True)
    chefer = chefer_relevance(capture.attentions, capture.gradients, 1, "token")[0]
    assert api(browser, "state()")["target"] == third
    np.testing.assert_allclose(np.ravel(api(browser, "currentMap()")), chefer, atol=6e-5)
    captions = [e.text for e in browser.find_elements(By.CSS_SELECTOR, "#explanation-thumbs figcaption")]
    assert captions[0].startswith("attention rollout\ndel ") and captions[1:] == ["grad rollout", "Chefer et al.", "AttnLRP"]
    browser.find_elements(By.CSS_SELECTOR, "#top-classes li")[0].click()  # the prediction: every map's scores
    scores = payload_of_page(browser)["images"][0]["scores"]
    captions = [e.text for e in browser.find_elements(By.CSS_SELECTOR, "#explanation-thumbs figcaption")]
    assert captions[3] == f"AttnLRP\ndel {scores['lrp']['deletion']:.2f} · ins {scores['lrp']['insertion']:.2f}"
    api(browser, 'select({view: "lrp"})')
    expected = torch.tensor(payload_of_page(browser)["images"][0]["explanations"]["lrp"][0])
    np.testing.assert_allclose(np.ravel(api(browser, "currentMap()")), expected, atol=1e-9)
    assert_quiet(browser)


def payload_of_page(driver: Any) -> dict:
    return json.loads(driver.execute_script('return document.getElementById("vitkit-data").textContent;'))


def pixel(driver: Any, x: int, y: int) -> np.ndarray:
    script = f'return Array.from(document.getElementById("main").getContext("2d").getImageData({x}, {y}, 1, 1).data);'
    return np.array(driver.execute_script(script)[:3])


def test_opacity_and_normalisation_change_the_drawing_and_the_colour_bar(browser: Any, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    model, images = token_model(), torch.randn(1, 3, 32, 48)
    open_page(browser, explorer_html(model, images), tmp_path)
    api(browser, 'select({layer: 2, head: 1, token: 0, opacity: 0})')
    x, y = round(2.5 * 448 / 6), round(1.5 * 448 * 4 / 6 / 4)  # the centre of patch (1, 2)
    picture = pixel(browser, x, y)
    api(browser, "select({opacity: 1})")
    shown = np.ravel(api(browser, "currentMap()"))
    expected = np.array(colormaps["viridis"](shown[1 * 6 + 2] / shown.max())[:3]) * 255
    assert np.abs(pixel(browser, x, y) - expected).max() <= 4  # the page's viridis has 11 knots
    assert np.abs(picture - expected).max() > 4
    assert float(browser.find_element(By.ID, "bar-max").text) == pytest.approx(shown.max(), rel=1e-2)
    assert "Per-map" in browser.find_element(By.ID, "bar-label").text
    api(browser, 'select({normalization: "global"})')
    attentions = capture_attention(model, images).attentions
    overall = max(float(a[0, :, 0, 1:].max()) for a in attentions)
    assert float(browser.find_element(By.ID, "bar-max").text) == pytest.approx(overall, rel=1e-2)
    assert "Global" in browser.find_element(By.ID, "bar-label").text
    assert_quiet(browser)


def test_a_screenshot_of_the_explorer_is_not_blank(browser: Any, tmp_path: Path) -> None:
    open_page(browser, explorer_html(token_model(), torch.randn(2, 3, 32, 48)), tmp_path)
    shot = tmp_path / "explorer.png"
    assert browser.save_screenshot(str(shot))
    pixels = np.asarray(Image.open(shot).convert("RGB"), dtype=float)
    assert pixels.shape[1] == 1400
    assert pixels.std() > 20  # panels, maps and text, not an empty page
    assert_quiet(browser)


def test_a_headless_model_opens_with_attention_and_rollout_and_short_captions(browser: Any, tmp_path: Path) -> None:
    import timm
    from selenium.webdriver.common.by import By

    torch.manual_seed(0)  # timm's DINOv2 with 4 registers, headless as timm builds it (num_classes=0)
    dinov2 = timm.create_model("vit_small_patch14_reg4_dinov2", pretrained=False, depth=2, img_size=28,
                               num_classes=0).eval()
    model = vitkit.from_timm(dinov2).eval()
    images = torch.randn(2, 3, 28, 28)
    long_name = "/data/a/very/long/folder/of/photographs/taken/in/2024/cat.png"
    page = explorer_html(model, images, names=[long_name, "dog.png"])
    payload = payload_of(page)
    assert payload["headless"] and all(record["top"] == [] for record in payload["images"])
    open_page(browser, page, tmp_path)
    assert api(browser, "info()")["views"] == ["attention", "rollout"]
    api(browser, 'select({"view": "rollout", "image": 1})')
    shown = np.array(api(browser, "currentMap()"))
    # Abnar & Zuidema's rollout by hand, read out from the class token over the 2x2 patches (after 1 + 4 prefix tokens)
    joint = None
    for attention in capture_attention(model, images).attentions:
        mixed = (attention[1].double().mean(dim=0) + torch.eye(attention.shape[-1], dtype=torch.float64)) / 2
        mixed = mixed / mixed.sum(dim=-1, keepdim=True)
        joint = mixed if joint is None else mixed @ joint
    expected = joint[0, 5:] / joint[0, 5:].max()
    np.testing.assert_allclose(shown.ravel(), expected.numpy(), atol=1e-4)
    with pytest.raises(Exception, match="no classifier"):
        api(browser, 'select({"target": 0})')
    first = browser.find_elements(By.CSS_SELECTOR, "#images button")[0]
    assert first.text.startswith("cat.png · no classifier") and first.get_attribute("title") == long_name
    offered = [e.get_attribute("value") for e in browser.find_elements(By.CSS_SELECTOR, "input[name=view]")
               if e.is_displayed()]
    assert offered == ["attention", "rollout"]  # the class-explaining views are not offered at all
    assert_quiet(browser)
