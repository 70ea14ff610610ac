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
from .files import path_kind
from .io import ModelFileError, first_line, metadata_object
from .layers import AttentionBase
from .model_extra import check_extra
from .models import VisionTransformer, ViTConfig
from .output_dirs import check_output_file, write_output_file
from .schema import ConfigError

#: The ``metadata_props`` key holding the model's preprocessing (its ``extra``) as JSON.
PREPROCESSING_KEY = "vitkit_preprocessing"
#: The graph's input and output names; a model without a classifier outputs ``features``.
INPUT_NAME, OUTPUT_NAME, FEATURES_NAME = "images", "logits", "features"
#: The oldest opset torch's exporter writes itself (older ones only through a converter that
#: cannot convert LayerNormalization, and then it silently keeps 18); the newest is torch's
#: ``ONNX_MAX_OPSET``.
MIN_OPSET = 18


class ExportError(VitkitError, ValueError):
    """A model, size or option the exporter cannot take."""


class OnnxFileError(ModelFileError):
    """An ``.onnx`` file that is not a graph vitkit exported, or whose metadata is damaged."""


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
        opset: ONNX opset, :data:`MIN_OPSET` to torch's newest (``None``: the exporter's default);
            the file is refused unless it holds that opset.
        dynamic_batch: the batch dimension is symbolic (any batch size); else fixed at 1.
        img_size: ``(H, W)`` of the graph's input; default the model's ``img_size``. Another
            size needs ``dynamic_img_size``, whole patches and the model's token limit.

    The output is named ``logits``, or ``features`` for a model without a classifier.

    Raises:
        ExportError: the size or opset does not fit, or the exporter refused the model (one line).
        OutputDirError: ``path`` exists and not ``force``, or is a folder.
    """
    onnx = require("onnx", "onnx", "ONNX export")
    require("onnxscript", "onnx", "ONNX export")  # torch's dynamo exporter writes through it
    from torch.onnx._constants import ONNX_MAX_OPSET

    path = check_output_file(path, "--out", force)
    if opset is not None and not MIN_OPSET <= opset <= ONNX_MAX_OPSET:
        raise ExportError(f"--opset {opset}: torch's exporter writes opsets {MIN_OPSET} to {ONNX_MAX_OPSET}; choose one "
                          "of them (or leave --opset out for its default).")
    height, width = img_size if img_size is not None else model.config.img_size
    config = model.config
    if (height, width) != tuple(config.img_size):
        if not config.dynamic_img_size:
            raise ExportError(f"--img-size {height} {width} differs from the model's img_size {list(config.img_size)} and "
                              "the model has no dynamic_img_size; export at its own size.")
        if height % config.patch_size[0] or width % config.patch_size[1]:
            raise ExportError(f"--img-size {height} {width} is not a whole number of {list(config.patch_size)} patches.")
        try:  # the model's own bounds (the token limit), before a graph of a million patches is traced
            config.replace(img_size=(height, width))
        except ConfigError as error:
            raise ExportError(f"--img-size {height} {width} does not fit the model: {error}") from None
    output = OUTPUT_NAME if config.num_classes else FEATURES_NAME
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
                    output_names=[output], dynamic_shapes={"images": {0: "batch"}} if dynamic_batch else None,
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
    written = next((entry.version for entry in proto.opset_import if entry.domain in ("", "ai.onnx")), None)
    if opset is not None and written != opset:  # the exporter falls back to another opset with a warning only
        raise ExportError(f"--opset {opset}: torch's exporter wrote opset {written} instead; choose --opset {written}.")
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
    """The preprocessing (:data:`PREPROCESSING_KEY`) an exported file records, as written
    (:class:`OnnxClassifier` checks it against its graph); ``{}`` without it.

    Raises:
        OnnxFileError: the file is not ONNX, or the metadata is not a JSON object.
    """
    onnx = require("onnx", "onnx", "reading an .onnx file")
    try:
        proto = onnx.load(str(path), load_external_data=False)
    except Exception as error:  # protobuf's DecodeError, OSError: no common type
        raise OnnxFileError(f"{path} is not a readable ONNX file ({first_line(error)[:300]}).") from None
    values = {entry.key: entry.value for entry in proto.metadata_props}
    return metadata_object(values.get(PREPROCESSING_KEY, "{}"), PREPROCESSING_KEY, Path(path))


class OnnxClassifier:
    """An exported model run by onnxruntime (CPU): called like the model, ``[B, C, H, W]`` float32
    images to ``[B, num_classes]`` logits; a graph of fixed batch 1 is run image by image.

    The file is checked as a model file is before anything runs: one input ``[B, C, H, W]`` of a
    size vitkit takes, one output, and metadata that passes :func:`~vitkit.model_extra.check_extra` against
    them (one class name per output, one mean/std per channel, the graph's own image size).

    Attributes:
        extra: the preprocessing the file records, checked.
        num_classes: the width of the graph's output (0 for an exported feature extractor).

    Raises:
        OnnxFileError: missing, a folder, not ONNX, not a graph of one image input and one output,
            or damaged metadata; one line naming the file.
    """

    def __init__(self, path: str | os.PathLike, num_threads: int | None = None) -> None:
        """``num_threads``: onnxruntime's intra-op threads (``None``: its default, one per physical core)."""
        onnxruntime = require("onnxruntime", "onnx", "running an .onnx file")
        self.path = Path(path)
        if not self.path.is_file():
            raise OnnxFileError(f"ONNX model {self.path} {path_kind(self.path)}; give the .onnx file vitkit export wrote.")
        try:
            options = onnxruntime.SessionOptions()
            if num_threads is not None:
                options.intra_op_num_threads, options.inter_op_num_threads = num_threads, 1
            self.session = onnxruntime.InferenceSession(str(self.path), options, providers=["CPUExecutionProvider"])
        except Exception as error:  # onnxruntime's InvalidProtobuf, Fail, ...: no common type
            raise OnnxFileError(
                f"{self.path} is not a readable ONNX model ({first_line(error)[:300]}); the file is damaged or was not "
                "written by vitkit export."
            ) from None
        inputs, outputs = self.session.get_inputs(), self.session.get_outputs()
        if len(inputs) != 1 or len(outputs) != 1 or len(inputs[0].shape) != 4:
            raise OnnxFileError(
                f"{self.path} has {len(inputs)} input(s) and {len(outputs)} output(s); vitkit runs graphs of one "
                "[B, C, H, W] image input and one output, as vitkit export writes."
            )
        (graph_input,), (output,) = inputs, outputs
        self.input_name = graph_input.name
        self.fixed_batch = isinstance(graph_input.shape[0], int)
        config = self._config(graph_input.shape[1:], output)
        self.num_classes = config.num_classes
        text = self.session.get_modelmeta().custom_metadata_map.get(PREPROCESSING_KEY, "{}")
        self.extra = check_extra(metadata_object(text, PREPROCESSING_KEY, self.path), config,
                                 f"the metadata of {self.path}", OnnxFileError)

    def _config(self, image_dims: list[Any], output: Any) -> ViTConfig:
        """A stand-in config of the graph's input and output (one patch the image's size), for
        :func:`~vitkit.model_extra.check_extra`: bounds the image size before any image is resized."""
        classes = 0 if output.name == FEATURES_NAME else output.shape[-1] if output.shape else None
        if not all(isinstance(dim, int) for dim in (*image_dims, classes)):
            raise OnnxFileError(f"{self.path}: its input {image_dims} or output {output.shape} has symbolic sizes "
                                "other than the batch; vitkit export fixes channels, image size and classes.")
        channels, height, width = image_dims
        try:
            return ViTConfig(img_size=(height, width), patch_size=(height, width), in_chans=channels,
                             num_classes=classes, embed_dim=1, depth=1, num_heads=1)
        except ConfigError as error:
            raise OnnxFileError(f"{self.path}: its input [B, {channels}, {height}, {width}] with {classes} outputs is "
                                f"not a model vitkit runs ({error})") from None

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        batches = images.split(1) if self.fixed_batch else (images,)
        try:
            outputs = [self.session.run(None, {self.input_name: b.float().contiguous().numpy()})[0] for b in batches]
        except Exception as error:  # onnxruntime's run-time errors: no common type
            raise OnnxFileError(f"{self.path} failed when run by onnxruntime ({first_line(error)[:300]}); the graph is "
                                "damaged or was not written by vitkit export.") from None
        return torch.from_numpy(np.concatenate(outputs))


def _options(model: VisionTransformer) -> str:
    """The config fields that differ from the defaults, for an error message."""
    defaults = type(model.config)().to_dict()
    changed = {k: v for k, v in model.config.to_dict().items() if defaults.get(k) != v}
    return ", ".join(f"{k}={v}" for k, v in sorted(changed.items()))[:400]
