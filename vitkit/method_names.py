"""The registry of vitkit's explanation methods: their names, what each needs, and how figures and
the explorer title it. Every other place reads them from here: :mod:`vitkit.explain` (maps,
faithfulness, localisation, the explorer), the ``vitkit maps``, ``faithfulness`` and ``localize``
commands and their option choices. It imports nothing, so that ``vitkit <command> --help`` offers
the names without loading torch.
"""

from __future__ import annotations

from typing import Literal, get_args

#: The maps of :func:`vitkit.explain.explain`: four explain a prediction, ``heads`` is the raw
#: per-head attention of one block.
Method = Literal["rollout", "grad_rollout", "chefer", "lrp", "heads"]
METHODS: tuple[str, ...] = get_args(Method)
#: Methods that need the gradients of the target logit with respect to the attention.
GRADIENT_METHODS: tuple[str, ...] = ("grad_rollout", "chefer")
#: Methods that explain one class's logit (none for a model without a classifier).
CLASS_METHODS: tuple[str, ...] = (*GRADIENT_METHODS, "lrp")
#: The maps that explain a prediction with one relevance per patch (all but the per-head grids).
MAP_METHODS: tuple[str, ...] = tuple(method for method in METHODS if method != "heads")
#: The methods measured side by side by :func:`vitkit.explain.faithfulness`: the maps, Integrated
#: Gradients summed per patch, the last attended layer's class-token attention averaged over heads
#: (``attention``) and a uniformly random ranking (``random``).
BUILTIN_METHODS: tuple[str, ...] = (*MAP_METHODS, "integrated_gradients", "attention", "random")
#: How figures, the explorer and reports title each map.
LABELS: dict[str, str] = {
    "rollout": "attention rollout",
    "grad_rollout": "grad rollout",
    "chefer": "Chefer et al.",
    "lrp": "AttnLRP",
    "heads": "per-head attention",
}
