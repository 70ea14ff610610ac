"""Generated mutants: run mutmut over one module of vitkit with its subject tests, in a scratch copy.

    /tmp/mutvenv/bin/python dev/mutmut_run.py vitkit/explain/maps.py tests/explain/test_explain_maps.py ...
    /tmp/mutvenv/bin/python dev/mutmut_run.py MODULE TESTS ... --mutants NAME ...   # re-run some mutants
    /tmp/mutvenv/bin/python dev/mutmut_run.py --subject maps                           # a module of SUBJECTS

mutmut (https://pypi.org/project/mutmut/, 3.8.1) writes every small change it can make to the module
(an operator, a constant, a keyword argument dropped, ...), runs the tests that reach the changed
function, and calls a mutant killed when they fail. It runs from a Python that has both mutmut
and the project's packages: a throwaway venv, so mutmut stays out of the project's dependencies::

    python -m venv /tmp/mutvenv
    echo "import site; site.addsitedir('$(.venv/bin/python -c 'import site; print(site.getsitepackages()[0])')')" \\
        > "$(/tmp/mutvenv/bin/python -c 'import site; print(site.getsitepackages()[0])')/project_venv.pth"
    /tmp/mutvenv/bin/pip install mutmut==3.8.1

The working tree is copied (uncommitted tests included) to a temporary folder whose
``pyproject.toml`` gets a ``[tool.mutmut]`` section naming the module and the tests; mutmut runs
there under ``nice -n 10`` with one worker and one thread, so a shared machine's other work is not
slowed. The script prints each mutant's verdict, the counts, and with ``--diffs FILE`` writes every
survivor's diff to FILE for review (see docs/reliability.md for the per-module table).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

from mutation_check import ROOT, ignored

#: The modules measured in docs/reliability.md and the subject tests each runs with.
SUBJECTS: dict[str, tuple[str, tuple[str, ...]]] = {
    "maps": ("vitkit/explain/maps.py", (
        "tests/explain/test_explain_maps.py", "tests/explain/test_explain_merged_tokens.py",
        "tests/explain/test_explain_headless.py", "tests/explain/test_explain_readout.py",
        "tests/explain/test_explain_distilled_readout.py", "tests/explain/test_explain_prefix_tokens.py",
        # the command-line, explorer and faithfulness runs (8-30 s each) test the layers above maps
        "-k", "not converted_model and not explore and not faithfulness and not refuse_a_class_in_one_line")),
    "recovery": ("vitkit/prune/recovery.py", ("-m", "not slow", "tests/prune/test_prune_recover.py")),
    "multicrop": ("vitkit/data/multicrop.py", ("tests/data/test_multicrop.py", "tests/tasks/test_dino.py")),
    "knn": ("vitkit/train/knn.py", ("tests/train/test_knn.py",)),
    "mae": ("vitkit/tasks/mae.py", ("tests/tasks/test_mae.py", "tests/tasks/test_mae_refusals.py",
                                   "tests/train/test_task_refusals.py")),
    "dino": ("vitkit/tasks/dino.py", ("tests/tasks/test_dino.py", "tests/train/test_task_refusals.py")),
    "dino_options": ("vitkit/tasks/dino_options.py", ("tests/tasks/test_dino_options.py", "tests/tasks/test_dino.py",
                                                  "tests/train/test_task_refusals.py")),
    "classify": ("vitkit/tasks/classify.py", ("tests/tasks/test_classify.py", "tests/train/test_task_refusals.py")),
    "registry": ("vitkit/tasks/registry.py", ("tests/tasks/test_registry.py", "tests/train/test_task_refusals.py")),
    # the timm ViT-S/16 comparison (25 s) repeats the tiny models' check at a larger size
    "token_merging": ("vitkit/layers/token_merging.py", (
        "tests/models/test_token_merging.py", "tests/models/test_token_merging_contract.py",
        "tests/models/test_token_unmerging.py", "tests/models/test_token_merging_edges.py",
        "-k", "not vit_small_patch16_224")),
    # the training runs (5-18 s each) leave out all but the refusals, the time budget and the unlabeled folder
    "fixmatch": ("vitkit/tasks/fixmatch.py", (
        "tests/tasks/test_fixmatch.py", "tests/tasks/test_fixmatch_recipe.py", "tests/tasks/test_fixmatch_training.py",
        "-k", "not an_epoch_passes and not mu_sets_the_epochs and not pure_bfloat16")),
    "randaugment": ("vitkit/data/randaugment.py", ("tests/data/test_randaugment.py",)),
    "flexmatch": ("vitkit/tasks/flexmatch.py", ("tests/tasks/test_flexmatch.py",)),
    "dist_align": ("vitkit/tasks/dist_align.py", ("tests/tasks/test_dist_align.py",)),
    "ijepa_masks": ("vitkit/tasks/ijepa_masks.py", ("tests/tasks/test_ijepa.py",)),
    "ijepa": ("vitkit/tasks/ijepa.py", ("tests/tasks/test_ijepa.py", "tests/train/test_ijepa_pretraining.py",
                                       "-k", "not releases_the_target_encoder and not resumes")),
    "base": ("vitkit/tasks/base.py", ("tests/tasks/test_task_base.py", "tests/train/test_task_slot.py")),
}


def mutmut_section(module: str, tests: list[str]) -> str:
    """The ``[tool.mutmut]`` table that restricts mutmut to ``module`` and ``tests``."""
    quoted = ", ".join(f'"{test}"' for test in tests)
    return (f'\n[tool.mutmut]\nsource_paths = ["vitkit"]\nonly_mutate = ["{module}"]\n'
            f'pytest_add_cli_args_test_selection = [{quoted}]\npytest_add_cli_args = ["-p", "no:cacheprovider"]\n'
            'also_copy = ["tests", "recipes"]\n')  # the recipes link: tests that load a shipped recipe by path


def verdicts(work: Path, env: dict[str, str]) -> dict[str, str]:
    """mutmut's verdict per mutant name (``killed``, ``survived``, ``timeout``, ...)."""
    done = subprocess.run([sys.executable, "-m", "mutmut", "results", "--all", "true"], cwd=work, env=env,
                          capture_output=True, text=True, check=True)
    found = (re.match(r"\s*(\S+): (.+)$", line) for line in done.stdout.splitlines())
    return {match[1]: match[2].strip() for match in found if match}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("module", nargs="?", help="the file to mutate, e.g. vitkit/explain/maps.py")
    parser.add_argument("tests", nargs="*", help="its subject tests (files or file::test; pytest options too)")
    parser.add_argument("--subject", choices=sorted(SUBJECTS), help="a module and its tests from SUBJECTS")
    parser.add_argument("--mutants", nargs="+", default=[], metavar="NAME", help="run only these mutants")
    parser.add_argument("--diffs", type=Path, help="write each survivor's diff to this file")
    args = parser.parse_args(argv)
    module, tests = SUBJECTS[args.subject] if args.subject else (args.module, args.tests)
    if not module or not tests:
        parser.error("give a module and its tests, or --subject")
    try:
        import mutmut  # noqa: F401  (run from the venv that has it)
    except ImportError:
        print(f"error: mutmut is not importable from {sys.executable}; see this script's docstring.", file=sys.stderr)
        return 2
    env = {**os.environ, "NO_ALBUMENTATIONS_UPDATE": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    env.pop("PYTHONPATH", None)
    with tempfile.TemporaryDirectory(prefix="vitkit-mutmut-") as tmp:
        work = Path(tmp) / "repo"
        shutil.copytree(ROOT, work, ignore=ignored)
        with (work / "pyproject.toml").open("a") as pyproject:
            pyproject.write(mutmut_section(module, list(tests)))
        run = subprocess.run(["nice", "-n", "10", sys.executable, "-m", "mutmut", "run", "--max-children", "1",
                              *args.mutants], cwd=work, env=env, capture_output=True, text=True)
        if run.returncode != 0:  # e.g. a subject test that fails before any mutation
            print(f"error: mutmut run failed (exit {run.returncode}):\n{(run.stdout + run.stderr)[-3000:]}", file=sys.stderr)
            return 1
        found = verdicts(work, env)
        if args.mutants:
            found = {name: verdict for name, verdict in found.items() if name in args.mutants}
        survivors = [name for name, verdict in found.items() if verdict != "killed"]
        if args.diffs:
            shows = (subprocess.run([sys.executable, "-m", "mutmut", "show", name], cwd=work, env=env,
                                    capture_output=True, text=True).stdout for name in survivors)
            args.diffs.write_text("\n".join(f"# {name}\n{show}" for name, show in zip(survivors, shows)))
    for name, verdict in found.items():
        print(f"{verdict:10} {name}")
    counts = Counter(found.values())
    print(f"\n{module}: {len(found)} mutants, {counts['killed']} killed, {len(survivors)} not killed "
          f"({', '.join(f'{n} {v}' for v, n in counts.items() if v != 'killed') or 'none'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
