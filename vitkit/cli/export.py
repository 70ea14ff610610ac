"""Export a trained model to ONNX, with its preprocessing in the file's metadata.

    vitkit export runs/quickstart/latest/model.safetensors --format onnx --out quickstart.onnx
    vitkit export --model vit_small_patch16_224 --timm-weights vit_s.safetensors --out vit_s.onnx --opset 18

The graph maps [B, C, H, W] images (normalised as for training) to [B, num_classes] logits; its
metadata "vitkit_preprocessing" holds the model file's mean, std, image size, crop and class names.
torch's dynamo exporter writes it (vitkit.export_onnx), attention through SDPA. The batch size
is symbolic, as in timm's onnx_export.py (--no-dynamic-batch: fixed at 1); --img-size exports another
input size of a model built with dynamic_img_size (within its token limit). --opset takes 18 to torch's
newest. --quantize dynamic writes int8 weights for the linear layers (onnxruntime's dynamic
quantisation; docs/deploy.md has its accuracy and speed). An existing --out file is refused unless
--force, the model file and --timm-weights even then; the file is written atomically.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from .commands import run_command
from .explain_io import load_model_from_arguments, model_inputs


def main(argv: list[str] | None = None) -> int:
    """``vitkit export`` in this process (tests)."""
    return run_command("export", run, argv)


def run(args: argparse.Namespace) -> int:
    import tempfile

    from vitkit.export import export_onnx, quantize_dynamic
    from vitkit.output_dirs import check_output_file

    check_output_file(args.out, "--out", args.force, inputs=model_inputs(args))  # before the model is loaded
    model, extra = load_model_from_arguments(args)
    options = dict(extra=extra, opset=args.opset, dynamic_batch=args.dynamic_batch,
                   img_size=tuple(args.img_size) if args.img_size else None)
    if args.quantize == "dynamic":  # float32 graph first, then int8 weights for its linear layers
        with tempfile.TemporaryDirectory(prefix="vitkit-export-") as folder:
            float_graph = export_onnx(model, Path(folder) / "float32.onnx", **options)
            path = quantize_dynamic(float_graph, args.out, force=args.force)
    else:
        path = export_onnx(model, args.out, force=args.force, **options)
    size = Path(path).stat().st_size
    height, width = args.img_size or model.config.img_size
    print(f"wrote {path} ({size / 1e6:.1f} MB, input images [{'B' if args.dynamic_batch else 1}, "
          f"{model.config.in_chans}, {height}, {width}] -> {'logits' if model.config.num_classes else 'features'})")
    print(f"next: vitkit predict {path} IMAGE_OR_FOLDER   (onnxruntime, the model's preprocessing; "
          f"vitkit evaluate {path} FOLDER for the accuracy on FOLDER/<class>/*)")
    return 0
