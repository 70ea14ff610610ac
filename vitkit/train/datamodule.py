"""The LightningDataModule: :func:`vitkit.data.build_datasets` splits served by DataLoaders."""

from __future__ import annotations

from collections.abc import Callable
from functools import cached_property

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset

from ..data import DataConfig, DataInfo, DatasetBundle, build_datasets
from .schema import RecipeError


class ViTDataModule(L.LightningDataModule):
    """Train/val/test loaders over one :class:`~vitkit.data.DatasetBundle`, built on first use.

    Args:
        config: the recipe's data section.
        batch_size: images per device per step; evaluation uses twice as many.

    The training loader shuffles and drops the last incomplete batch (Mixup needs even, equal
    batches); under DDP Lightning adds a ``DistributedSampler``. It reads the training split through
    :attr:`training_data`, the task's :meth:`~vitkit.tasks.Task.training_data` (DINO's crops).
    """

    def __init__(self, config: DataConfig, batch_size: int) -> None:
        super().__init__()
        self.config = config
        self.batch_size = batch_size
        self.training_data: Callable[[Dataset], Dataset] = _as_built

    @cached_property
    def bundle(self) -> DatasetBundle:
        """The three splits and their :class:`DataInfo`."""
        return build_datasets(self.config)

    @property
    def info(self) -> DataInfo:
        """Classes, image geometry and normalisation."""
        return self.bundle.info

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
        return self.loader(self.training_data(self.bundle.train), self.batch_size, train=True)

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


def _as_built(dataset: Dataset) -> Dataset:
    return dataset
