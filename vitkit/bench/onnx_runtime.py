"""vitkit eager (float32, bf16 autocast) against onnxruntime (float32, dynamic int8), images per
second at each batch size, and, for a trained model file, the top-1 of each runtime."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..io import load_model_and_extra
from ..models import VisionTransformer, create_model, merge_tokens
from ..timing import interleaved_times
from .steps import MergeTokens

#: The onnx section's models without ``--onnx-model`` (random weights): the Fashion-MNIST fast
#: recipe's architecture, and ViT-S/16 at 224 px.
ONNX_MODELS = {
    "Fashion-MNIST fast's ViT (conv stem, 4 blocks, 128 wide, 32 px)": dict(
        name="vit_cifar_tiny", img_size=32, in_chans=1, num_classes=10, patch_size=8, patch_embed="conv",
        embed_dim=128, depth=4, num_heads=4, locality=True),
    "ViT-S/16 (224 px)": dict(name="vit_small_patch16_224", num_classes=1000),
}


def bench_onnx(repeats: int, model_file: str | None = None, batches: tuple[int, ...] = (1, 64),
               models: dict[str, dict[str, Any]] | None = None, merge: MergeTokens | None = None) -> list[str]:
    """Images/s of vitkit eager (float32, bf16 autocast) and onnxruntime (float32, dynamic int8) at
    each batch size, interleaved per model: ``model_file`` alone (a trained model, named by its file
    and shape, with the top-1 of each runtime on the images ``vitkit evaluate`` scores, as it scores
    them), else ``models`` (:data:`ONNX_MODELS`: random weights, speed only); with ``merge``, every
    model merges tokens (:func:`vitkit.merge_tokens`)."""
    import tempfile

    from ..export import OnnxClassifier, export_onnx, quantize_dynamic

    rows = [f"onnxruntime {_ort_version()}, {torch.get_num_threads()} threads", "",
            "| model | batch | vitkit fp32 | vitkit bf16 | onnxruntime fp32 | onnxruntime int8 | int8 / vitkit fp32 |",
            "|---|---|---|---|---|---|---|"]
    accuracy_rows: list[str] = []
    with tempfile.TemporaryDirectory(prefix="vitkit-onnx-bench-") as folder:
        for label, (model, extra) in _onnx_models(model_file, models, merge):
            float_path = export_onnx(model, Path(folder) / f"{len(rows)}.onnx", extra=extra)
            int8_path = quantize_dynamic(float_path, Path(folder) / f"{len(rows)}-int8.onnx")
            runners = {"onnxruntime fp32": OnnxClassifier(float_path), "onnxruntime int8": OnnxClassifier(int8_path)}
            for batch in batches:
                images = torch.randn(batch, model.config.in_chans, *model.config.img_size)

                calls = {"vitkit fp32": _eager(model, images, False), "vitkit bf16": _eager(model, images, True),
                         **{name: (lambda r=runner, x=images: r(x)) for name, runner in runners.items()}}
                times = interleaved_times(calls, repeats=repeats, warmup=1)
                rate = {name: batch / statistics.median(seconds) for name, seconds in times.items()}
                rows.append(f"| {label} | {batch} | " + " | ".join(f"{rate[name]:,.0f}" for name in calls)
                            + f" | {rate['onnxruntime int8'] / rate['vitkit fp32']:.2f} |")
            if model_file is not None:
                accuracy_rows = _onnx_accuracy(model, extra, model_file, runners)
    return rows + ["", "images/s, median of interleaved rounds"] + accuracy_rows


def _onnx_models(model_file: str | None, models: dict[str, dict[str, Any]] | None, merge: MergeTokens | None
                 ) -> Iterator[tuple[str, tuple[VisionTransformer, dict[str, Any]]]]:
    """``(label, (model in eval mode, its metadata))`` of what the onnx section times: the model
    of ``model_file`` alone, named by its file and shape, else each of ``models`` (random weights)."""
    if model_file is not None:
        model, extra = load_model_and_extra(model_file)
        config = model.config
        height, width = config.img_size
        shape = f"{config.depth} blocks, {config.embed_dim} wide, {height}x{width} px, {config.num_classes} classes"
        models_built = [(f"{Path(model_file).name} ({shape})", (model, extra))]
    else:
        models_built = [(label, (create_model(**spec), {}))
                        for label, spec in (models if models is not None else ONNX_MODELS).items()]
    for label, (model, extra) in models_built:
        model.eval()
        if merge is not None:
            merge_tokens(model, *merge)
        yield label, (model, extra)


def _eager(model: nn.Module, images: torch.Tensor, bf16: bool) -> Callable[[], None]:
    """One inference-mode forward of ``model`` on ``images``, float32 or under bf16 autocast."""
    def step() -> None:
        with torch.inference_mode(), torch.autocast("cpu", torch.bfloat16, enabled=bf16):
            model(images)

    return step


def _onnx_accuracy(model: nn.Module, extra: dict[str, Any], model_file: str,
                   runners: dict[str, Callable[[torch.Tensor], torch.Tensor]]) -> list[str]:
    """Top-1 of vitkit float32 and each onnxruntime graph on what ``vitkit evaluate MODEL_FILE``
    scores, as it scores it: its test split and the test-time augmentation the file records
    (:func:`vitkit.train.eval_report.evaluation_data`, :func:`vitkit.evaluation.evaluate_model`)."""
    from torch.utils.data import DataLoader

    from ..evaluation import black_level, evaluate_model, recorded_tta
    from ..train.eval_report import evaluation_data

    dataset, info, _ = evaluation_data(model, extra)
    tta, loader = recorded_tta(extra, model_file), DataLoader(dataset, batch_size=256)
    top1 = {name: evaluate_model(run, loader, tta=tta, fill=black_level(info.mean, info.std)).top1
            for name, run in (("vitkit fp32", model), *runners.items())}
    views = "" if tta == "none" else f", {tta} views averaged as vitkit evaluate does"
    return ["", f"| test accuracy ({len(dataset):,} images{views}) | " + " | ".join(top1) + " |",
            "|---|" + "---|" * len(top1),
            "| top-1 | " + " | ".join(f"{value:.2f}%" for value in top1.values()) + " |"]


def _ort_version() -> str:
    from ..errors import require

    return require("onnxruntime", "onnx", "the onnx section").__version__
