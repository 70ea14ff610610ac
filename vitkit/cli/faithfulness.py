"""Measure how faithfully each attribution method explains a model's predictions: deletion,
insertion, positive and negative perturbation areas, the parameter-randomisation check and the
time per image, on the model's own test images.

    vitkit faithfulness runs/fashion_mnist_fast/latest/model.safetensors --out faith/
    vitkit faithfulness model.safetensors --images 100 --methods chefer lrp random \\
        --baseline blur --steps 8 --out faith/
    vitkit faithfulness --model vit_small_patch16_224 --timm-weights vit_s.safetensors \\
        --data name=imagefolder root=/data/imagenette --images 200 --out faith/

The images are --images test images of the split the model file records (``--data key=value``
changes it, and names the data of timm weights), spread over its classes (one of each class in turn,
drawn by --seed). After the first batch a note gives the expected time; SIGTERM or Ctrl-C stops
after the batch under way and writes the table of the images measured (exit status 143 or 130). Each method explains the predicted class of each
image; its patches are then deleted (replaced by the dataset mean, or a blurred copy with
``--baseline blur``) or revealed on that baseline in the map's order over --steps steps (default
one patch per step). Deletion and insertion are areas under the explained class's probability
(lower and higher are better); positive and negative perturbation (Chefer et al., arXiv
2012.09838) are areas under the accuracy, in percent, as the most or the least relevant patches
are deleted (lower and higher are better). The sanity column is the mean Spearman correlation
between the model's maps and those of a copy with re-drawn weights (Adebayo et al., arXiv
1810.03292): a map that explains the model is far below 1. ms/image times the maps alone.

lrp's rules (--lrp-rules): by default each preset (AttnLRP, CP-LRP, CP-LRP with gamma rules)
is measured on --lrp-choice-images images of the validation split, never the test images the table
reports, and the most faithful is used and named; a preset's name uses it as it is.

OUT/faithfulness.csv holds one row per method, OUT/faithfulness.png the mean curves, and
OUT/faithfulness.md the table.
"""

from __future__ import annotations

import argparse
import dataclasses
import signal
import time
from pathlib import Path

import torch

from vitkit.data import datasets_for
from vitkit.errors import UsageError
from vitkit.explain import LRP_PRESETS, FaithfulnessReport, choose_lrp_rules, faithfulness
from vitkit.explain.render import faithfulness_figure
from vitkit.files import atomic_write, markdown_table, write_csv
from vitkit.method_names import MAP_METHODS
from vitkit.output_dirs import claim_output_dir

from .commands import run_command
from .explain_io import draw_images, load_model_from_arguments


def main(argv: list[str] | None = None) -> int:
    """``vitkit faithfulness`` in this process (``tools/faithfulness.py``, tests)."""
    return run_command("faithfulness", run, argv)


def run(args: argparse.Namespace) -> int:
    model, extra = load_model_from_arguments(args)
    if model.config.num_classes == 0:
        raise UsageError("the model has no classifier (num_classes=0): faithfulness measures how maps explain a class.")
    if "attention" in args.methods and not any(model.heads_per_layer()):
        raise UsageError("every head of every layer of the model was pruned: it has no attention for the 'attention' "
                         "method to read; leave it out of --methods.")
    repeated = sorted({method for method in args.methods if args.methods.count(method) > 1})
    if repeated:
        raise UsageError(f"--methods names {', '.join(repeated)} more than once; name each method once.")
    out = Path(args.out)
    bundle = datasets_for(model, extra, args.data, features_only=True)  # test images, and validation images to choose on
    loaded = draw_images(bundle, "test", args.images, args.seed)
    images, labels = torch.stack([image.image for image in loaded]), torch.tensor([image.label for image in loaded])
    grid_rows, grid_columns = model.patch_embed.grid_size(*images.shape[2:])
    patches = grid_rows * grid_columns
    if args.steps is not None and args.steps > patches:
        raise UsageError(f"--steps {args.steps} is more than the {grid_rows}x{grid_columns} = {patches} patches of the "
                         f"model's images; give at most {patches} (one patch per step), or leave --steps out.")
    changes = {field: value for field, value in (("attention", args.lrp_attention), ("linear_gamma", args.linear_gamma),
                                                  ("patch_gamma", args.patch_gamma)) if value is not None}
    if changes and args.lrp_rules == "auto":
        raise UsageError("--lrp-attention, --linear-gamma and --patch-gamma change one preset of lrp's rules, and "
                         "--lrp-rules auto chooses among them: name the preset to change (--lrp-rules attnlrp, cp or "
                         "cp-gamma), or leave those options out.")
    choose = args.lrp_rules == "auto" and "lrp" in args.methods
    choice_images = draw_images(bundle, "val", args.lrp_choice_images, args.seed) if choose else []
    claim_output_dir(out, "faithfulness")
    if choose:
        choice = choose_lrp_rules(model, torch.stack([image.image for image in choice_images]),
                                  baseline=args.baseline, batch_size=args.batch_size)
        print(choice.describe(), flush=True)
        rules = choice.rules
    else:
        rules = None if args.lrp_rules == "auto" else dataclasses.replace(LRP_PRESETS[args.lrp_rules], **changes)
    torch.manual_seed(args.seed)
    with StopSignals() as stop:
        report = faithfulness(
            model, images, labels, args.methods, baseline=args.baseline, steps=args.steps, batch_size=args.batch_size,
            sanity=not args.no_sanity, seed=args.seed, rules=rules, progress=True,
            on_batch=Forecast(len(images), stop),
        )
    rows = report.rows()
    write_csv(out / "faithfulness.csv", rows)
    table = markdown_table([{key: "-" if value is None else value for key, value in row.items()} for row in rows])
    atomic_write(out / "faithfulness.md", lambda tmp: Path(tmp).write_text(table, encoding="utf-8"))
    steps = len(report.fractions) - 1
    title = f"{report.num_images} test images, {steps} steps over {grid_rows}x{grid_columns} patches, {args.baseline} baseline"
    atomic_write(out / "faithfulness.png", lambda tmp: faithfulness_figure(report, tmp, title))
    print(table, end="")
    print(f"wrote faithfulness.csv, faithfulness.md and faithfulness.png to {out}.")
    if stop.signal is not None:
        print(f"stopped by {stop.name} after {report.num_images} of {len(images)} images: the table covers those "
              f"(the images field says how many); run again with --images {report.num_images} to finish sooner.")
        return 128 + stop.signal
    print(verdict(report, args))
    return 0


class StopSignals:
    """Within ``with``: SIGTERM and Ctrl-C (SIGINT) are recorded (``signal``, ``name``) instead of
    ending the process, so the batch under way finishes and what was measured is written."""

    def __init__(self) -> None:
        self.signal: int | None = None
        self.name = ""
        self._previous: dict[int, object] = {}

    def _record(self, number: int, frame: object) -> None:
        self.signal, self.name = number, signal.Signals(number).name

    def __enter__(self) -> StopSignals:
        for number in (signal.SIGTERM, signal.SIGINT):
            self._previous[number] = signal.signal(number, self._record)
        return self

    def __exit__(self, *exc: object) -> None:
        for number, handler in self._previous.items():
            signal.signal(number, handler)


class Forecast:
    """``faithfulness(on_batch=...)``: after the first batch, one ``note:`` line with the expected
    time of all ``total`` images; after each batch, whether ``stop`` recorded a signal."""

    def __init__(self, total: int, stop: StopSignals) -> None:
        self.total, self.stop, self.started = total, stop, time.perf_counter()

    def __call__(self, done: int) -> bool:
        if self.started is not None:
            seconds = (time.perf_counter() - self.started) * self.total / done
            self.started = None
            print(f"note: about {seconds / 60:.1f} min for the {self.total} images (the first {done} took "
                  f"{seconds * done / self.total:.0f} s); SIGTERM or Ctrl-C writes the table of the images done so far.",
                  flush=True)
        return self.stop.signal is not None


def verdict(report: FaithfulnessReport, args: argparse.Namespace) -> str:
    """The most faithful method by insertion minus deletion, and the ``vitkit maps`` command that
    draws it or, for a method it does not draw, the most faithful one it draws."""
    def scores(name: str) -> str:
        result = report.result(name)
        return f"{name} (deletion {result.mean('deletion'):.3f}, insertion {result.mean('insertion'):.3f})"

    ranking = report.ranking()
    drawn = [name for name in ranking if name in MAP_METHODS]  # those vitkit maps --method draws one by one
    line = f"most faithful here (insertion minus deletion): {scores(ranking[0])}; "
    if drawn and drawn[0] == ranking[0]:
        return line + f"next: draw it with {maps_command(args, drawn[0])}"
    if drawn:
        return line + (f"vitkit maps does not draw it; the most faithful map it draws is {scores(drawn[0])}: "
                       f"{maps_command(args, drawn[0])}")
    return line + f"next: draw vitkit's maps with {maps_command(args, 'all')}"


def maps_command(args: argparse.Namespace, method: str) -> str:
    """``vitkit maps`` of the same model with ``method`` (``all``: every map it draws)."""
    if args.checkpoint is not None:
        return f"vitkit maps {args.checkpoint} --method {method} --test-images 8 --out maps/"
    return f"vitkit maps --model {args.model} --timm-weights {args.timm_weights} --method {method} IMAGES --out maps/"
