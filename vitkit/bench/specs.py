"""Model specs as the benchmarks take them: ``NAME:BATCH`` or ``NAME:BATCH:key=value,...``."""

from __future__ import annotations

#: A parsed spec: the model's name, the batch size, and ``ViTConfig`` overrides.
ModelSpec = tuple[str, int, dict[str, int | float | bool | str]]


def parse_model_spec(spec: str) -> ModelSpec:
    """``"NAME:BATCH"`` or ``"NAME:BATCH:key=value,..."``: ``ViTConfig`` overrides, each an integer,
    a number, true/false or a word (``vit_small_patch16_224:128:img_size=32,patch_size=4`` or
    ``vit_cifar_tiny:128:patch_embed=conv,mlp_ratio=2.0``); :class:`~vitkit.models.ViTConfig`
    checks them when the model is built.

    Raises:
        ValueError: no ``NAME:BATCH``, a batch that is no whole number, or an item without ``=``.
    """
    name, batch_size, *rest = spec.split(":")
    pairs = [item.split("=") for item in rest[0].split(",")] if rest else []
    if len(rest) > 1 or any(len(pair) != 2 or not pair[0] for pair in pairs):
        raise ValueError(f"expected key=value items after NAME:BATCH:, got {spec!r}")
    return name, int(batch_size), {key: _spec_value(value) for key, value in pairs}


def _spec_value(text: str) -> int | float | bool | str:
    """A model spec's value: true/false, an integer, a number, else the word itself."""
    if text in ("true", "false"):
        return text == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text
