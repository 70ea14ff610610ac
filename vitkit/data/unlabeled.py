"""Unlabeled images for semi-supervised training, and the training stream that pairs them with the
labelled split (FixMatch, Sohn et al. 2020, arXiv 2001.07685: each step reads ``B`` labelled
images and ``mu * B`` unlabeled ones).

:func:`unlabeled_images` finds them: the training images of an in-memory dataset that
``data.train_per_class`` leaves out (the same draw by the same seed, so never a labelled one; the
validation split stays out), or every image under ``task.fixmatch.unlabeled_root``, decoded once at the
run's size and channels as ``data.in_memory`` decodes a folder. :class:`SemiSupervisedStream`
serves both as ``uint8`` batches, which the task augments on the training device with
:class:`FixMatchViews`: the weak view is the data section's own augmentation (FixMatch's flip and
shift), the strong one adds RandAugment and Cutout (:mod:`.randaugment`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from ..collective import process_place
from ..errors import VitkitError
from .arrays import ArrayDataset
from .batch_transforms import BatchTransform, build_batch_transform
from .build import FolderDecoder, build_datasets, per_class_draw
from .config import AugmentConfig, DataConfig
from .imagefolder import SplitFiles, drop_unreadable, image_files
from .info import DataInfo
from .randaugment import BatchRandAugment

#: A sample of :class:`SemiSupervisedStream`: a labelled ``uint8 [H, W, C]`` image, its label,
#: ``mu`` unlabeled ``uint8 [mu, H, W, C]`` images and their places ``long [mu]`` among the unlabeled ones.
Sample = tuple[torch.Tensor, int, torch.Tensor, torch.Tensor]


class UnlabeledDataError(VitkitError, ValueError):
    """No unlabeled images to train on, or too few for one step."""


def unlabeled_images(config: DataConfig, info: DataInfo, root: str | None = None) -> np.ndarray:
    """The unlabeled images of a run as ``uint8 [N, H, W, C]`` at ``info``'s size and channels.

    Args:
        config: the data section: with no ``root``, the training images of an in-memory dataset
            that ``train_per_class`` does not keep (of the ``classes`` chosen); each of a folder's
            images is decoded once, an unreadable file skipped or refused as its ``skip_corrupt`` says.
        info: the run's data (the size, channels and resize of the labelled images).
        root: a folder of unlabeled images (every image under it), or ``None``.

    Raises:
        UnlabeledDataError: neither source (every training image is labelled), or an empty folder.
    """
    if root is not None:
        files = image_files(Path(root))
        if not files:
            raise UnlabeledDataError(f"task.fixmatch.unlabeled_root={root} holds no images (searched recursively).")
        decoder = FolderDecoder(info)
        files, _, _ = drop_unreadable(files, [0] * len(files), config.skip_corrupt, check=decoder)
        return decoder.stack(SplitFiles(files, [0] * len(files), []))[0]
    if config.train_per_class is None:
        raise UnlabeledDataError(
            "semi-supervised training needs unlabeled images, but every training image is labelled: set "
            "data.train_per_class (the training images it leaves out are the unlabeled ones) or task.fixmatch.unlabeled_root."
        )
    every = build_datasets(dataclasses.replace(config, train_per_class=None)).train
    if not isinstance(every, ArrayDataset):
        raise UnlabeledDataError(f"data.name={config.name} keeps no images in memory to leave out as unlabeled ones: "
                                 "set task.fixmatch.unlabeled_root.")
    labelled = per_class_draw(every.labels, info.class_names, config.train_per_class, config.seed)
    return np.delete(every.images, labelled, axis=0)


class SemiSupervisedStream(Dataset):
    """The labelled split and the unlabeled images as one training stream of ``uint8`` images.

    An epoch is one pass over the unlabeled images in a random order: ``len(unlabeled) // mu``
    samples, each a labelled image (sample ``i`` reads labelled image ``i mod L``, so a shuffled
    epoch shows each of the ``L`` labelled images equally often, give or take one), its label and
    the next ``mu`` unlabeled images of the pass with their indices. A DataLoader's batch of ``B``
    samples is then ``(labelled [B, H, W, C], labels [B], unlabeled [B, mu, H, W, C], indices
    [B, mu])``. The pass is a permutation drawn from a generator of its own seeded by ``seed``, drawn
    again when it runs out. Every process and loader worker draws the same passes and reads only its
    share of each (process ``r`` of ``R``, worker ``w`` of ``W``: every ``R * W``-th image from
    place ``r * W + w``), as a ``DistributedSampler`` shares out the labelled images: the processes of
    a multi-device run and the workers of a loader read different unlabeled images, never the same
    ones, and together the whole pass.

    Args:
        labelled: the labelled training split, in memory.
        unlabeled: ``uint8 [N, H, W, C]`` images of the same size and channels.
        mu: unlabeled images per labelled one (FixMatch's ``mu``).
        seed: the passes' seed (the run's ``trainer.seed``), the same in every process.

    Raises:
        UnlabeledDataError: fewer than ``mu`` unlabeled images, or images of another shape.
    """

    def __init__(self, labelled: ArrayDataset, unlabeled: np.ndarray, mu: int, seed: int = 0) -> None:
        if len(unlabeled) < mu:
            raise UnlabeledDataError(f"{len(unlabeled)} unlabeled images are fewer than task.fixmatch.mu={mu} for one "
                                     "labelled image; lower mu or add unlabeled images.")
        if unlabeled.shape[1:] != labelled.images.shape[1:]:
            raise UnlabeledDataError(f"unlabeled images of shape {list(unlabeled.shape[1:])} beside labelled ones of "
                                     f"{list(labelled.images.shape[1:])}.")
        self.labelled = torch.from_numpy(labelled.images)
        self.labels = labelled.labels
        self.unlabeled = torch.from_numpy(unlabeled)
        self.mu = mu
        self._passes = torch.Generator().manual_seed(seed)
        self._order = torch.empty(0, dtype=torch.long)

    def __len__(self) -> int:
        return len(self.unlabeled) // self.mu

    def __getitem__(self, index: int) -> Sample:
        return self.__getitems__([index])[0]

    def __getitems__(self, indices: Sequence[int]) -> list[Sample]:
        """The samples of one batch: the labelled images ``indices`` name and ``mu`` unlabeled
        images each, the next of the pass, with their indices."""
        labelled = torch.as_tensor(indices, dtype=torch.long) % len(self.labelled)
        places = self._next(len(indices) * self.mu).unflatten(0, (len(indices), self.mu))
        return list(zip(self.labelled[labelled].unbind(0), self.labels[labelled.numpy()].tolist(),
                        self.unlabeled[places].unbind(0), places.unbind(0)))

    def _next(self, count: int) -> torch.Tensor:
        """The next ``count`` indices of this process's and worker's share of the pass over the
        unlabeled images (the share of a new pass continues it where it runs out)."""
        shard, shards = _shard()
        while len(self._order) < count:
            order = torch.randperm(len(self.unlabeled), generator=self._passes)
            share = order[shard::shards]
            self._order = torch.cat([self._order, share if len(share) else order])  # more shares than images: all
        taken, self._order = self._order[:count], self._order[count:]
        return taken


def _shard() -> tuple[int, int]:
    """This loader worker's place among all the run's workers, and their number: ``(r * W + w,
    R * W)`` for worker ``w`` of ``W`` in process ``r`` of ``R`` (``(0, 1)`` alone)."""
    rank, world = process_place()
    worker = torch.utils.data.get_worker_info()
    workers, index = (1, 0) if worker is None else (worker.num_workers, worker.id)
    return rank * workers + index, world * workers


class FixMatchViews:
    """FixMatch's two views of ``uint8 [B, H, W, C]`` images, normalised ``[B, C, H, W]`` on the
    images' device: :attr:`weak`, the data section's batched augmentation (flip and pad-and-crop),
    and :attr:`strong`, the same flip and crop then :class:`~vitkit.data.randaugment.BatchRandAugment`
    (``strong_ops`` operations and Cutout up to ``cutout`` of the width, filled with the data's mean).

    Args:
        augment: the resolved ``data.augment`` section.
        info: the run's data (size and normalisation).
        strong_ops, cutout: the strong view's RandAugment operations per image and Cutout size.

    Raises:
        ValueError: an augmentation that does not run on whole batches (``random_resized`` crops,
            colour jitter, a timm policy): the views could not be built on the device.
    """

    def __init__(self, augment: AugmentConfig, info: DataInfo, *, strong_ops: int = 3, cutout: float = 0.5) -> None:
        weak = build_batch_transform(augment, info, info.img_size)
        if weak is None:
            raise ValueError(batchable_problem(augment) or f"no batched transform for {augment} at crop_pct {info.crop_pct}")
        self.weak: BatchTransform = weak
        fill = [255.0 * value for value in info.mean]
        self.strong = BatchTransform(info, padding=weak.padding, hflip=weak.hflip,
                                     rand_augment=BatchRandAugment(strong_ops, cutout, fill))

    def __repr__(self) -> str:
        return f"FixMatchViews(weak={self.weak}, strong={self.strong})"


def batchable_problem(augment: AugmentConfig) -> str | None:
    """Why the resolved ``augment`` cannot make FixMatch's views on the device (``None``: it can),
    as the end of a one-line refusal naming the key to change."""
    if augment.enabled and augment.crop == "random_resized":
        return ("data.augment.crop is 'random_resized', which crops each image on the host; use data.augment.crop=pad "
                "(FixMatch's weak view: a flip and a shift) or resize")
    if augment.enabled and augment.color_jitter > 0:
        return ("data.augment.color_jitter runs per image on the host; set it to 0 (the strong view has its own "
                "colour operations)")
    if augment.enabled and augment.rand_augment is not None:
        return ("data.augment.rand_augment runs timm's policy per image on the host; remove it (the strong view has "
                "FixMatch's own)")
    return None
