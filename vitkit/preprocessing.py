"""How a model's weights see images, as metadata: the eval preprocessing part of a timm
``pretrained_cfg`` and the ``extra`` settings that ``vitkit.save_model`` writes and
``vitkit.data.DataInfo`` reads. A data concept with no model in it (timm's ``data/config.py``
imports no model module either), so the model files (``io``), the timm converter (``models``) and
``data`` all read it from here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from timm.data import DEFAULT_CROP_PCT

#: A resampling filter of the eval resize (timm's ``interpolation`` values).
Interpolation = Literal["nearest", "bilinear", "bicubic", "area", "lanczos"]
#: How the eval transform fits an image to its size (timm's ``crop_mode`` values).
EvalCropMode = Literal["center", "squash", "border"]

#: The keys of a timm ``pretrained_cfg`` that say how its weights see images (and which weights).
PREPROCESSING_KEYS = ("architecture", "tag", "input_size", "interpolation", "crop_pct", "crop_mode", "mean", "std")


def preprocessing_extra(
    cfg: dict[str, Any], num_classes: int, class_names: Sequence[str] | None = None
) -> dict[str, Any]:
    """The eval preprocessing that a timm ``pretrained_cfg`` (``model.pretrained_cfg``, or
    ``timm.get_pretrained_cfg(name).to_dict()``: ``input_size`` ``(C, H, W)``, ``mean``, ``std``,
    ``crop_pct``, ``crop_mode``, ``interpolation``) describes, as the ``extra`` metadata that
    ``vitkit.save_model`` writes and ``vitkit.data.DataInfo.from_extra`` reads (JSON types); timm's
    defaults where ``cfg`` has no value, classes named by index unless ``class_names`` are given."""
    in_chans, height, width = cfg["input_size"]
    return {
        "mean": [float(m) for m in cfg["mean"]],
        "std": [float(s) for s in cfg["std"]],
        "img_size": [int(height), int(width)],
        "in_chans": int(in_chans),
        "class_names": list(class_names or (f"class {i}" for i in range(num_classes))),
        "dataset": str(cfg.get("architecture") or "timm"),
        "crop_pct": float(DEFAULT_CROP_PCT if cfg.get("crop_pct") is None else cfg["crop_pct"]),  # 0 stays 0: refused
        "crop_mode": str(cfg.get("crop_mode") or "center"),
        "interpolation": str(cfg.get("interpolation") or "bilinear"),
    }
