"""Datasets, splits and augmentation: CIFAR-10/100, (Fashion-)MNIST, ImageNet-style folders, and two offline
datasets (scikit-learn's handwritten digits, generated shapes with bounding boxes)."""

from . import _albumentations  # noqa: F401  (first: albumentations without its update check)
from .arrays import ArrayDataset, stratified_split
from .build import (
    FolderSample,
    build_datasets,
    data_info,
    folder_sample,
    labelled_folder_halves,
    settle_unset,
    unaugmented,
)
from .cifar import CifarFileError
from .config import DATASET_NAMES, AugmentConfig, DataConfig
from .imagefolder import ImageFolderDataset, ImageFolderError
from .images import ImageReadError, load_image
from .info import DataFileError, DataInfo, DatasetBundle
from .mnist import IdxFileError
from .model_data import DataMismatchError, check_model_fits, data_config_for, datasets_for
from .shapes import SHAPE_CLASSES, ShapesDataset, generate_shapes, shapes_info
from .subset import SubsetError, make_subset
from .transforms import build_eval_transform, build_train_transform, denormalize, display_image

__all__ = [
    "DATASET_NAMES",
    "SHAPE_CLASSES",
    "ArrayDataset",
    "AugmentConfig",
    "CifarFileError",
    "DataFileError",
    "DataConfig",
    "DataInfo",
    "DataMismatchError",
    "DatasetBundle",
    "ImageFolderDataset",
    "ImageFolderError",
    "IdxFileError",
    "FolderSample",
    "ImageReadError",
    "ShapesDataset",
    "SubsetError",
    "build_datasets",
    "build_eval_transform",
    "build_train_transform",
    "check_model_fits",
    "data_config_for",
    "data_info",
    "datasets_for",
    "denormalize",
    "display_image",
    "folder_sample",
    "generate_shapes",
    "labelled_folder_halves",
    "load_image",
    "make_subset",
    "settle_unset",
    "shapes_info",
    "stratified_split",
    "unaugmented",
]
