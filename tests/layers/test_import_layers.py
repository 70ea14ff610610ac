"""vitkit's imports run one way, from the ground up, as "How the code is organised" in
docs/concepts.md says: every import (at module level, inside functions and under ``TYPE_CHECKING``
alike) goes to a lower layer or stays inside its own package, and no chain of imports comes back to where it began.

The graph is read from the source with :mod:`ast`, so an import hidden in a function to dodge a
cycle counts as much as one at the top of a file."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).parents[2] / "vitkit"

#: The layers, lowest first. A module may import from a lower layer and from its own top-level
#: package; the packages of one layer are independent of each other.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("errors",),
    ("schema", "files", "timing", "recipe_files", "method_names", "preprocessing", "allocator", "collective"),  # leaf utilities
    ("output_dirs",),  # claims output folders and files, through files' atomic writes
    ("kernels",),
    ("layers",),
    ("models",),
    ("model_extra",),  # the metadata beside a model file's weights, checked against its config
    ("io",),
    ("pretrained",),  # reads weights through io, loads them into any model
    ("data", "evaluation"),
    ("export", "class_folders"),  # ONNX export and the onnxruntime runner; a test folder scored by class
    ("tasks",),  # training objectives: above the data and evaluation they use, below the trainer
    ("train", "explain", "inference"),
    ("prune", "bench"),  # recovery fine-tunes through train; the benchmarks time models, kernels, data, exports
    ("",),  # vitkit/__init__.py: the public names, imported lazily
    ("cli",),
    ("__main__",),  # ``python -m vitkit`` runs the command line
)
LAYER_OF = {name: level for level, names in enumerate(LAYERS) for name in names}
#: Lower packages a package keeps away from although the layers would allow them: ``data`` is
#: about images and their metadata and imports no model code (timm's ``data/`` imports no model module).
APART: dict[str, tuple[str, ...]] = {"data": ("kernels", "layers", "models", "io", "pretrained")}


def module_name(path: Path) -> str:
    """``vitkit.train.module`` for ``vitkit/train/module.py``, ``vitkit.train`` for its ``__init__.py``."""
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def imports_of(name: str) -> dict[str, int]:
    """The vitkit modules ``name`` imports anywhere in its source, each with its first line."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: dict[str, int] = {}
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            module = ".".join([*base, node.module] if node.module else base)
            # ``from pkg import sub`` imports the submodule when there is one, else a name of pkg.
            targets = [f"{module}.{a.name}" if f"{module}.{a.name}" in MODULES else module for a in node.names]
        else:
            continue
        for target in targets:
            if target == "vitkit" or target.startswith("vitkit."):
                while target not in MODULES:  # ``import vitkit.data.arrays as x``: the module itself
                    target = target.rpartition(".")[0]
                if target != name:
                    found.setdefault(target, node.lineno)
    return found


def loads_by_name(name: str) -> bool:
    """Whether ``name`` calls ``importlib.import_module``, an import :func:`imports_of` cannot follow."""
    return any(
        isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "import_module"
        or isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "import_module"
        for node in ast.walk(ast.parse(MODULES[name].read_text(), str(MODULES[name])))
    )


def imports_by_name() -> dict[str, dict[str, int]]:
    """What each module that loads modules by name may load (line 0: not a line of its source).
    A module that starts doing so must be added here, or :func:`test_every_import_by_name_is_in_the_graph` fails."""
    import vitkit
    from vitkit.cli.commands import MODULES as COMMANDS

    return {
        # the public names, imported on first use (its TYPE_CHECKING block names them as well)
        "vitkit": {f"vitkit.{module}": 0 for module in (*vitkit._ATTRIBUTES.values(), *vitkit._SUBPACKAGES)},
        "vitkit.cli.main": {f"vitkit.cli.{module}": 0 for module in COMMANDS.values()},  # each command's module
        "vitkit.errors": {},  # require(): optional third-party dependencies only
    }


BY_NAME = imports_by_name()
GRAPH = {name: imports_of(name) | BY_NAME.get(name, {}) for name in MODULES}


def layer_package(name: str) -> str:
    """The top-level package (or leaf module) of ``name``: ``train`` for ``vitkit.train.module``,
    ``""`` for the ``vitkit`` package itself."""
    return name.split(".")[1] if "." in name else ""


def test_every_module_belongs_to_a_layer() -> None:
    unplaced = sorted({layer_package(name) for name in MODULES} - set(LAYER_OF))
    assert not unplaced, f"add these to LAYERS (and the layering in docs/concepts.md): {unplaced}"


def test_imports_run_down_the_layers() -> None:
    wrong = [
        f"{MODULES[name].relative_to(PACKAGE.parent)}:{line} imports {target} "
        f"(layer {LAYER_OF[layer_package(target)]}, it is in layer {LAYER_OF[layer_package(name)]})"
        for name, targets in GRAPH.items()
        for target, line in targets.items()
        if layer_package(target) != layer_package(name)
        and LAYER_OF[layer_package(target)] >= LAYER_OF[layer_package(name)]
    ]
    assert not wrong, "imports against the layering:\n" + "\n".join(wrong)


def test_packages_kept_apart_import_nothing_from_each_other() -> None:
    wrong = [
        f"{MODULES[name].relative_to(PACKAGE.parent)}:{line} imports {target}"
        for name, targets in GRAPH.items()
        for target, line in targets.items()
        if layer_package(target) in APART.get(layer_package(name), ())
    ]
    assert not wrong, "imports between packages kept apart:\n" + "\n".join(wrong)


def find_cycle(graph: dict[str, dict[str, int]]) -> list[str] | None:
    """One cycle of ``graph`` as ``[a, b, ..., a]``, or ``None`` (depth-first search)."""
    state: dict[str, str] = {}  # "open" while on the current path, "done" once fully explored
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        path.append(node)
        for target in graph.get(node, {}):
            if state.get(target) == "open":
                return [*path[path.index(target):], target]
            if target not in state and (cycle := visit(target)):
                return cycle
        path.pop()
        state[node] = "done"
        return None

    for node in graph:
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_no_import_cycles_not_even_lazy_ones() -> None:
    cycle = find_cycle(GRAPH)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


@pytest.mark.parametrize(("graph", "expected"), [
    ({"a": {"b": 1}, "b": {"c": 1}, "c": {}}, None),
    ({"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}}, ["a", "b", "c", "a"]),
    ({"a": {"b": 1}, "b": {"b2": 1}, "b2": {"b": 1}}, ["b", "b2", "b"]),
])
def test_the_cycle_finder_finds_cycles(graph: dict[str, dict[str, int]], expected: list[str] | None) -> None:
    assert find_cycle(graph) == expected


def test_every_import_by_name_is_in_the_graph() -> None:
    assert {name for name in MODULES if loads_by_name(name)} == set(BY_NAME)


def test_no_command_imports_the_entry_point_back() -> None:
    # vitkit.cli.main loads every command's module by name; they run through vitkit.cli.commands, below it.
    assert "vitkit.cli.attention_maps" in GRAPH["vitkit.cli.main"]
    assert [name for name, targets in GRAPH.items() if "vitkit.cli.main" in targets] == ["vitkit.__main__"]  # python -m


def test_the_graph_sees_in_function_and_relative_imports() -> None:
    # vitkit/data/shapes.py imports .transforms inside a constructor (albumentations loads lazily);
    # vitkit/train/checkpoint.py imports ..io at the top.
    assert "vitkit.data.transforms" in GRAPH["vitkit.data.shapes"]
    assert "vitkit.io" in GRAPH["vitkit.train.checkpoint"]
    assert "vitkit.models.config" in GRAPH["vitkit.models"]


@pytest.mark.parametrize(("module", "loads"), [
    ("vitkit.data", False), ("vitkit.explain", False), ("vitkit.io", False), ("vitkit.inference", False),
    ("vitkit.prune", False), ("vitkit.bench.models", False), ("vitkit.train", True),
])
def test_only_train_loads_lightning(module: str, loads: bool) -> None:
    code = f"import sys, {module}; print(sorted(m for m in sys.modules if m.split('.')[0] in ('lightning', 'pytorch_lightning')))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(PACKAGE.parent), "PATH": ""}, check=True)
    assert (done.stdout.strip() != "[]") == loads


def test_the_commands_that_train_nothing_load_no_lightning() -> None:
    # Each command's module imported and its --help run, in a fresh process: the data a model was
    # trained on comes from vitkit.data, not from the trainer's package.
    commands = {"maps": "attention_maps", "report": "attention_report", "faithfulness": "faithfulness", "explore": "explore"}
    code = (
        "import importlib, sys\nfrom vitkit.cli.main import main\n"
        f"for command, module in {commands!r}.items():\n"
        "    importlib.import_module('vitkit.cli.' + module)\n"
        "    try:\n        main([command, '--help'])\n    except SystemExit as done:\n        assert done.code == 0\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('lightning', 'pytorch_lightning')))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180,
                          env={"PYTHONPATH": str(PACKAGE.parent), "PATH": "", "NO_ALBUMENTATIONS_UPDATE": "1"}, check=True)
    assert "usage: vitkit maps" in done.stdout
    assert done.stdout.strip().splitlines()[-1] == "[]"
