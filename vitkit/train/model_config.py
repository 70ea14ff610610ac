"""The recipe's ``model`` section (:class:`ModelConfig`): which variant to build, from which
weights, how to fine-tune it, and the :class:`~vitkit.models.ViTConfig` fields it overrides."""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Any, Literal

from ..layers import LoraConfig
from ..models import ViTConfig
from ..models.config import MAX_DEPTH
from ..schema import Config, FieldError
from .freezing import check_freeze

#: ViTConfig fields set from the dataset rather than the recipe.
DATA_DRIVEN_FIELDS = ("img_size", "in_chans", "num_classes")
#: ModelConfig fields that choose the model rather than override a ViTConfig field.
MODEL_CHOICE_FIELDS = (
    "name", "grad_checkpointing", "impl", "pretrained", "pretrained_file", "pretrained_kwargs", "reset_head", "freeze",
    "lora", "pretrained_weights", "fit_to_images",
)
#: The variant a recipe without ``model.name`` or ``model.pretrained`` builds.
DEFAULT_VARIANT = "vit_cifar_tiny"

ModelImpl = Literal["vitkit", "timm"]


@dataclass
class _ModelChoice(Config):
    name: str | None = None
    grad_checkpointing: bool = False
    impl: ModelImpl = "vitkit"
    pretrained: str | None = None
    pretrained_file: str | None = None
    pretrained_kwargs: dict[str, Any] = field(default_factory=dict)
    reset_head: bool | None = None
    freeze: str = "none"
    lora: LoraConfig | None = None
    pretrained_weights: bool = True
    fit_to_images: bool = False

    def validate(self) -> None:
        """``pretrained_file`` and ``pretrained_kwargs`` come with a timm name, ``reset_head`` with
        weights; the files themselves are read by :func:`~vitkit.train.model_builder.load_starting_weights`
        (a resumed run reads its checkpoint instead). ``freeze`` is checked against the depth when
        the model is built."""
        check_freeze(self.freeze, MAX_DEPTH)
        if self.lora is not None and self.freeze not in ("none", "backbone"):
            raise FieldError(
                "freeze", f"is {self.freeze!r}, but with model.lora every weight but the adapters and the classifier is "
                "frozen already: leave model.freeze unset.",
            )
        if self.pretrained is not None and self.fit_to_images:
            raise FieldError("fit_to_images", "sizes a new encoder to the images, but model.pretrained fixes the model: "
                             "remove one of them.")
        if not self.pretrained_weights and (self.freeze != "none" or self.lora is not None):
            raise FieldError("pretrained_weights", "is false (fresh weights), so model.freeze / model.lora would hold "
                             "random weights still: remove them for the from-scratch baseline.")
        if self.pretrained is None:
            given = [key for key in ("pretrained_file", "pretrained_kwargs", "reset_head") if getattr(self, key) not in (None, {})]
            given += ["pretrained_weights"] if not self.pretrained_weights else []
            if given:  # model.freeze alone: RecipeConfig.validate, once a pre-training task has refused it
                key = given[0]
                raise FieldError(key, "only applies to pretrained weights: set model.pretrained too (a model file or timm:NAME).")
            return
        if self.pretrained.startswith("timm:"):
            reserved = {"pretrained", "num_classes", "pretrained_cfg_overlay"} & set(self.pretrained_kwargs)
            if reserved:
                raise FieldError(
                    "pretrained_kwargs", f"may not set {', '.join(sorted(reserved))}: the weights and the data decide them."
                )
            return
        if self.pretrained_file is not None or self.pretrained_kwargs:
            raise FieldError(
                "pretrained_file" if self.pretrained_file is not None else "pretrained_kwargs",
                f"belongs to a timm model, but model.pretrained={self.pretrained!r} names no timm model: give "
                "model.pretrained=timm:<timm model name>, or model.pretrained=<a vitkit model file> alone.",
            )

    @property
    def variant(self) -> str:
        """The variant to build from scratch: ``name``, or :data:`DEFAULT_VARIANT`."""
        return self.name or DEFAULT_VARIANT

    def vit_overrides(self) -> dict[str, Any]:
        """The ViTConfig fields this recipe sets."""
        return {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if f.name not in MODEL_CHOICE_FIELDS and getattr(self, f.name) is not None
        }


def _vit_overrides_fields() -> list[tuple[str, Any, Any]]:
    """Every recipe-settable :class:`ViTConfig` field, optional: its type ``| None``, default ``None``."""
    hints = typing.get_type_hints(ViTConfig)
    return [
        (f.name, hints[f.name] | None, field(default=None))
        for f in dataclasses.fields(ViTConfig)
        if f.name not in DATA_DRIVEN_FIELDS
    ]


ModelConfig = dataclasses.make_dataclass("ModelConfig", _vit_overrides_fields(), bases=(_ModelChoice,))
ModelConfig.__module__ = __name__
ModelConfig.__doc__ = """Which variant to build, how, and the :class:`ViTConfig` fields to override.

    Attributes:
        name: a variant of :func:`vitkit.list_models` (``None``: ``vit_cifar_tiny``, or with
            ``pretrained`` the weights' own architecture).
        grad_checkpointing: recompute block activations in the backward pass (less memory).
        impl: ``'vitkit'``, or ``'timm'`` to train timm's ``VisionTransformer`` of the same shape
            as a reference.
        pretrained: weights to start from (fine-tuning): a vitkit model file or training checkpoint
            (``model.safetensors``, ``checkpoints/best.ckpt``, a pruned model), or ``timm:NAME``
            (``timm:deit_small_patch16_224``; a tag such as ``.augreg_in21k`` selects timm's
            ``pretrained_cfg``). The weights fix the architecture (see
            :mod:`vitkit.train.model_builder`).
        pretrained_file: the timm model's weights on disk (a state dict as ``.safetensors``, or a
            ``.pth``/``.bin`` read with ``weights_only``); without it timm downloads them.
        pretrained_kwargs: more ``timm.create_model`` arguments of that timm model (timm's
            ``--model-kwargs``), for weights of a model built with them (``{depth: 6}``).
        reset_head: re-initialise the classifier (``None``: when the data's class count differs
            from the weights').
        freeze: ``'none'``, ``'backbone'`` (a linear probe: only ``head``, ``head_dist`` and
            ``fc_norm`` train) or ``'blocks:N'`` (the embeddings and the first N blocks stay as
            loaded); frozen parameters get no gradient, optimiser state or weight decay
            (:mod:`vitkit.train.freezing`).
        lora: low-rank adapters (:class:`~vitkit.layers.LoraConfig`: ``rank``, ``alpha``,
            ``dropout``, ``targets``); the adapters and the classifier train, every other weight
            stays as loaded, and the exported model has the adapters merged into its weights.
        pretrained_weights: ``false`` builds ``pretrained``'s architecture and preprocessing with
            fresh weights: the from-scratch baseline of a fine-tuning run, the same model.
        fit_to_images: an image-folder recipe's image size and encoder keys left unset come from the
            images' size (:mod:`vitkit.train.sizing`; the ``*_imagefolder`` pre-training recipes).

    Every other field is generated from the :class:`ViTConfig` field of the same name (except the
    data-driven ``img_size``, ``in_chans`` and ``num_classes``), typed ``ViTConfig``'s type or
    ``None``; ``None`` keeps the variant's value. Their ranges are ViTConfig's, checked when
    :func:`load_recipe` builds the model's config.
    """
