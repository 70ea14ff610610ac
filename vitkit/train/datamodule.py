"""The LightningDataModule: :func:`vitkit.data.build_datasets` splits served by DataLoaders."""

from __future__ import annotations

import dataclasses
from functools import cached_property

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset

from ..data import DataConfig, DataInfo, DatasetBundle, build_datasets
from .schema import RecipeError

#: Full batches an epoch that a clamped batch size leaves (:meth:`ViTDataModule.fit_batch`).
MIN_BATCHES = 4


class ViTDataModule(L.LightningDataModule):
    """Train/val/test loaders over one :class:`~vitkit.data.DatasetBundle`, built on first use.

    Args:
        config: the recipe's data section.
        batch_size: images per device per step; evaluation uses twice as many.

    The training loader shuffles and drops the last incomplete batch (Mixup needs even, equal
    batches); under DDP Lightning adds a ``DistributedSampler``.
    """

    def __init__(self, config: DataConfig, batch_size: int) -> None:
        super().__init__()
        self.config = config
        self.batch_size = batch_size

    @cached_property
    def bundle(self) -> DatasetBundle:
        """The three splits and their :class:`DataInfo`."""
        return build_datasets(self.config)

    @property
    def info(self) -> DataInfo:
        """Classes, image geometry and normalisation."""
        return self.bundle.info

    def fit_batch(self) -> str | None:
        """Clamp the batch size to a training split smaller than one batch (every batch would be
        dropped): the largest power of two that gives at least :data:`MIN_BATCHES` full batches an
        epoch; the ``note:`` line that says so, or ``None`` when the batch fits."""
        images = len(self.bundle.train)
        if images >= self.batch_size:
            return None
        wanted, self.batch_size = self.batch_size, 1 << max(0, (images // MIN_BATCHES).bit_length() - 1)
        return (f"note: trainer.batch_size {wanted} is more than the {images} training images; batches of "
                f"{self.batch_size} instead ({images // self.batch_size} full batches an epoch; set "
                "trainer.batch_size to choose).")

    def fit_workers(self, cores: int) -> str | None:
        """Clamp ``data.num_workers`` to the ``cores`` this process may use (more worker processes
        only compete for them, and torch's DataLoader warns for each loader); the ``note:`` line that
        says so, or ``None``."""
        wanted = self.config.num_workers
        if wanted <= cores:
            return None
        self.config = dataclasses.replace(self.config, num_workers=cores)
        return f"note: data.num_workers {wanted} is more than the {cores} usable CPU cores; {cores} workers instead."

    def check_batch(self, replicas: int = 1) -> None:
        """Refuse a training split smaller than one batch on each of ``replicas`` processes (every
        batch would be dropped)."""
        train = self.bundle.train
        if len(train) < self.batch_size * replicas:
            raise RecipeError(
                f"the training split has {len(train)} images, fewer than one batch "
                f"(trainer.batch_size={self.batch_size} x {replicas} device(s)); lower trainer.batch_size."
            )

    def train_dataloader(self) -> DataLoader:
        self.check_batch(self.trainer.world_size if self.trainer is not None else 1)
        return self.loader(self.bundle.train, self.batch_size, train=True)

    def val_dataloader(self) -> DataLoader:
        return self.loader(self.bundle.val, 2 * self.batch_size, train=False)

    def test_dataloader(self) -> DataLoader:
        return self.loader(self.bundle.test, 2 * self.batch_size, train=False)

    def loader(self, dataset: Dataset, batch_size: int, train: bool) -> DataLoader:
        workers = self.config.num_workers
        return DataLoader(
            dataset,
            batch_size=batch_size,
            shuffle=train,
            drop_last=train,
            num_workers=workers,
            persistent_workers=workers > 0,
            pin_memory=torch.cuda.is_available(),
        )
