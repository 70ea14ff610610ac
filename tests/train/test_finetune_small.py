"""The finetune_small recipe: a small vitkit model fine-tuned on an image folder with few labels per
class, from the data's path (and the model's) alone: full fine-tuning, as docs/finetune.md advises
for a few blocks, with the batch fitted to the folder."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from tiny_runs import gray_folder

import vitkit
from vitkit.io import load_model_and_extra
from vitkit.train import load_recipe, train

#: What a test changes beyond the data and the model: one quick float32 epoch on the CPU.
QUICK = ["trainer.max_epochs=1", "trainer.precision=32-true", "trainer.accelerator=cpu", "trainer.num_threads=1",
         "trainer.enable_progress_bar=false"]


def test_the_small_fine_tuning_recipe_trains_the_whole_model_at_one_rate() -> None:
    config = load_recipe("finetune_small")
    assert config.optim.layer_decay is None and config.model.freeze in (None, "none") and config.model.lora is None
    assert config.optim.lr == 5e-4 and config.data.name == "imagefolder" and config.data.augment.crop == "pad"


def test_the_small_fine_tuning_recipe_needs_only_the_folder_and_the_model(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = gray_folder(tmp_path / "folder")  # 2 classes x 8 gray training images
    source = vitkit.VisionTransformer(img_size=16, in_chans=1, patch_size=4, embed_dim=16, depth=2, num_heads=2,
                                      num_classes=5)
    (tmp_path / "source").mkdir()
    model_file = vitkit.save_model(source, tmp_path / "source" / "model.safetensors", extra={"class_names": list("vwxyz")})
    (tmp_path / "latest").symlink_to(tmp_path / "source", target_is_directory=True)  # as runs/<recipe>/latest
    with caplog.at_level(logging.INFO):
        result = train("finetune_small", [f"data.root={root}", f"model.pretrained={tmp_path / 'latest' / 'model.safetensors'}",
                                          f"output.dir={tmp_path / 'runs'}", *QUICK])
    assert "note: trainer.batch_size 32 is more than the 16 training images; batches of 4 instead" in caplog.text
    model, extra = load_model_and_extra(result.run_dir / "model.safetensors")
    assert model.config.num_classes == 2 and model.config.in_chans == 1 and extra["crop_pct"] == 1.0
    real = str(model_file.resolve())  # the weights this run started from, not the link the next run moves
    assert result.summary["model"].startswith(f"fine-tuned from {real},") and extra["pretrained"]["pretrained"] == real
