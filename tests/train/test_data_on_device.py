"""In-memory splits kept on the training device: the loader yields indices, and the gather, the
augmentation and the normalisation run after the transfer. Forced on here (the CPU is the device),
the batches must be the host path's, draw for draw."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import pytest
import torch
from tiny_runs import tiny_recipe

from vitkit.data import DataConfig
from vitkit.train import load_recipe
from vitkit.train.datamodule import IndexBatch, ViTDataModule
from vitkit.train.run import build_module

AUGMENTED = {"name": "digits", "img_size": 8, "num_workers": 0,
             "augment": {"crop": "pad", "padding": 2, "hflip": 0.5, "random_erasing": 0.5, "erasing_mode": "pixel"}}


def batches(module: ViTDataModule, split: str, count: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    torch.manual_seed(0)
    loader = getattr(module, f"{split}_dataloader")()
    taken = []
    for batch in loader:
        taken.append(module.on_after_batch_transfer(batch, 0))
        if len(taken) == count:
            break
    return taken


@pytest.mark.parametrize("split", ["train", "val", "test"])
def test_the_device_path_gives_the_host_paths_batches_draw_for_draw(split: str) -> None:
    config = DataConfig.from_dict(AUGMENTED)
    host, device = ViTDataModule(config, 32, on_device=False), ViTDataModule(config, 32, on_device=True)
    assert isinstance(next(iter(device.train_dataloader())), IndexBatch)
    assert not isinstance(next(iter(host.train_dataloader())), IndexBatch)
    for (images, labels), (expected_images, expected_labels) in zip(batches(device, split, 3), batches(host, split, 3)):
        assert images.dtype == torch.float32 and images.shape == expected_images.shape
        torch.testing.assert_close(images, expected_images, rtol=0, atol=0)
        assert torch.equal(labels, expected_labels)
    if split == "train":  # the augmentation ran: mirrored, shifted and erased images differ from the plain ones
        plain = ViTDataModule(DataConfig.from_dict({**AUGMENTED, "augment": {"enabled": False}}), 32, on_device=True)
        assert not torch.equal(batches(plain, split, 1)[0][0], batches(device, split, 1)[0][0])


def test_the_device_loader_drops_the_last_incomplete_training_batch_only() -> None:
    """As the data module documents: training batches are full (the last incomplete one dropped),
    validation and test batches (twice as large) cover every image."""
    module = ViTDataModule(DataConfig.from_dict(AUGMENTED), 32, on_device=True)
    for split, size, drop_last in (("train", 32, True), ("val", 64, False), ("test", 64, False)):
        images = len(getattr(module.bundle, split))
        assert images % size, f"{split}: {images} images make no incomplete batch of {size}"
        expected = [size] * (images // size) + ([] if drop_last else [images % size])
        loader = getattr(module, f"{split}_dataloader")()
        assert len(loader) == len(expected)
        assert [len(batch.indices) for batch in loader] == expected


def test_a_run_trains_and_evaluates_from_a_split_kept_on_the_device(tmp_path: Path) -> None:
    config = load_recipe(tiny_recipe(tmp_path, limit_train_batches=3, limit_val_batches=2))
    data = ViTDataModule(config.data, config.trainer.batch_size, on_device=True)
    module = build_module(config, data.info)
    trainer = L.Trainer(max_epochs=1, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, limit_train_batches=3,
                        limit_val_batches=2)
    trainer.fit(module, datamodule=data)
    assert trainer.global_step == 3 and "val/acc1" in trainer.logged_metrics
    assert {key[0] for key in data._resident} == {"train", "val"}
