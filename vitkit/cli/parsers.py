"""The options of every ``vitkit`` command, kept free of torch so that ``--help`` and usage errors
answer at once. Each command's description is its module's docstring, read without importing it.

The explanation methods' names come from their registry, :mod:`vitkit.method_names`, which imports
nothing. A few other choices and defaults are the library's own constants, which live in modules that
import torch; they are written out here (:data:`LIBRARY_CONSTANTS` lists them) and a test keeps them equal.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import textwrap
from collections.abc import Callable
from pathlib import Path

from ..bench.specs import parse_model_spec
from ..method_names import BUILTIN_METHODS, METHODS
from .common import int_at_least, number_in, positive_int, seed_int

EXIT_STATUS_HELP = """exit status (every command):
  0    done
  2    a user's mistake: bad argument, recipe, model or data file, output folder (one 'error:' line;
       --debug adds the traceback)
  3    done, but some inputs were skipped (each named on an 'error:' line)
  143  stopped by SIGTERM (a training run saves last.ckpt and says how to resume)
  130  stopped by Ctrl-C (as SIGTERM)
  1    a bug in vitkit (a traceback)"""

#: Written out from the library (they live beside torch code): explain's rollout head fusions,
#: HeadThresholds' defaults, the explorer's size cap, the test-time augmentations, pruning's orders
#: and the defaults of its options.
LRP_ATTENTION_RULES = ("cp", "attnlrp")
LRP_PRESET_NAMES = ("attnlrp", "cp", "cp-gamma")
HEAD_FUSIONS = ("mean", "max", "min")
HEAD_THRESHOLDS = {"uniform_entropy": 0.9, "self_attention": 0.5, "cls_sink": 0.5, "collapse_similarity": 0.9}
EXPLORER_MAX_BYTES = 50_000_000
TTA_CHOICES = ("none", "hflip", "hflip_shift")
PRUNE_ORDERS = ("importance", "importance-l2", "random", "entropy")
PRUNE_DEFAULTS = {"step_fraction": 0.1, "random_seeds": 5, "entropy_order": "high", "batch_size": 256, "rounds": 50}
LIBRARY_CONSTANTS = {
    "vitkit.explain.lrp.ATTENTION_RULES": LRP_ATTENTION_RULES,
    "vitkit.explain.LRP_PRESETS": LRP_PRESET_NAMES,
    "vitkit.explain.HEAD_FUSIONS": HEAD_FUSIONS,
    "vitkit.explain.HeadThresholds()": HEAD_THRESHOLDS,
    "vitkit.explain.DEFAULT_MAX_BYTES": EXPLORER_MAX_BYTES,
    "vitkit.evaluation.TestTimeAugmentation": TTA_CHOICES,
    "vitkit.prune.PRUNE_ORDERS": PRUNE_ORDERS,
    "vitkit.prune.PruneOptions()": PRUNE_DEFAULTS,
}

#: ``vitkit benchmark``'s default models (NAME:BATCH).
BENCHMARK_MODELS = ("vit_small_patch16_224:32", "vit_cifar_small:128")
BENCHMARK_SECTIONS = ("kernels", "models", "casts", "memory", "data", "levers", "onnx")
#: ``vitkit time-to-accuracy``'s implementations.
IMPLS = ("vitkit", "timm")


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The docstring's layout kept, every option's default shown, and a long default (a model spec)
    kept whole so that it can be copied: lines break between words only."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        return textwrap.wrap(" ".join(text.split()), width, break_long_words=False, break_on_hyphens=False)

    def _get_help_string(self, action: argparse.Action) -> str | None:
        """The help with ``(default: ...)`` added only where it says something: not for a required
        option, an unset (``None``) or empty default, or a help that already states its default."""
        text = action.help or ""
        if action.required or action.default in (None, [], False, argparse.SUPPRESS) or "default" in text:
            return text
        return super()._get_help_string(action)


def summary(module: str) -> str:
    """What ``vitkit.cli.<module>`` does: its docstring's first paragraph, on one line, up to a colon."""
    return " ".join(_docstring(module).split("\n\n", 1)[0].split()).split(": ", 1)[0].rstrip(".")


def _docstring(module: str) -> str:
    spec = importlib.util.find_spec(f"{__package__}.{module}")
    return ast.get_docstring(ast.parse(Path(spec.origin).read_text(encoding="utf-8"))) or ""


def build(command: str, module: str) -> argparse.ArgumentParser:
    """The parser of ``vitkit <command>`` (``vitkit.cli.<module>``), ``--debug`` included."""
    parser = argparse.ArgumentParser(
        prog=f"vitkit {command}", description=_docstring(module), epilog=EXIT_STATUS_HELP, formatter_class=HelpFormatter
    )
    OPTIONS[module](parser)
    parser.add_argument("--debug", action="store_true", help="show the traceback of an error")
    return parser


def parse(command: str, module: str, argv: list[str]) -> argparse.Namespace:
    """``argv`` parsed for ``command``; recipe overrides may come after options (``--resume CKPT x=1``)."""
    parser = build(command, module)
    args = parser.parse_intermixed_args(argv) if module in INTERMIXED else parser.parse_args(argv)
    if hasattr(args, "model_inputs"):
        settle_model(parser, args)
    return args


# --- shared groups ----------------------------------------------------------------------------


def recipe_arguments(parser: argparse.ArgumentParser, overrides: str = "dotted key=value overrides") -> None:
    parser.add_argument("recipe", help="recipe YAML file, or a shipped recipe's name (vitkit recipes lists them)")
    parser.add_argument("overrides", nargs="*", help=f"{overrides}, e.g. trainer.max_epochs=5")


#: The positional model file's help, the same for every command that takes one.
MODEL_HELP = "vitkit model file (.safetensors from training / save_model, or a .ckpt)"


def model_arguments(parser: argparse.ArgumentParser, inputs: str | None = None) -> None:
    """``MODEL | --model NAME --timm-weights FILE [--mean ...] [--std ...] [--crop-pct P]``, for
    :func:`vitkit.cli.explain_io.load_model_from_arguments`; ``--checkpoint MODEL`` is the older
    spelling of ``MODEL``. With ``inputs`` (``"images"``), MODEL is the first of that positional
    list (:func:`settle_model`), as in ``vitkit predict MODEL IMAGE...``."""
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--checkpoint", metavar="MODEL", help="the model file, as the positional MODEL (an older spelling)")
    timm_weights_arguments(parser, source)
    if inputs is None:
        parser.add_argument("model_file", nargs="?", metavar="MODEL", help=MODEL_HELP)
    parser.set_defaults(model_inputs=inputs)


def settle_model(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """``args.checkpoint`` from the positional MODEL (the first of ``args.<model_inputs>`` where the
    command takes more positionals), unless ``--checkpoint`` or ``--model`` named the model; a
    model named twice, or not at all, is a usage error."""
    rest = getattr(args, args.model_inputs) if args.model_inputs else [args.model_file] * (args.model_file is not None)
    named = args.checkpoint is not None or args.model is not None or getattr(args, "recipe", None) is not None
    if not named:
        if not rest:
            parser.error(f"give the model file: {parser.prog} MODEL ... (or --model NAME --timm-weights FILE)")
        args.checkpoint, *rest = rest
    elif not args.model_inputs and rest:
        parser.error(f"the model is given twice ({rest[0]} and {args.checkpoint or args.model}); give it once, as MODEL")
    if args.model_inputs:
        setattr(args, args.model_inputs, rest)


def timm_weights_arguments(parser: argparse.ArgumentParser, group: argparse._ActionsContainer | None = None) -> None:
    """``--model NAME --timm-weights FILE [--mean ...] [--std ...] [--crop-pct P]`` (``--model``
    in ``group`` when given)."""
    (group or parser).add_argument(
        "--model",
        help="vitkit variant name (vitkit.list_models()), with --timm-weights; add timm's tag for the weights' own "
        "preprocessing (vit_small_patch16_224.dino)",
    )
    parser.add_argument(
        "--timm-weights",
        help="timm ViT state dict (.safetensors or torch file) for --model, preprocessed as timm's pretrained_cfg "
        "of --model says",
    )
    parser.add_argument("--mean", type=float, nargs="+", help="with --timm-weights: normalisation mean, per channel")
    parser.add_argument("--std", type=float, nargs="+", help="with --timm-weights: normalisation std, per channel")
    parser.add_argument("--crop-pct", type=float, help="with --timm-weights: eval crop (resize to size / crop_pct)")


def data_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--data", nargs="*", default=[], metavar="KEY=VALUE",
        help="changes to the data options saved with the model (DataConfig), e.g. root=/data/cifar num_workers=0",
    )


def test_seed_argument(parser: argparse.ArgumentParser) -> None:
    """``--seed``: which test images ``--test-images N`` draws (one of each class in turn)."""
    parser.add_argument("--seed", type=int, default=0, help="seed of the test images --test-images draws")


def force_argument(parser: argparse.ArgumentParser, flag: str) -> None:
    """``--force``: a command's one output file may replace an existing file."""
    parser.add_argument("--force", action="store_true", help=f"replace an existing {flag} file (never an input)")


def tta_argument(parser: argparse.ArgumentParser) -> None:
    """``--tta``: how a model file's images are scored (default: as saved with the model)."""
    parser.add_argument("--tta", choices=TTA_CHOICES, help="test-time augmentation: hflip averages each image's and its "
                        "mirror's class probabilities, hflip_shift adds both moved by one pixel in each direction "
                        "(10 views); unset: as saved with the model by its training run")


# --- argument types ---------------------------------------------------------------------------


def layer_list(text: str) -> list[int]:
    """``argparse`` type of ``--layers``: comma-separated block indices (``0,5,-1``)."""
    try:
        return [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated block indices such as 0,5,11, got {text!r}") from None


def merge_tokens_value(text: str) -> tuple[int | list[int], str]:
    """``argparse`` type of ``--merge-tokens``: ``R`` (every block), ``R1,R2,...`` (one count per
    block) or ``R:decreasing`` (ToMe's schedule), as ``(r, schedule)`` for :func:`vitkit.merge_tokens`."""
    count, _, schedule = text.partition(":")
    try:
        counts = [int(part) for part in count.split(",")]
    except ValueError:
        counts = []
    if not counts or any(value < 0 for value in counts) or schedule not in ("", "decreasing") or (
        schedule and len(counts) > 1
    ):
        raise argparse.ArgumentTypeError(
            f"expected R (tokens merged per block, 0 or more), R1,R2,... (one per block) or R:decreasing, got {text[:120]!r}"
        )
    return (counts[0] if len(counts) == 1 else counts), schedule or "constant"


def precision_argument(parser: argparse.ArgumentParser, note: str) -> None:
    """``--precision fp32|bf16``: the forward's precision (:func:`vitkit.evaluation.inference_context`)."""
    parser.add_argument(
        "--precision", choices=("fp32", "bf16"), default="fp32",
        help=f"bf16: run the model under bfloat16 autocast (2-3x faster on CPUs with AVX512-BF16 or AMX; {note})",
    )


def merge_tokens_argument(parser: argparse.ArgumentParser) -> None:
    """``--merge-tokens R``: token merging (ToMe) on the loaded model (:func:`vitkit.merge_tokens`)."""
    parser.add_argument(
        "--merge-tokens", type=merge_tokens_value, metavar="R",
        help="token merging (ToMe): R tokens merged in every block, R1,R2,... one count per block, or R:decreasing "
        "(2R in the first block down to 0); 0 undoes a model file's merging (None: as the model file says)",
    )


def model_spec(spec: str) -> str:
    """``argparse`` type of ``--models`` / ``--memory-model``: ``spec`` if :func:`~vitkit.bench.specs.parse_model_spec`
    reads it, with a batch of at least 1."""
    try:
        _, batch_size, _ = parse_model_spec(spec)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected NAME:BATCH or NAME:BATCH:key=value,... with a whole-number batch, got {spec!r}"
        ) from None
    if batch_size < 1:
        raise argparse.ArgumentTypeError(f"the batch size of {spec!r} must be at least 1")
    return spec


# --- the commands -----------------------------------------------------------------------------


def train(parser: argparse.ArgumentParser) -> None:
    recipe_arguments(parser)
    parser.add_argument("--resume", metavar="CKPT", help="checkpoint to continue from (e.g. .../checkpoints/last.ckpt)")


def evaluate(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="model.safetensors, a training .ckpt, or (with FOLDER) an .onnx file from vitkit export")
    parser.add_argument("folder", nargs="?", metavar="FOLDER",
                        help="a test folder FOLDER/<class>/*, every image evaluated (None: the split of --split of the "
                        "data saved with the model)")
    data_arguments(parser)
    parser.add_argument("--split", choices=("test", "val"), default="test",
                        help="split to evaluate, without FOLDER")
    tta_argument(parser)
    precision_argument(parser, "loss and accuracy in float32")
    parser.add_argument("--out", help="output folder (default: eval/ beside the model)")
    merge_tokens_argument(parser)


def export(parser: argparse.ArgumentParser) -> None:
    model_arguments(parser)
    parser.add_argument("--format", choices=("onnx",), default="onnx", help="file format")
    parser.add_argument("--out", required=True, help="the .onnx file to write")
    force_argument(parser, "--out")
    parser.add_argument("--opset", type=int_at_least(1), help="ONNX opset, 18 to torch's newest (None: the exporter's default)")
    parser.add_argument("--dynamic-batch", action=argparse.BooleanOptionalAction, default=True,
                        help="any batch size, as timm's onnx_export.py (--no-dynamic-batch: a graph of batch 1)")
    parser.add_argument("--img-size", type=positive_int, nargs=2, metavar=("H", "W"),
                        help="input size (None: the model's; another needs a dynamic_img_size model)")
    parser.add_argument("--quantize", choices=("dynamic",),
                        help="int8: onnxruntime's dynamic quantisation of the linear layers (None: float32)")
    merge_tokens_argument(parser)


def predict(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "inputs", nargs="+", metavar="[MODEL_FILE] IMAGE_OR_FOLDER",
        help="the model file (.safetensors from training / save_model, or a training .ckpt), unless --model and "
        "--timm-weights give the model; then image files and/or folders",
    )
    timm_weights_arguments(parser)
    parser.add_argument("--top-k", type=positive_int, default=5, help="classes per image")
    parser.add_argument("--csv", metavar="FILE", help="also write the predictions to this CSV file")
    force_argument(parser, "--csv")
    parser.add_argument("--batch-size", type=positive_int, default=64, help="images per batch")
    tta_argument(parser)
    precision_argument(parser, "probabilities in float32")
    merge_tokens_argument(parser)


def model_and_images(parser: argparse.ArgumentParser) -> None:
    """``MODEL [IMAGE_OR_FOLDER ...]`` (``vitkit maps``, ``vitkit explore``)."""
    model_arguments(parser, inputs="images")
    parser.add_argument("images", nargs="*", metavar="[MODEL] IMAGE_OR_FOLDER",
                        help=f"the model file ({MODEL_HELP}) unless --checkpoint or --model gives it, then image files "
                        "and/or folders")
    merge_tokens_argument(parser)


def attention_maps(parser: argparse.ArgumentParser) -> None:
    model_and_images(parser)
    parser.add_argument(
        "--test-images", type=int_at_least(0), default=0, metavar="N",
        help="also explain N test images of the dataset the model was trained on, spread over its classes",
    )
    test_seed_argument(parser)
    parser.add_argument("--out", required=True, help="output folder for the PNGs")
    parser.add_argument("--method", choices=(*METHODS, "all"), default="all", help="maps drawn")
    parser.add_argument("--layer", type=int, default=-1, help="block shown in the per-head grid (-1: the last)")
    parser.add_argument("--head-fusion", choices=HEAD_FUSIONS, default="mean", help="rollout: how heads are combined")
    parser.add_argument(
        "--discard-ratio", type=float, default=0.0, help="both rollouts: share of each layer's weakest entries zeroed"
    )
    parser.add_argument("--target", type=int, default=None, help="class explained (None: the predicted one)")
    parser.add_argument("--batch-size", type=positive_int, default=16, help="images per forward pass")
    precision_argument(parser, "maps still in float32")
    parser.add_argument(
        "--score-steps", type=positive_int, default=16,
        help="deletion/insertion scores in the titles: patches perturbed in this many steps (at most one per patch)",
    )
    parser.add_argument("--no-scores", action="store_true", help="leave the deletion/insertion scores out of the titles")


def faithfulness(parser: argparse.ArgumentParser) -> None:
    model_arguments(parser)
    merge_tokens_argument(parser)
    data_arguments(parser)
    parser.add_argument("--out", required=True, help="output folder for faithfulness.csv, .md and .png")
    parser.add_argument("--images", type=positive_int, default=500,
                        help="test images measured, spread over the classes by --seed (the Fashion-MNIST fast model: about 4 s each "
                        "on 2 cores)")
    parser.add_argument("--methods", nargs="+", choices=BUILTIN_METHODS, default=list(BUILTIN_METHODS),
                        help="methods measured (attention: the last attended layer's class-token attention; "
                        "random: chance level)")
    parser.add_argument("--baseline", choices=("mean", "blur"), default="mean",
                        help="what a deleted patch shows: the dataset mean, or the image blurred (11x11 box)")
    parser.add_argument("--steps", type=positive_int, default=None,
                        help="perturbation steps over the patch grid (default: one patch per step)")
    parser.add_argument("--batch-size", type=positive_int, default=32, help="images per forward pass")
    parser.add_argument("--no-sanity", action="store_true", help="skip the parameter-randomisation check (halves the time)")
    parser.add_argument("--seed", type=seed_int, default=0,
                        help="seed of the test images drawn, the random map and the re-drawn weights")
    parser.add_argument("--lrp-rules", choices=("auto", *LRP_PRESET_NAMES), default="auto",
                        help="lrp's rules: auto measures every preset on --lrp-choice-images validation images and "
                        "keeps the most faithful (insertion minus deletion), saying which; attnlrp: AttnLRP through the "
                        "softmax, LRP-0 elsewhere (vitkit maps' rules); cp: attention weights held constant, LRP-0 "
                        "elsewhere (lxt's ViT patch); cp-gamma: cp with gamma 0.25 on the linear layers and 1 on the "
                        "patch projection")
    parser.add_argument("--lrp-choice-images", type=positive_int, default=32, metavar="N",
                        help="validation images --lrp-rules auto chooses on (never the test images measured)")
    parser.add_argument("--lrp-attention", choices=LRP_ATTENTION_RULES, default=None,
                        help="change the preset's rule inside the attention: cp holds the attention weights constant, "
                        "attnlrp propagates through the softmax")
    parser.add_argument("--linear-gamma", type=number_in(0), default=None, help="change the preset's gamma of the linear layers")
    parser.add_argument("--patch-gamma", type=number_in(0), default=None, help="change the preset's gamma of the patch projection")


def explore(parser: argparse.ArgumentParser) -> None:
    model_and_images(parser)
    parser.add_argument(
        "--test-images", type=int_at_least(0), default=0, metavar="N",
        help="also explore N test images of the dataset the model was trained on, spread over its classes",
    )
    test_seed_argument(parser)
    parser.add_argument("--out", required=True, help="the HTML file to write")
    force_argument(parser, "--out")
    parser.add_argument("--layers", type=layer_list, default=None, help="blocks to embed, e.g. 0,5,11 (None: all)")
    parser.add_argument("--max-images", type=positive_int, default=8, help="images kept, test images first")
    parser.add_argument("--max-bytes", type=positive_int, default=EXPLORER_MAX_BYTES, help="refuse a larger file")
    parser.add_argument("--batch-size", type=positive_int, default=8, help="images per forward pass")


def attention_report(parser: argparse.ArgumentParser) -> None:
    model_arguments(parser)
    data_arguments(parser)
    parser.add_argument("--split", choices=("test", "val"), default="test", help="split the images come from")
    parser.add_argument("--num-images", type=positive_int, default=128, help="images averaged over")
    parser.add_argument("--batch-size", type=positive_int, default=32, help="images per forward pass")
    parser.add_argument("--out", required=True, help="output folder")
    thresholds = {
        "uniform_entropy": "unfocused head: normalised entropy at least this",
        "self_attention": "self-attending head: diagonal share at least this",
        "cls_sink": "attention sink: class-token share at least this",
        "collapse_similarity": "collapsed heads: JS similarity at least this",
    }
    for key, help_text in thresholds.items():
        parser.add_argument(f"--{key.replace('_', '-')}", type=float, default=HEAD_THRESHOLDS[key], help=help_text)


def localization(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--checkpoint", metavar="MODEL", help="the model file, as the positional MODEL (an older spelling)")
    source.add_argument("--recipe", help="train this recipe first (with the dotted overrides given after it)")
    parser.add_argument("overrides", nargs="*", metavar="MODEL | OVERRIDE",
                        help="the model trained on shapes (.safetensors or .ckpt), or with --recipe its overrides, "
                        "e.g. data.name=shapes trainer.max_epochs=10")
    parser.set_defaults(model_inputs="overrides", model=None)
    data_arguments(parser)
    parser.add_argument("--num-images", type=positive_int, default=500, help="test images scored")
    parser.add_argument("--head-fusion", choices=HEAD_FUSIONS, default="mean", help="rollout: how heads are combined")
    parser.add_argument("--discard-ratio", type=number_in(0, 1, high_open=True), default=0.0,
                        help="rollouts: share of each layer's weakest entries zeroed")
    parser.add_argument("--seed", type=seed_int, default=0, help="seed of the random-weight model")
    parser.add_argument("--explain", choices=("label", "predicted"), default="label",
                        help="class the gradient methods explain (the pointing game cues the true label)")
    parser.add_argument("--tolerance", type=number_in(0), default=None,
                        help="pointing-game tolerance in pixels (None: TorchRay's 15 px at 224 px, scaled)")
    parser.add_argument("--out", help="folder for localization.csv / localization.md")


#: ``vitkit prune --orders`` (vitkit.prune.plan.ORDERS, kept here so --help needs no torch).

def prune_heads(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model_file", nargs="?", metavar="MODEL", help="model.safetensors or a training .ckpt")
    parser.add_argument("--checkpoint", metavar="MODEL", help="the model file, as the positional MODEL (an older spelling)")
    parser.set_defaults(model_inputs=None, model=None)
    data_arguments(parser)
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument("--orders", nargs="+", choices=PRUNE_ORDERS, default=list(PRUNE_ORDERS),
                        help="orders to trace (importance gives the pruned model; the others only feed the plot)")
    target = parser.add_mutually_exclusive_group()
    target.add_argument("--heads", type=int_at_least(0), metavar="N",
                        help="one shot: keep the N most important heads (one scoring pass, no accuracy budget)")
    target.add_argument("--ratio", type=number_in(0, 1, low_open=True, high_open=True), metavar="R",
                        help="one shot: prune this share of the heads, the least important")
    target.add_argument("--max-drop", type=number_in(0),
                        help="iterative: accuracy budget in percentage points (default 1)")
    parser.add_argument("--step-fraction", type=number_in(0, 1, low_open=True), default=PRUNE_DEFAULTS["step_fraction"],
                        help="share of remaining heads pruned per step")
    parser.add_argument("--random-seeds", type=positive_int, default=PRUNE_DEFAULTS["random_seeds"],
                        help="random orders to average")
    parser.add_argument("--entropy-order", choices=("high", "low"), default=PRUNE_DEFAULTS["entropy_order"],
                        help="entropy heads pruned first")
    parser.add_argument("--batch-size", type=positive_int, default=PRUNE_DEFAULTS["batch_size"],
                        help="batch size of scoring, evaluation and timing")
    parser.add_argument("--max-batches", type=positive_int,
                        help="cap on the batches of every pass, the test pass too (quick runs; None: all)")
    parser.add_argument("--rounds", type=positive_int, default=PRUNE_DEFAULTS["rounds"],
                        help="interleaved timing rounds for the speed-up")
    parser.add_argument("--num-threads", type=positive_int, help="torch CPU threads (None: torch's); 1 on a busy machine")
    recover = parser.add_argument_group("recovery (fine-tune the pruned model with its recipe)")
    recover.add_argument("--recover-epochs", type=positive_int, metavar="N",
                         help="fine-tune for N epochs after pruning (None: no recovery)")
    recover.add_argument("--recover-at", choices=("end", "each"),
                         help="recover the chosen step's model (end; the default) or every pruning step's (each)")
    recover.add_argument("--recipe", help="recipe of the recovery runs (None: the config.yaml of the model's run directory)")
    recover.add_argument("--recover-lr", type=number_in(0, low_open=True), metavar="LR",
                         help="peak learning rate of recovery, no warm-up (None: a tenth of the recipe's optim.lr)")


def ablate_heads(parser: argparse.ArgumentParser) -> None:
    recipe_arguments(parser, "dotted key=value overrides for every run")
    parser.add_argument("--heads", type=positive_int, nargs="+", default=[1, 2, 4, 8, 16], help="head counts to train")
    parser.add_argument("--seeds", type=positive_int, default=3, help="seeds per head count (0, 1, ...)")
    parser.add_argument("--embed-dim", type=positive_int, default=128, help="fixed model width d_model")
    parser.add_argument("--last-epochs", type=positive_int, default=3, help="epochs whose steps the oscillation covers")
    parser.add_argument("--out", default="runs/ablate_heads", help="output folder")


def init_ablation(parser: argparse.ArgumentParser) -> None:
    recipe_arguments(parser, "dotted key=value overrides for every run")
    parser.add_argument("--seeds", type=seed_int, nargs="+", default=[0, 1, 2], help="trainer.seed values")
    parser.add_argument("--no-parts", action="store_true", help="skip the one-part-at-a-time variants")
    parser.add_argument("--variants", nargs="+", metavar="LABEL", default=None,
                        help="train only these variants (labels as the table prints them, e.g. 'timm scheme')")
    parser.add_argument("--stop-after-epochs", type=positive_int, default=None, metavar="N",
                        help="stop each run after N epochs of the recipe's schedule (default: train it all)")
    parser.add_argument("--out", default="runs/init_ablation", help="output folder")


def time_to_accuracy(parser: argparse.ArgumentParser) -> None:
    recipe_arguments(parser, "dotted key=value overrides applied to both runs")
    parser.add_argument("--eval-every", type=positive_int, default=211, metavar="STEPS", help="test every N steps")
    parser.add_argument("--budget-minutes", type=number_in(0, low_open=True), default=None,
                        help="cap each run's training time (None: no cap)")
    parser.add_argument("--targets", type=float, nargs="+", default=[80.0, 85.0, 88.0], help="accuracies (%%)")
    parser.add_argument("--impls", nargs="+", choices=IMPLS, default=list(IMPLS), help="models to train")
    parser.add_argument("--out", default="runs/time_to_accuracy", help="output folder")


def recipes(parser: argparse.ArgumentParser) -> None:
    """No options: ``vitkit recipes`` lists the shipped recipes."""


def make_subset(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("src", help="ImageNet-style folder: SRC/train/<class>/*, SRC/val/<class>/*")
    parser.add_argument("dst", help="new or empty output folder, outside SRC (and SRC not inside it)")
    parser.add_argument("--classes", type=positive_int, required=True, help="number of classes to keep")
    parser.add_argument("--images", type=positive_int, required=True, help="training images per class")
    parser.add_argument("--val-images", type=positive_int, default=None, help="val/test images per class (None: all)")
    parser.add_argument("--seed", type=seed_int, default=0, help="seed of the random draw")
    parser.add_argument("--copy", action="store_true", help="copy files instead of symlinking them")


def benchmark(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sections", nargs="+", default=list(BENCHMARK_SECTIONS[:-2]), choices=BENCHMARK_SECTIONS,
                        help="what to measure (levers and onnx: slow, on request)")
    parser.add_argument("--levers-model", type=model_spec,
                        default="vit_small_patch16_224:128:img_size=32,patch_size=4,num_classes=10",
                        help="NAME:BATCH[:overrides] for the levers section")
    parser.add_argument("--levers-compile", action="store_true", help="add torch.compile to the levers (slow to compile)")
    parser.add_argument("--models", nargs="+", type=model_spec, default=list(BENCHMARK_MODELS),
                        help="NAME:BATCH or NAME:BATCH:key=value,... (ViTConfig overrides)")
    parser.add_argument("--memory-model", type=model_spec, default="vit_small_patch16_224:32",
                        help="NAME:BATCH for the memory section")
    parser.add_argument("--repeats", type=positive_int, default=5, help="interleaved pairs per cell (medians are reported)")
    parser.add_argument("--threads", type=positive_int, default=None, help="torch threads (None: torch's choice)")
    parser.add_argument("--onnx-model", help="onnx section: a trained model file, timed alone, with the top-1 of each "
                        "runtime on what vitkit evaluate MODEL scores (None: speed only, of two models of random weights)")
    merge_tokens_argument(parser)


#: ``vitkit.cli.<module>`` -> the function that adds its options.
OPTIONS: dict[str, Callable[[argparse.ArgumentParser], None]] = {
    "train": train,
    "recipes": recipes,
    "evaluate": evaluate,
    "predict": predict,
    "attention_maps": attention_maps,
    "faithfulness": faithfulness,
    "explore": explore,
    "attention_report": attention_report,
    "localization": localization,
    "prune_heads": prune_heads,
    "ablate_heads": ablate_heads,
    "init_ablation": init_ablation,
    "time_to_accuracy": time_to_accuracy,
    "make_subset": make_subset,
    "benchmark": benchmark,
    "export": export,
}
#: Commands whose recipe overrides may follow their options.
INTERMIXED = frozenset({"train", "ablate_heads", "init_ablation"})
