"""The recipe's ``task.dino`` section (:class:`DinoOptions`): DINO's defaults, ranges and the
checks its crops and head need of the model, written once for :class:`~vitkit.tasks.DinoTask`."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..models import ViTConfig
from ..models.config import MAX_PARAMETERS, MAX_TOKENS
from ..schema import Config, FieldError, bounds

#: The lowest softmax temperature of DINO. The head's logits lie in [-1, 1] (an L2-normalised
#: feature through a last layer of unit-norm rows, as ``norm_last_layer`` keeps them and as they
#: start otherwise), so at 1e-3 they are at most 1,000 after division: finite in float16, and 40x
#: sharper than the paper's sharpest (0.04). Far below it 1/temperature overflows (1e-45 gives inf)
#: and the first loss is NaN.
MIN_TEMPERATURE = 1e-3
#: Epoch counts' upper bound (the trainer's).
MAX_EPOCHS = 1_000_000


def head_weights(in_dim: int, out_dim: int, *, hidden_dim: int, bottleneck_dim: int, layers: int) -> int:
    """Parameters of a :class:`~vitkit.tasks.DinoHead` (the MLP's weights and biases, the last
    layer's directions and norms), counted before it is built."""
    widths = [in_dim, *[hidden_dim] * (max(layers, 1) - 1), bottleneck_dim]
    mlp = sum((width_in + 1) * width_out for width_in, width_out in zip(widths[:-1], widths[1:]))
    return mlp + (bottleneck_dim + 1) * out_dim


def side(size: tuple[int, int]) -> str:
    """A ``(height, width)`` as a refusal names it: ``16`` when square, ``16x8`` otherwise."""
    return str(size[0]) if size[0] == size[1] else f"{size[0]}x{size[1]}"


@dataclass
class DinoOptions(Config):
    """DINO self-distillation (Caron et al. 2021, arXiv 2104.14294); defaults are
    facebookresearch/dino's, except the head's sizes and the crops' (small images).

    Attributes:
        out_dim: the head's output dimension (the paper's 65536 for ImageNet).
        hidden_dim, bottleneck_dim, head_layers: the head's MLP (DINO's 2048, 256, 3).
        norm_last_layer: the head's last layer keeps weight norms of 1.
        teacher_momentum: the teacher's EMA momentum at the first step, raised to 1 on a cosine.
        student_temp: the student's temperature (every temperature at least :data:`MIN_TEMPERATURE`).
        teacher_temp: the teacher's temperature after its warm-up (0.04 to 0.07 work in the paper).
        warmup_teacher_temp, warmup_teacher_temp_epochs: its temperature at the start and the
            epochs of the linear warm-up (0: none).
        center_momentum: the EMA momentum of the teacher outputs' centre.
        freeze_last_layer_epochs: epochs in which the head's last layer does not learn.
        local_crops: local crops per image (besides the 2 global ones; 0: global crops only).
        global_size, local_size: sides of the crops in pixels (``null`` global: the data's
            ``img_size``); a size other than the model's needs ``model.dynamic_img_size``.
        global_scale, local_scale: ranges of the crops' area as a fraction of the image's.
    """

    out_dim: int = field(default=4096, metadata=bounds(ge=2, le=1 << 20))
    hidden_dim: int = field(default=2048, metadata=bounds(ge=1, le=1 << 16))
    bottleneck_dim: int = field(default=256, metadata=bounds(ge=1, le=1 << 16))
    head_layers: int = field(default=3, metadata=bounds(ge=1, le=16))
    norm_last_layer: bool = True
    teacher_momentum: float = field(default=0.996, metadata=bounds(ge=0, le=1))
    student_temp: float = field(default=0.1, metadata=bounds(ge=MIN_TEMPERATURE))
    teacher_temp: float = field(default=0.04, metadata=bounds(ge=MIN_TEMPERATURE))
    warmup_teacher_temp: float = field(default=0.04, metadata=bounds(ge=MIN_TEMPERATURE))
    warmup_teacher_temp_epochs: int = field(default=0, metadata=bounds(ge=0, le=MAX_EPOCHS))
    center_momentum: float = field(default=0.9, metadata=bounds(ge=0, le=1))
    freeze_last_layer_epochs: int = field(default=1, metadata=bounds(ge=0, le=MAX_EPOCHS))
    local_crops: int = field(default=6, metadata=bounds(ge=0, le=64))
    global_size: int | None = field(default=None, metadata=bounds(ge=1, le=8192))
    local_size: int = field(default=16, metadata=bounds(ge=1, le=8192))
    global_scale: tuple[float, float] = field(default=(0.4, 1.0), metadata=bounds(gt=0, le=1))
    local_scale: tuple[float, float] = field(default=(0.05, 0.4), metadata=bounds(gt=0, le=1))

    def validate(self) -> None:
        """Ordered scale ranges."""
        for key in ("global_scale", "local_scale"):
            low, high = getattr(self, key)
            if low > high:
                raise FieldError(key, f"must be a range (low, high) with low <= high, got ({low:g}, {high:g}).")

    def crop_sizes(self, model: ViTConfig) -> dict[str, int]:
        """The side of each crop the model sees, by option: ``global_size`` (``null``: the model's
        ``img_size``, which is the data's) and, with local crops, ``local_size``."""
        global_size = self.global_size or model.img_size[0]
        return {"global_size": global_size, **({"local_size": self.local_size} if self.local_crops else {})}

    def check_model(self, model: ViTConfig) -> None:
        """Crops the model can take (a multiple of its patch size, within :data:`MAX_TOKENS`
        patches, its own ``img_size`` unless ``dynamic_img_size``), and a student and teacher
        (backbone and head each) within :data:`MAX_PARAMETERS`.

        Raises:
            FieldError: keyed by the recipe key (``task.dino.*``).
        """
        for key, size in self.crop_sizes(model).items():
            if any(size % p for p in model.patch_size):
                raise FieldError(f"task.dino.{key}", f"is {size}, not a multiple of the model's patch size {side(model.patch_size)}.")
            tokens = (size // model.patch_size[0]) * (size // model.patch_size[1])
            if tokens > MAX_TOKENS:
                raise FieldError(
                    f"task.dino.{key}", f"is {size}: {tokens:,} patches of {side(model.patch_size)} pixels, more than the "
                    f"limit of {MAX_TOKENS:,}; use smaller crops or a larger model.patch_size."
                )
            if (size, size) != tuple(model.img_size) and not model.dynamic_img_size:
                raise FieldError(
                    f"task.dino.{key}", f"is {size}, not the model's img_size {side(model.img_size)}: set "
                    "model.dynamic_img_size=true (the position embedding is resampled to each crop's grid)."
                )
        head = head_weights(model.embed_dim, self.out_dim, hidden_dim=self.hidden_dim, bottleneck_dim=self.bottleneck_dim,
                            layers=self.head_layers)
        if 2 * (head + model.num_weights()) > MAX_PARAMETERS:
            last_layer = (self.bottleneck_dim + 1) * self.out_dim
            key = "out_dim" if 2 * last_layer > head else "hidden_dim"  # the option behind most of the weights
            raise FieldError(
                f"task.dino.{key}", f"is {getattr(self, key)} (out_dim {self.out_dim}, hidden_dim {self.hidden_dim}, "
                f"bottleneck_dim {self.bottleneck_dim}, head_layers {self.head_layers}): a head of about {head:.3g} weights, which "
                f"twice (student and teacher) with the backbone's exceeds the limit of {MAX_PARAMETERS:.3g}; shrink "
                "the head (DINO's is 2048 hidden, 256 bottleneck, 3 layers)."
            )

    def schedule_notes(self, epochs: int) -> list[str]:
        """The schedules as long as a run of ``epochs`` epochs or longer: the frozen last layer and
        the teacher temperature's warm-up."""
        notes = []
        if self.freeze_last_layer_epochs >= epochs:
            notes.append(f"task.dino.freeze_last_layer_epochs={self.freeze_last_layer_epochs} is as long as the run "
                         f"(trainer.max_epochs={epochs}) or longer: the head's last layer never learns")
        if self.warmup_teacher_temp_epochs > epochs:
            notes.append(f"task.dino.warmup_teacher_temp_epochs={self.warmup_teacher_temp_epochs} is longer than the run "
                         f"(trainer.max_epochs={epochs}): the teacher never reaches teacher_temp={self.teacher_temp:g}")
        return notes
