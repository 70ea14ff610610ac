"""vitkit against timm on this machine, and where a training step's time goes: the measurements
behind ``vitkit benchmark`` (a thin command over them) and the scripts of ``dev/``.

- :mod:`~vitkit.bench.steps`: the timed closures (one forward, one AdamW step) and their FLOPs;
- :mod:`~vitkit.bench.gemm`: this machine's GEMM peak at a model's own shapes;
- :mod:`~vitkit.bench.models`: models and levers tables (vitkit vs timm, changes to the bf16 step);
- :mod:`~vitkit.bench.ops`: single operators (attention kernels, linear layers under autocast);
- :mod:`~vitkit.bench.memory`: a training step's resident memory, measured in fresh processes;
- :mod:`~vitkit.bench.data`: the input pipeline alone, and image-folder loaders against timm's;
- :mod:`~vitkit.bench.onnx_runtime`: vitkit eager against onnxruntime;
- :mod:`~vitkit.bench.specs`: ``NAME:BATCH[:key=value,...]`` model specs.

The timing itself (interleaved rounds, medians) is :mod:`vitkit.timing`. This package imports
nothing at import time, so the command line can read a spec without loading torch.
"""
