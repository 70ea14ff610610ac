"""The journey on a user's own folders: pre-train on a flat folder of unlabelled gray images (sized to
them, k-NN measured on a labelled folder), fine-tune on a few labelled images per class from the
encoder file (its size and channels), and the same model from fresh weights."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from vitkit.data import DataInfo
from vitkit.io import read_model
from vitkit.schema import RecipeError
from vitkit.train import load_recipe, train
from vitkit.train.model_builder import build_model, load_starting_weights
from vitkit.train.sizing import SIZE_TIERS, tier_for

TINY = ["trainer.max_epochs=1", "trainer.limit_train_batches=2", "trainer.limit_val_batches=1",
        "trainer.limit_test_batches=1", "trainer.batch_size=8", "trainer.enable_progress_bar=false",
        "data.num_workers=0", "trainer.log_every=1", "trainer.time_budget_minutes=null"]


def gray_images(folder: Path, count: int, side: int, seed: int, value: int | None = None) -> None:
    """``count`` gray ``side``-px PNGs: noise, or noise around ``value`` (a class's brightness)."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for index in range(count):
        base = rng.integers(0, 255, (side, side)) if value is None else value + rng.integers(-20, 20, (side, side))
        Image.fromarray(np.clip(base, 0, 255).astype(np.uint8)).save(folder / f"{seed}_{index}.png")


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("own")
    gray_images(root / "unlabelled", 40, 20, seed=0)  # a flat folder: no class folders
    for label, value in enumerate((40, 120, 200)):
        gray_images(root / "labelled" / f"class{label}", 6, 20, seed=label + 1, value=value)
    return root / "unlabelled", root / "labelled"


@pytest.fixture(scope="module")
def encoder_run(folders: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    unlabelled, labelled = folders
    out = tmp_path_factory.mktemp("runs")
    # model.embed_dim/num_heads on the line win over the tier; the tier still sets the rest
    return train("mae_imagefolder", [f"data.root={unlabelled}", f"task.knn_root={labelled}", f"output.dir={out}",
                                     "model.embed_dim=32", "model.num_heads=2", "task.mae.decoder_dim=16",
                                     "task.mae.decoder_heads=2", "data.val_fraction=0.1", "data.test_fraction=0.1", *TINY])


def test_pretraining_takes_a_flat_folder_sized_to_its_images_and_measures_on_the_labelled_one(
    encoder_run, folders: tuple[Path, Path],  # noqa: ANN001
) -> None:
    unlabelled, labelled = folders
    config = load_recipe(encoder_run.run_dir / "config.yaml")
    tier = tier_for(20)
    assert tier is SIZE_TIERS[0] and tier.img_size == 32  # 20-px images: the smallest tier
    assert (config.data.in_chans, config.data.resolved_img_size()) == (1, (32, 32))  # gray, the tier's size
    assert (config.model.patch_size, config.model.depth) == ((8, 8), tier.model["depth"]) == ((8, 8), 4)
    assert (config.model.embed_dim, config.model.num_heads) == (32, 2)  # the recipe line's own values won
    summary = encoder_run.summary
    assert summary["knn_root"] == str(labelled) and summary["knn_acc1"] is not None
    command = summary["finetune_command"]
    assert command.startswith("vitkit train finetune_small ") and f"data.root={labelled}" in command
    assert str(unlabelled) not in command and "data.img_size" not in command
    assert summary["scratch_command"] == command + " model.pretrained_weights=false"


def test_finetuning_a_few_labels_reads_the_encoders_size_and_channels_and_keeps_the_last_epoch(
    encoder_run, folders: tuple[Path, Path], tmp_path: Path,  # noqa: ANN001
) -> None:
    _, labelled = folders
    encoder = encoder_run.run_dir / "model.safetensors"
    result = train("finetune_small", [f"data.root={labelled}", f"model.pretrained={encoder}", f"output.dir={tmp_path}",
                                      *TINY])
    config = load_recipe(result.run_dir / "config.yaml")
    # the labelled images are 20 px: 32 and one channel can only come from the encoder file
    assert config.data.resolved_img_size() == (32, 32) and config.data.in_chans == 1
    assert config.trainer.monitor == "last" and result.summary["held_out"] is False  # 6 a class: none held out
    assert config.trainer.batch_size == 8  # 18 images: 4 full batches would take batches of 4, under the floor of 8
    model_config, _, _ = read_model(result.run_dir / "model.safetensors")
    assert model_config.num_classes == 3


def test_pretrained_weights_false_builds_the_encoders_model_with_fresh_weights(encoder_run) -> None:  # noqa: ANN001
    encoder = encoder_run.run_dir / "model.safetensors"
    _, state, _ = read_model(encoder)
    recipe = load_recipe("finetune_small", [f"model.pretrained={encoder}"])
    fresh_recipe = load_recipe("finetune_small", [f"model.pretrained={encoder}", "model.pretrained_weights=false"])
    info = DataInfo(num_classes=3, class_names=("a", "b", "c"), img_size=(32, 32), in_chans=1, mean=(0.5,), std=(0.5,),
                    name="imagefolder")
    loaded, _ = build_model(recipe, info, load_starting_weights(recipe.model))
    fresh, fresh_config = build_model(fresh_recipe, info, load_starting_weights(fresh_recipe.model))
    assert fresh_config == loaded.config  # the same architecture
    name = "blocks.0.attn.qkv.weight"
    assert torch.equal(loaded.state_dict()[name], state[name])
    assert not torch.allclose(fresh.state_dict()[name], state[name])  # fresh, not the encoder's
    assert fresh.state_dict()[name].std().item() > 0.01  # initialised, not zero


def test_pretrained_weights_false_without_weights_is_refused() -> None:
    with pytest.raises(RecipeError, match="pretrained_weights.*only applies to pretrained weights"):
        load_recipe("shapes", ["model.pretrained_weights=false"])
    with pytest.raises(RecipeError, match="fit_to_images.*model.pretrained fixes the model"):
        load_recipe("mae_imagefolder", ["model.pretrained=x.safetensors"])


def test_bad_folders_are_refused_in_one_line_before_a_run_directory(folders: tuple[Path, Path], tmp_path: Path) -> None:
    from vitkit.data import DataConfig, ImageFolderError, build_datasets, labelled_folder_halves

    unlabelled, labelled = folders
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="holds no images with extensions"):
        build_datasets(DataConfig(name="imagefolder", root=str(tmp_path / "empty"), require_classes=False))
    gray_images(tmp_path / "one" / "only", 4, 20, seed=9)
    info = DataInfo(num_classes=1, class_names=("images",), img_size=(32, 32), in_chans=1, mean=(0.5,), std=(0.5,),
                    name="imagefolder")
    for folder in (tmp_path / "one", unlabelled):  # one class folder; a flat folder (no class folders)
        with pytest.raises(ImageFolderError, match="k-NN measurement needs a few labelled images of two or more"):
            labelled_folder_halves(folder, info)
    runs = tmp_path / "runs"
    with pytest.raises(RecipeError, match=r"cannot take the data's 4x4 images: .*divisible by patch_size 8\. Set data"):
        train("mae_imagefolder", [f"data.root={unlabelled}", "data.img_size=4", f"output.dir={runs}", *TINY])
    with pytest.raises(RecipeError, match=r"task\.mae\.mask_ratio is 0\.97, which leaves no visible patch of the 16 "):
        train("mae_imagefolder", [f"data.root={unlabelled}", "task.mae.mask_ratio=0.97", f"output.dir={runs}", *TINY])
    with pytest.raises(ImageFolderError, match="k-NN measurement"):
        train("mae_imagefolder", [f"data.root={unlabelled}", f"task.knn_root={tmp_path / 'one'}", f"output.dir={runs}",
                                  *TINY])
    assert not runs.exists()


def test_dino_on_a_folder_decodes_each_image_and_each_knn_image_once_and_trains_from_memory(
    folders: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from collections import Counter

    from vitkit.data import images

    unlabelled, labelled = folders
    opened: Counter[Path] = Counter()
    original = images._open
    monkeypatch.setattr(images, "_open", lambda path: opened.update([Path(path)]) or original(path))
    result = train("dino_imagefolder", [
        f"data.root={unlabelled}", f"task.knn_root={labelled}", f"output.dir={tmp_path}", "model.embed_dim=32",
        "model.num_heads=2", "task.dino.out_dim=32", "task.dino.hidden_dim=32", "task.dino.bottleneck_dim=16",
        *[option for option in TINY if not option.startswith("trainer.max_epochs")], "trainer.max_epochs=2"])
    assert result.summary["global_steps"] == 4 and result.summary["knn_acc1"] is not None
    config = load_recipe(result.run_dir / "config.yaml")
    assert config.data.in_memory and config.data.resolved_crop_pct() == 1.0
    read = {path: count for path, count in opened.items() if path.parent == unlabelled}
    assert sorted(read) == sorted(unlabelled.glob("*.png")) and set(read.values()) == {1}  # two epochs, one read
    knn = {path: count for path, count in opened.items() if labelled in path.parents}
    assert sorted(knn) == sorted(labelled.rglob("*.png")) and set(knn.values()) == {1}  # checked at the start, measured at the end


@pytest.mark.parametrize(("recipe", "layout", "message"), [
    ("mae_imagefolder", "empty", "holds no images with extensions"),
    ("dino_imagefolder", "empty", "holds no images with extensions"),
    ("finetune_small", "one class", "has a single class folder, 'only'; a classifier needs at least two"),
    ("mae_imagefolder", "4-px images", "cannot take the data's 4x4 images"),
])
def test_each_bad_folder_of_the_journey_is_one_error_line(
    recipe: str, layout: str, message: str, encoder_run, tmp_path: Path, capsys: pytest.CaptureFixture,  # noqa: ANN001
) -> None:
    from vitkit.cli.train import main as train_main

    root = tmp_path / "data"
    root.mkdir()
    line = [f"data.root={root}", f"output.dir={tmp_path / 'runs'}", *TINY]
    if layout == "one class":  # fine-tuning the journey's encoder on one class folder
        gray_images(root / "only", 4, 20, seed=0)
        line.append(f"model.pretrained={encoder_run.run_dir / 'model.safetensors'}")
    elif layout == "4-px images":  # smaller than a patch, kept at their size
        gray_images(root, 60, 4, seed=1)  # enough for one validation and one test image
        line.append("data.img_size=4")
    assert train_main([recipe, *line]) != 0
    (error,) = capsys.readouterr().err.strip().splitlines()
    assert error.startswith("error: ") and message in error
    assert not (tmp_path / "runs").exists()
