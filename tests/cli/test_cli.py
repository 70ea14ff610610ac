"""The ``vitkit`` command: installed by a non-editable ``pip install`` with its recipes, every subcommand's ``--help``
listing its options with their defaults before torch is imported, one exit-status rule."""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import shutil
import site
import subprocess
import sys
import time
import typing
from pathlib import Path

import pytest

from vitkit.cli import parsers
from vitkit.cli.main import MODULES, main

ROOT = Path(__file__).resolve().parents[2]


def clean_env(**extra: str) -> dict[str, str]:
    """The environment without this checkout on PYTHONPATH (so only an installed vitkit is found)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return {**env, "NO_ALBUMENTATIONS_UPDATE": "1", **extra}


@pytest.mark.slow
def test_a_non_editable_install_gives_the_vitkit_command_with_every_subcommand(tmp_path: Path) -> None:
    source = tmp_path / "src"  # a copy, so the build writes nothing into the checkout
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(".*", "runs", "build", "*.egg-info", "__pycache__"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    # the new venv sees this venv's packages (torch, timm, ...) as plain paths: their .pth files, the
    # editable vitkit's among them, are not run there
    (packages,) = list((venv / "lib").glob("python3*/site-packages"))
    (packages / "shared.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    python = venv / "bin" / "python"
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-deps",
         "--no-build-isolation", "--ignore-installed", str(source)],
        check=True, timeout=300, cwd=tmp_path, env=clean_env(),
    )
    command = venv / "bin" / "vitkit"
    listed = subprocess.run([command, "--help"], capture_output=True, text=True, timeout=60, cwd=tmp_path,
                            env=clean_env())
    assert listed.returncode == 0 and all(name in listed.stdout for name in MODULES)
    where = subprocess.run(
        [python, "-c", "import importlib, vitkit.cli.main as m; [importlib.import_module('vitkit.cli.' + x) for x "
         "in m.MODULES.values()]; print(m.__file__)"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path, env=clean_env(),
    )
    assert where.returncode == 0, where.stderr
    assert Path(where.stdout.strip()).is_relative_to(packages)  # the installed copy, not the checkout
    helped = subprocess.run([command, "predict", "--help"], capture_output=True, text=True, timeout=60, cwd=tmp_path,
                            env=clean_env())
    assert helped.returncode == 0 and "--top-k" in helped.stdout and "(default: 5)" in helped.stdout
    listed = subprocess.run([command, "recipes"], capture_output=True, text=True, timeout=60, cwd=tmp_path,
                            env=clean_env())
    names = [line.split()[0] for line in listed.stdout.splitlines() if line.strip()]
    assert listed.returncode == 0 and {"fashion_mnist", "quickstart", "mae_fashion_mnist"} <= set(names)
    assert str(packages) in listed.stdout  # the installed package data, not the checkout's recipes/
    found = subprocess.run(  # no recipes/ folder here: the name, and a clone's path, find the installed recipe
        [python, "-c", "from vitkit.train.config import load_recipe; "
         "print(load_recipe('quickstart').data.name, load_recipe('recipes/quickstart.yaml').data.name)"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path, env=clean_env(),
    )
    assert found.returncode == 0 and found.stdout.split() == ["digits", "digits"], found.stderr


def test_help_of_every_subcommand_lists_each_option_with_its_set_default_and_debug() -> None:
    for command, module in MODULES.items():
        parser = parsers.build(command, module)
        text = " ".join(parser.format_help().split())
        assert text.startswith(f"usage: vitkit {command}") and "--debug" in text and "exit status" in text, command
        packed = "".join(text.split())  # argparse breaks a default longer than the help column mid-word
        for action in parser._actions:
            if action.option_strings and action.help != argparse.SUPPRESS and action.dest != "help":
                unset = action.required or action.default in (None, [], False) or "default" in action.help
                shown = action.help.replace("%%", "%") + ("" if unset else f" (default: {action.default})")
                assert "".join(shown.split()) in packed, f"vitkit {command} {action.option_strings[0]}: {shown}"


def test_the_written_out_library_constants_equal_the_librarys() -> None:
    from vitkit.evaluation import TestTimeAugmentation
    from vitkit.explain import DEFAULT_MAX_BYTES, HEAD_FUSIONS, LRP_PRESETS, HeadThresholds
    from vitkit.explain.lrp import ATTENTION_RULES
    from vitkit.prune import PRUNE_ORDERS, PruneOptions

    prune_defaults = {key: value for key, value in dataclasses.asdict(PruneOptions()).items()
                      if value not in (None, ()) and key != "orders"}
    assert PruneOptions().orders == PRUNE_ORDERS
    assert parsers.LIBRARY_CONSTANTS == {
        "vitkit.explain.lrp.ATTENTION_RULES": ATTENTION_RULES,
        "vitkit.explain.LRP_PRESETS": tuple(LRP_PRESETS),
        "vitkit.explain.HEAD_FUSIONS": HEAD_FUSIONS,
        "vitkit.explain.HeadThresholds()": dataclasses.asdict(HeadThresholds()),
        "vitkit.explain.DEFAULT_MAX_BYTES": DEFAULT_MAX_BYTES,
        "vitkit.evaluation.TestTimeAugmentation": typing.get_args(TestTimeAugmentation),
        "vitkit.prune.PRUNE_ORDERS": PRUNE_ORDERS,
        "vitkit.prune.PruneOptions()": prune_defaults,
    }


def test_help_and_usage_errors_need_no_torch() -> None:
    code = (
        "import sys\n"
        "from vitkit.cli.main import main\n"
        "for argv in (['--help'], *[[c, '--help'] for c in sys.argv[1:]], ['train'], ['predict', 'm', 'x', '--top-k', "
        "'0']):\n"
        "    try:\n"
        "        main(argv)\n"
        "    except SystemExit as stop:\n"
        "        assert stop.code == (0 if '--help' in argv else 2), (argv, stop.code)\n"
        "print(sorted({'torch', 'lightning', 'timm', 'vitkit.models'} & set(sys.modules)))\n"
    )
    done = subprocess.run([sys.executable, "-c", code, *MODULES], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"


@pytest.mark.parametrize("argv", [["--help"], ["train", "--help"], ["prune", "--help"], ["train", "--bogus"]])
def test_help_and_a_bad_argument_answer_quickly(argv: list[str]) -> None:
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "vitkit.cli.main", *argv], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})
    seconds = time.perf_counter() - started
    print(f"vitkit {' '.join(argv)}: {seconds:.2f} s")
    assert done.returncode == (2 if "--bogus" in argv else 0)
    assert seconds < 3.0  # well under a second on an idle machine; generous, the CPUs are shared


def test_python_dash_m_vitkit_runs_the_vitkit_command() -> None:
    def run(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "vitkit", *argv], capture_output=True, text=True, timeout=60,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})

    version = run("--version")
    declared = re.search(r'^version = "(.+)"$', (ROOT / "pyproject.toml").read_text(), re.MULTILINE)
    assert version.returncode == 0 and version.stdout == f"vitkit {declared.group(1)}\n"
    unknown = run("predcit")
    assert unknown.returncode == 2 and "error: unknown command 'predcit'. Did you mean 'predict'?" in unknown.stderr


def test_an_unknown_command_suggests_the_closest(capsys: pytest.CaptureFixture) -> None:
    assert main(["predcit"]) == 2
    assert "did you mean 'predict'" in capsys.readouterr().err.lower()


@pytest.mark.parametrize("command", sorted(MODULES))
def test_help_shows_a_default_only_where_it_says_something(command: str) -> None:
    text = " ".join(parsers.build(command, MODULES[command]).format_help().split())
    assert "(default: None)" not in text and "(default: [])" not in text
    assert not re.search(r"default[^()]*\) \(default:", text)  # never two defaults for one option



#: Every command that explains, exports or prunes a model, with the rest of its arguments.
MODEL_COMMANDS = {
    "maps": ["x.png", "--out", "o"], "explore": ["x.png", "--out", "o.html"], "faithfulness": ["--out", "o"],
    "report": ["--out", "o"], "prune": ["--out", "o"], "export": ["--out", "o.onnx"], "localize": [],
}


@pytest.mark.parametrize("command", sorted(MODEL_COMMANDS))
def test_every_model_command_takes_the_model_positionally_and_as_checkpoint(
    command: str, capsys: pytest.CaptureFixture
) -> None:
    module, rest = MODULES[command], MODEL_COMMANDS[command]
    positional = parsers.parse(command, module, ["m.safetensors", *rest])
    alias = parsers.parse(command, module, ["--checkpoint", "m.safetensors", *rest])
    assert positional.checkpoint == alias.checkpoint == "m.safetensors"
    if command in ("maps", "explore"):  # after the model come the images
        assert positional.images == alias.images == ["x.png"]
    refused = [[arg for arg in rest if arg != "x.png"]]  # no model at all
    if command not in ("maps", "explore", "localize"):  # there a second positional is an image or an override
        refused.append(["--checkpoint", "a.safetensors", "b.safetensors", *rest])  # the model twice
    for argv in refused:
        with pytest.raises(SystemExit) as stop:
            parsers.parse(command, module, argv)
        assert stop.value.code == 2
        assert capsys.readouterr().err.splitlines()[-1].startswith(f"vitkit {command}: error: ")


def test_a_model_spec_takes_words_numbers_and_switches_and_refuses_an_item_without_a_value() -> None:
    from vitkit.bench.specs import parse_model_spec

    assert parse_model_spec("vit_cifar_tiny:128:patch_embed=conv,mlp_ratio=2.0,depth=4,locality=true") == (
        "vit_cifar_tiny", 128, {"patch_embed": "conv", "mlp_ratio": 2.0, "depth": 4, "locality": True})
    assert parse_model_spec("vit_small_patch16_224:32") == ("vit_small_patch16_224", 32, {})
    for bad in ("vit_cifar_tiny:8:depth", "vit_cifar_tiny:8:=4", "vit_cifar_tiny:x"):
        with pytest.raises(ValueError):
            parse_model_spec(bad)
