"""The LightningDataModule: :func:`vitkit.data.build_datasets` splits served by DataLoaders.

In-memory splits (digits, MNIST, Fashion-MNIST, CIFAR, shapes) whose augmentation runs on whole
batches (:mod:`vitkit.data.batch_transforms`) are kept on the training device when it is an
accelerator: their ``uint8`` images are copied there once, the loader yields only the indices of
each batch (:class:`IndexBatch`), and the gather, the augmentation and the normalisation run on the
device after the transfer (``on_after_batch_transfer``), so a GPU never waits for the host's data
path. The same random draws in the same order give the same batches as the host path.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property, partial
from typing import Any, Literal

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset

from ..data import ArrayDataset, DataConfig, DataInfo, DatasetBundle, build_datasets, labelled_folder_halves
from ..data.batch_transforms import BatchTransform
from ..schema import RecipeError

#: Full batches an epoch that a clamped batch size leaves (:meth:`ViTDataModule.fit_batch`).
MIN_BATCHES = 4
#: The smallest batch :meth:`ViTDataModule.fit_batch` clamps a split of at least one batch to.
MIN_CLAMPED = 8

Split = Literal["train", "val", "test"]


@dataclass
class IndexBatch:
    """The indices ``[B]`` of one batch of an in-memory split whose images live on the device."""

    indices: torch.Tensor
    split: str

    @classmethod
    def collate(cls, indices: list[int], split: str) -> IndexBatch:
        """A DataLoader's ``collate_fn``: the sampled indices as one tensor."""
        return cls(torch.as_tensor(indices, dtype=torch.long), split)


class _Indices(Dataset):
    """``0..n-1``: what a loader of an on-device split samples."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> int:
        return index

    def __getitems__(self, indices: list[int]) -> list[int]:
        return indices


class ViTDataModule(L.LightningDataModule):
    """Train/val/test loaders over one :class:`~vitkit.data.DatasetBundle`, built on first use.

    Args:
        config: the recipe's data section.
        batch_size: images per device per step; evaluation uses twice as many.
        on_device: keep in-memory splits on the training device (see the module docstring);
            ``None``: when training on an accelerator.

    The training loader shuffles and drops the last incomplete batch (Mixup needs even, equal
    batches); under DDP Lightning adds a ``DistributedSampler``. It reads each split through
    :attr:`task_data`, the task's :meth:`~vitkit.tasks.Task.split_data` (DINO's crops, a dense
    task's targets).
    """

    def __init__(self, config: DataConfig, batch_size: int, on_device: bool | None = None) -> None:
        super().__init__()
        self.config = config
        self.batch_size = batch_size
        self.on_device = on_device
        self._resident: dict[tuple[str, torch.device], tuple[torch.Tensor, torch.Tensor, BatchTransform]] = {}
        self.task_data: Callable[[Dataset, Split], Dataset] = _as_built
        self._labelled: dict[str, tuple[Dataset, Dataset, int]] = {}

    @cached_property
    def bundle(self) -> DatasetBundle:
        """The three splits and their :class:`DataInfo`."""
        return build_datasets(self.config)

    @property
    def info(self) -> DataInfo:
        """Classes, image geometry and normalisation."""
        return self.bundle.info

    def labelled_folder(self, root: str) -> tuple[Dataset, Dataset, int]:
        """A labelled folder's k-NN bank, queries and class count through this data's evaluation
        (:func:`~vitkit.data.labelled_folder_halves`), read once: the start of a run refuses a bad
        one, and its measurements reuse what that read."""
        if root not in self._labelled:
            self._labelled[root] = labelled_folder_halves(root, self.info, self.config.seed)
        return self._labelled[root]

    def fit_batch(self) -> str | None:
        """Clamp the batch size to a small training split: the largest power of two that gives at
        least :data:`MIN_BATCHES` full batches an epoch, when the split is smaller than one batch
        (every batch would be dropped), or gives fewer full batches than that and the clamped batch
        still holds :data:`MIN_CLAMPED` images (a few labelled images a class: 100 images in batches
        of 32 would take three steps an epoch). The ``note:`` line that says so, or ``None``."""
        images = len(self.bundle.train)
        clamped = 1 << max(0, (images // MIN_BATCHES).bit_length() - 1)
        if images >= self.batch_size * MIN_BATCHES or (images >= self.batch_size and clamped < MIN_CLAMPED):
            return None
        wanted, self.batch_size = self.batch_size, clamped
        why = (f"is more than the {images} training images" if images < wanted else
               f"gives {images // wanted} full batches an epoch of the {images} training images")
        return (f"note: trainer.batch_size {wanted} {why}; batches of {self.batch_size} instead "
                f"({images // self.batch_size} full batches an epoch; set trainer.batch_size to choose).")

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
        return self._split_loader("train", self.batch_size, train=True)

    def val_dataloader(self) -> DataLoader:
        return self._split_loader("val", 2 * self.batch_size, train=False)

    def test_dataloader(self) -> DataLoader:
        return self._split_loader("test", 2 * self.batch_size, train=False)

    def _keeps_on_device(self, dataset: Dataset) -> bool:
        if not (isinstance(dataset, ArrayDataset) and dataset.batch_transform is not None):
            return False
        if self.on_device is not None:
            return self.on_device
        return self.trainer is not None and (self.trainer.strategy.root_device.type != "cpu" or self.config.num_workers == 0)

    def _split_loader(self, split: Split, batch_size: int, train: bool) -> DataLoader:
        """The loader Lightning iterates: of indices for an on-device split, else :meth:`loader`."""
        built = getattr(self.bundle, split)
        dataset = self.task_data(built, split)
        if dataset is not built or not self._keeps_on_device(dataset):  # a task's own view of the data stays on the host
            return self.loader(dataset, batch_size, train)
        return DataLoader(
            _Indices(len(dataset)), batch_size=batch_size, shuffle=train, drop_last=train,
            collate_fn=partial(IndexBatch.collate, split=split),
        )

    def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int) -> Any:
        """An :class:`IndexBatch` moves its one tensor (Lightning's generic move would deep-copy
        the dataclass every step); other batches move as Lightning moves them."""
        if isinstance(batch, IndexBatch):
            return IndexBatch(batch.indices.to(device, non_blocking=True), batch.split)
        return super().transfer_batch_to_device(batch, device, dataloader_idx)

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """An :class:`IndexBatch` (already on the device) becomes ``(images [B, C, H, W], labels
        [B])``: gathered from the split's resident copy and transformed there."""
        if not isinstance(batch, IndexBatch):
            return batch
        images, labels, transform = self.resident(batch.split, batch.indices.device)
        return transform(images[batch.indices]), labels[batch.indices]

    def resident(self, split: str, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, BatchTransform]:
        """``split``'s ``uint8 [N, H, W, C]`` images and ``[N]`` labels on ``device`` (copied once)
        and its batch transform."""
        key = (split, device)
        if key not in self._resident:
            dataset: ArrayDataset = getattr(self.bundle, split)
            images = torch.from_numpy(dataset.images).to(device)
            labels = torch.from_numpy(dataset.labels).to(device)
            self._resident[key] = (images, labels, dataset.batch_transform)
        return self._resident[key]

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


def _as_built(dataset: Dataset, split: Split) -> Dataset:
    return dataset
