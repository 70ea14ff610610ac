"""Export a vitkit model to ONNX, with its preprocessing in the file's metadata.

:func:`export_onnx` uses ``torch.onnx.export(..., dynamo=True)``, torch's current exporter (the
TorchScript one is deprecated): it traces the model with ``torch.export`` and writes ONNX through
onnxscript. Every vitkit architecture option exports with it (the distilled model's averaged heads,
the attention-pool head, registers, RoPE, pruned layers of any head count, the convolutional stem,
shifted patches, LSA), with onnxruntime's logits within 1e-4 of vitkit's (``tests/test_export.py``).
Attention exports through SDPA (``scaled_dot_product_attention`` becomes ONNX's ``MatMul``/
``Softmax`` pattern); the kernel chooser's timing is not part of a graph.

The file's ``metadata_props`` hold ``vitkit_preprocessing``: the JSON of the model file's ``extra``
(mean, std, image size, channels, crop_pct, interpolation, class names), so a runtime preprocesses
images as the model was trained.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .errors import VitkitError, require
from .layers import AttentionBase
from .models import VisionTransformer
from .output_dirs import check_output_file, write_output_file

#: The ``metadata_props`` key holding the model's preprocessing (its ``extra``) as JSON.
PREPROCESSING_KEY = "vitkit_preprocessing"
#: The graph's input and output names.
INPUT_NAME, OUTPUT_NAME = "images", "logits"


class ExportError(VitkitError, ValueError):
    """A model, size or option the exporter cannot take."""


def export_onnx(
    model: VisionTransformer,
    path: str | os.PathLike,
    *,
    extra: dict[str, Any] | None = None,
    opset: int | None = None,
    dynamic_batch: bool = True,
    img_size: tuple[int, int] | None = None,
    force: bool = False,
) -> Path:
    """Write ``model``'s forward (``[B, C, H, W]`` images to ``[B, num_classes]`` logits, or the
    pooled features of a model without a classifier) to the ONNX file ``path``, atomically.

    Args:
        model: a vitkit model (eval mode is used; the model is left as it was).
        path: the ``.onnx`` file; an existing one is refused unless ``force``.
        extra: the preprocessing to record (a model file's ``extra``: ``mean``, ``std``, ...).
        opset: ONNX opset (``None``: the exporter's default).
        dynamic_batch: the batch dimension is symbolic (any batch size); else fixed at 1.
        img_size: ``(H, W)`` of the graph's input; default the model's ``img_size``. Another
            size needs ``dynamic_img_size`` and whole patches.

    Raises:
        ExportError: the size does not fit the model, or the exporter refused the model (one line).
        OutputDirError: ``path`` exists and not ``force``, or is a folder.
    """
    onnx = require("onnx", "onnx", "ONNX export")
    require("onnxscript", "onnx", "ONNX export")  # torch's dynamo exporter writes through it
    path = check_output_file(path, "--out", force)
    height, width = img_size if img_size is not None else model.config.img_size
    config = model.config
    if (height, width) != tuple(config.img_size):
        if not config.dynamic_img_size:
            raise ExportError(f"--img-size {height} {width} differs from the model's img_size {list(config.img_size)} and "
                              "the model has no dynamic_img_size; export at its own size.")
        if height % config.patch_size[0] or width % config.patch_size[1]:
            raise ExportError(f"--img-size {height} {width} is not a whole number of {list(config.patch_size)} patches.")
    images = torch.zeros(2 if dynamic_batch else 1, config.in_chans, height, width)
    kernels = {module: module.attn_impl for module in model.modules() if isinstance(module, AttentionBase)}
    was_training = model.training
    try:
        model.eval()
        for module in kernels:
            module.attn_impl = "sdpa"
        with tempfile.TemporaryDirectory(prefix="vitkit-onnx-") as folder, torch.no_grad():
            staged = Path(folder) / "model.onnx"
            try:
                torch.onnx.export(
                    model, (images,), str(staged), dynamo=True, opset_version=opset, input_names=[INPUT_NAME],
                    output_names=[OUTPUT_NAME], dynamic_shapes={"images": {0: "batch"}} if dynamic_batch else None,
                    verbose=False,
                )
            except Exception as error:  # the exporter's errors have no common type
                first = (str(error).strip().splitlines() or [type(error).__name__])[0]
                raise ExportError(f"the ONNX exporter refused this model ({first[:300]}); its config: "
                                  f"{_options(model)}.") from None
            proto = onnx.load(str(staged))
    finally:
        for module, kernel in kernels.items():
            module.attn_impl = kernel
        model.train(was_training)
    entry = proto.metadata_props.add()
    entry.key, entry.value = PREPROCESSING_KEY, json.dumps(extra or {})
    return write_output_file(path, "--out", lambda tmp: onnx.save(proto, tmp), force)


def quantize_dynamic(source: str | os.PathLike, path: str | os.PathLike, *, force: bool = False) -> Path:
    """onnxruntime's dynamic int8 quantisation of ``source``'s ``MatMul``/``Gemm`` weights (the
    linear layers; activations are quantised per batch at run time) written to ``path``, atomically,
    with the same preprocessing metadata."""
    quantization = require("onnxruntime.quantization", "onnx", "int8 quantisation (--quantize)")

    path = check_output_file(path, "--out", force)
    with tempfile.TemporaryDirectory(prefix="vitkit-int8-") as folder:
        staged = Path(folder) / "int8.onnx"
        logging.disable(logging.WARNING)  # its advice to run shape inference first, printed for every model
        try:
            quantization.quantize_dynamic(str(source), str(staged), weight_type=quantization.QuantType.QInt8,
                                          op_types_to_quantize=["MatMul", "Gemm"])
        finally:
            logging.disable(logging.NOTSET)
        data = staged.read_bytes()
    return write_output_file(path, "--out", lambda tmp: Path(tmp).write_bytes(data), force)


def read_preprocessing(path: str | os.PathLike) -> dict[str, Any]:
    """The preprocessing (:data:`PREPROCESSING_KEY`) an exported file records; ``{}`` without it."""
    onnx = require("onnx", "onnx", "reading an .onnx file")
    proto = onnx.load(str(path), load_external_data=False)
    values = {entry.key: entry.value for entry in proto.metadata_props}
    return json.loads(values.get(PREPROCESSING_KEY, "{}"))


class OnnxClassifier:
    """An exported model run by onnxruntime (CPU): called like the model, ``[B, C, H, W]`` float32
    images to ``[B, num_classes]`` logits; a graph of fixed batch 1 is run image by image.

    Attributes:
        extra: the preprocessing the file records (:func:`read_preprocessing`).
        num_classes: the width of the graph's output.
    """

    def __init__(self, path: str | os.PathLike) -> None:
        onnxruntime = require("onnxruntime", "onnx", "running an .onnx file")
        self.path = Path(path)
        self.session = onnxruntime.InferenceSession(str(self.path), providers=["CPUExecutionProvider"])
        (graph_input,), (output,) = self.session.get_inputs(), self.session.get_outputs()
        self.input_name = graph_input.name
        self.fixed_batch = isinstance(graph_input.shape[0], int)
        self.num_classes = int(output.shape[-1])
        self.extra = read_preprocessing(self.path)

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        batches = images.split(1) if self.fixed_batch else (images,)
        outputs = [self.session.run(None, {self.input_name: b.float().contiguous().numpy()})[0] for b in batches]
        return torch.from_numpy(np.concatenate(outputs))


def _options(model: VisionTransformer) -> str:
    """The config fields that differ from the defaults, for an error message."""
    defaults = type(model.config)().to_dict()
    changed = {k: v for k, v in model.config.to_dict().items() if defaults.get(k) != v}
    return ", ".join(f"{k}={v}" for k, v in sorted(changed.items()))[:400]
