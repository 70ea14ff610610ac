"""``trainer.compile: auto``: the compiled and the eager model timed on the run's own steps, once
the attention kernel is chosen, and the faster kept; a fake clock decides which is faster, a
stand-in for ``nn.Module.compile`` keeps Inductor out of the unit tests."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from tiny_runs import tiny_recipe
from torch import nn

import vitkit
from vitkit.schema import RecipeError
from vitkit.train import compile_trial, train
from vitkit.train.compile_trial import COMPILE_MARGIN, CompileChooser
from vitkit.train.kernel_trial import MIN_PAIRS, STEPS_TO_CHOOSE, TrainingKernelChooser


class Holder(nn.Module):
    """What the choosers see of a LightningModule: the model under ``.model``."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.model = vitkit.create_model("vit_cifar_tiny", img_size=8, patch_size=4, embed_dim=32, depth=2,
                                         num_heads=2, num_classes=5).train()

    @property
    def step_model(self) -> nn.Module:
        return self.model


def fake_compile(model: nn.Module) -> None:
    """``nn.Module.compile``'s effect without Inductor: a compiled call that counts its calls."""
    eager = model._call_impl

    def compiled(*args: Any, **kwargs: Any) -> Any:
        compiled.calls += 1
        return eager(*args, **kwargs)

    compiled.calls = 0
    model._compiled_call_impl = compiled


def fake_trainer(step: int) -> SimpleNamespace:
    return SimpleNamespace(global_step=step, world_size=1, strategy=SimpleNamespace(broadcast=lambda obj, src: obj))


def run(seconds: Callable[[bool, str], float], steps: int, always: bool = False
        ) -> tuple[Holder, TrainingKernelChooser, CompileChooser, list]:
    """``steps`` training steps through both choosers; a step takes ``seconds(compiled, kernel)``
    on the fake clock. Returns the holder, both choosers and each step's (compiled, kernel, paused)."""
    holder, now = Holder(), [0.0]
    clock = lambda: now[0]  # noqa: E731
    kernels = TrainingKernelChooser(clock=clock, watch_drift=True)
    chooser = CompileChooser(kernels, clock=clock, compile_model=fake_compile, always=always)
    kernels.setup(None, holder, "fit")
    kernels.on_train_start(None, holder)
    chooser.setup(None, holder, "fit")
    batch = (torch.randn(4, 3, 8, 8), torch.randint(0, 5, (4,)))
    seen = []
    for step in range(steps):
        kernels.on_train_batch_start(fake_trainer(step), holder, batch, step)
        chooser.on_train_batch_start(fake_trainer(step), holder, batch, step)
        compiled, kernel = holder.model._compiled_call_impl is not None, holder.model.blocks[0].attn.attn_impl
        seen.append((compiled, kernel, kernels.paused))
        F.cross_entropy(holder.model(batch[0]), batch[1]).backward()
        now[0] += seconds(compiled, kernel)
        kernels.on_train_batch_end(fake_trainer(step + 1), holder, None, batch, step)
        chooser.on_train_batch_end(fake_trainer(step + 1), holder, None, batch, step)
    return holder, kernels, chooser, seen


TRIAL_STEPS = 1 + 2 * MIN_PAIRS  # the compiling step, then the pairs


def test_a_faster_compiled_step_is_kept_once_the_kernel_is_chosen() -> None:
    holder, kernels, chooser, seen = run(lambda compiled, kernel: (0.5 if compiled else 1.0) * (1.5 if kernel == "sdpa" else 1.0),
                                         STEPS_TO_CHOOSE + TRIAL_STEPS + 5)
    assert not any(compiled for compiled, _, _ in seen[:STEPS_TO_CHOOSE])  # eager while the kernel is measured
    trial = seen[STEPS_TO_CHOOSE : STEPS_TO_CHOOSE + TRIAL_STEPS]
    assert trial[0][0] is True  # the compiling step first
    assert sorted(compiled for compiled, _, _ in trial[1:]) == [False] * MIN_PAIRS + [True] * MIN_PAIRS
    assert all(paused and kernel == "explicit" for _, kernel, paused in trial)  # the chosen kernel, untimed
    assert all(compiled and not paused for compiled, _, paused in seen[STEPS_TO_CHOOSE + TRIAL_STEPS :])
    report = chooser.report()
    assert report["choice"] == "compiled" and report["round"]["step"] == STEPS_TO_CHOOSE
    assert report["round"]["median_ratio_eager_over_compiled"] == pytest.approx(2.0)
    (row,) = kernels.report()["keys"]
    assert all(round_["step"] >= STEPS_TO_CHOOSE + TRIAL_STEPS for round_ in row["remeasured"])  # no drift read in the trial
    assert holder.model._compiled_call_impl.calls == MIN_PAIRS + 1 + 5


@pytest.mark.parametrize("compiled_s", [1.85, 1.0, 1.0 / (1.0 + COMPILE_MARGIN / 2)])
def test_a_slower_or_barely_faster_compiled_step_leaves_the_model_eager(compiled_s: float) -> None:
    holder, kernels, chooser, seen = run(lambda compiled, kernel: compiled_s if compiled else 1.0,
                                         STEPS_TO_CHOOSE + TRIAL_STEPS + 3)
    assert chooser.report()["choice"] == "eager"
    assert holder.model._compiled_call_impl is None and chooser.compiled_call is None
    assert [compiled for compiled, _, _ in seen[-3:]] == [False] * 3 and not kernels.paused


def test_compile_true_compiles_once_the_kernel_is_chosen_and_never_times_it() -> None:
    """``trainer.compile: true``: eager through the kernel trial (no graph per kernel), compiled
    from then on however slow, the kernel trial never paused."""
    holder, kernels, chooser, seen = run(lambda compiled, kernel: 3.0 if compiled else 1.0, STEPS_TO_CHOOSE + 6, always=True)
    assert [compiled for compiled, _, _ in seen] == [False] * STEPS_TO_CHOOSE + [True] * 6
    assert not any(paused for _, _, paused in seen)
    report = chooser.report()
    assert report["choice"] == "compiled" and report["round"]["pairs"] == [] and report["compile_s"] == 3.0


def test_without_a_cxx_compiler_auto_stays_eager_and_true_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compile_trial, "has_cxx_compiler", lambda: False)
    holder = Holder()
    auto = CompileChooser(TrainingKernelChooser())
    auto.setup(None, holder, "fit")
    assert auto.report() == {"choice": "eager", "compile_s": None, "round": None,
                             "reason": "no C++ compiler for Inductor on the CPU"}
    assert holder.model._compiled_call_impl is None
    with pytest.raises(RecipeError, match="trainer.compile=true on the CPU needs a C\\+\\+ compiler"):
        CompileChooser(TrainingKernelChooser(), always=True).setup(None, holder, "fit")


def test_a_run_with_compile_auto_reports_its_trial(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Through ``vitkit.train``: torch.compile's graph capture (the eager backend: no C compiler
    needed) timed against the eager model, its choice and pairs in ``summary.json``."""
    original = nn.Module.compile
    monkeypatch.setattr(nn.Module, "compile", lambda model: original(model, backend="eager"))
    steps = STEPS_TO_CHOOSE + TRIAL_STEPS + 2
    result = train(tiny_recipe(tmp_path, compile="auto", limit_train_batches=steps, limit_val_batches=1,
                               limit_test_batches=1, max_epochs=1))
    report = result.summary["compile"]
    assert report["choice"] in ("eager", "compiled") and len(report["round"]["pairs"]) == MIN_PAIRS
    assert result.summary["compiled"] is (report["choice"] == "compiled")


@pytest.mark.parametrize("stage", ["validation", "test", "predict"])
def test_evaluation_runs_eager_and_training_goes_back_to_the_choice(stage: str) -> None:
    holder, _, chooser, _ = run(lambda compiled, kernel: 3.0 if compiled else 1.0, STEPS_TO_CHOOSE + 2, always=True)
    compiled_call = holder.model._compiled_call_impl
    assert compiled_call is not None
    getattr(chooser, f"on_{stage}_start")(None, holder)
    assert holder.model._compiled_call_impl is None
    getattr(chooser, f"on_{stage}_end")(None, holder)
    assert holder.model._compiled_call_impl is compiled_call
    before = run(lambda compiled, kernel: 1.0, 2, always=True)  # before the choice: eager, evaluated eager
    before[2].on_validation_start(None, before[0])
    before[2].on_validation_end(None, before[0])
    assert before[0].model._compiled_call_impl is None


def test_a_compiled_run_compiles_no_graph_for_validation_or_test(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Through ``vitkit.train`` with ``trainer.compile: true`` (torch.compile's graph capture, a
    backend that counts the graphs it is given): the graphs of the training steps are all there
    is; validation and test (no-grad and inference mode, other batch sizes) add none."""
    graphs = []

    def counting_backend(graph: torch.fx.GraphModule, example_inputs: list) -> Callable[..., Any]:
        graphs.append(graph)
        return graph.forward

    original = nn.Module.compile
    monkeypatch.setattr(nn.Module, "compile", lambda model: original(model, backend=counting_backend))
    monkeypatch.setattr(compile_trial, "has_cxx_compiler", lambda: True)
    torch._dynamo.reset()

    class GraphsAfterTraining(L.Callback):
        def on_train_batch_end(self, *args: Any) -> None:
            self.count = len(graphs)

    after_training = GraphsAfterTraining()
    result = train(tiny_recipe(tmp_path, compile=True, limit_train_batches=STEPS_TO_CHOOSE + 4, limit_val_batches=3,
                               limit_test_batches=3, max_epochs=2), callbacks=[after_training])
    assert result.summary["compile"]["choice"] == "compiled"
    assert after_training.count >= 1  # the training steps ran the compiled model
    assert len(graphs) == after_training.count
