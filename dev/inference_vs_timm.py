"""Issue 50 item 4: vitkit's inference forward against timm's, on an idle and on a busy machine.

    python dev/inference_vs_timm.py --repeats 15 --busy 0 2     # idle, then beside two other torch jobs

ViT-S/16 at 224 px, batch 32 (and any ``--models NAME:BATCH[:overrides]``), random weights shared
by both libraries (``vitkit.models.to_timm``), float32 and bfloat16 autocast, in inference mode.
Four callers run interleaved in each round (:func:`vitkit.timing.interleaved_times`, the order
alternating), so drift and the other jobs weigh on all alike:

* **timm**: timm's ``VisionTransformer`` forward;
* **vitkit**: vitkit's model forward (``attn_impl="auto"``: the kernel it measures and chooses);
* **vitkit.predict path**: :func:`vitkit.evaluation.predict` under
  :func:`vitkit.evaluation.inference_context`, what ``vitkit predict`` and ``vitkit evaluate`` run;
* **vitkit, MLP unfused**: vitkit's forward with the MLP's projection and GELU as two operators
  (:func:`vitkit.kernels.linear_gelu.unfused`), what it ran before the fused call.

These four share one process and so one allocator. Two more columns compare processes as users
run them: a **vitkit process** that called :func:`vitkit.keep_freed_memory` (as every ``vitkit``
command does) against a **timm process** with glibc's defaults, each a child process running one
forward when the parent asks, the parent alternating which goes first.

``--busy N`` starts N other processes first, each a loop of 1024x1024 float32 matmuls on 2 threads
(another torch job on the same cores), and stops them after that condition's cells. Prints one
Markdown table: images/s of each caller and the medians over rounds of timm's time over vitkit's
(> 1: vitkit is faster), per condition, model and precision; then the attention kernel vitkit's
autotuner chose for each key, with the times behind the choice.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from functools import partial
from multiprocessing.connection import Connection

import torch

import vitkit
from vitkit.bench.specs import parse_model_spec
from vitkit.bench.steps import make_step
from vitkit.evaluation import inference_context, predict
from vitkit.kernels import autotune_report, format_autotune_report, linear_gelu
from vitkit.models import to_timm
from vitkit.timing import interleaved_times, median_ratio

PRECISIONS = ("fp32", "bf16")


def _matmul_loop(threads: int) -> None:
    """Another torch job: matmuls until killed."""
    torch.set_num_threads(threads)
    a = torch.randn(1024, 1024)
    while True:
        a = (a @ a).tanh_()


@contextlib.contextmanager
def busy(jobs: int, threads: int = 2) -> Iterator[None]:
    """``jobs`` other torch processes on the machine while the block runs."""
    context = multiprocessing.get_context("spawn")
    workers = [context.Process(target=_matmul_loop, args=(threads,), daemon=True) for _ in range(jobs)]
    for worker in workers:
        worker.start()
    time.sleep(3 if jobs else 0)  # let them start computing
    try:
        yield
    finally:
        for worker in workers:
            worker.terminate()
            worker.join()


def callers(spec: str, precision: str) -> tuple[dict[str, Callable[[], object]], int]:
    """The four forwards of one model spec in one precision, and its batch size."""
    name, batch_size, overrides = parse_model_spec(spec)
    torch.manual_seed(0)
    ours = vitkit.create_model(name, **overrides)
    theirs = to_timm(ours)
    images = torch.randn(batch_size, ours.config.in_chans, *ours.config.img_size)
    labels = torch.zeros(batch_size, dtype=torch.long)  # unused by a forward

    def vitkit_predict() -> object:
        with inference_context(ours, precision):
            return predict(ours, images)

    forward = make_step(ours, images, labels, "forward", precision)

    def vitkit_unfused() -> object:
        with linear_gelu.unfused():
            return forward()

    return {"timm": make_step(theirs, images, labels, "forward", precision), "vitkit": forward,
            "vitkit.predict path": vitkit_predict, "vitkit, MLP unfused": vitkit_unfused}, batch_size


def _forward_server(spec: str, precision: str, library: str, threads: int, keep: bool, pipe: Connection) -> None:
    """A child process: one forward of ``library``'s model per message, answering its seconds."""
    if keep:
        vitkit.keep_freed_memory()
    torch.set_num_threads(threads)
    calls, _ = callers(spec, precision)
    call = calls[library]
    while pipe.recv():
        started = time.perf_counter()
        call()
        pipe.send(time.perf_counter() - started)


def process_times(spec: str, precision: str, repeats: int, threads: int) -> dict[str, list[float]]:
    """Seconds per forward of a vitkit process (freed memory kept) and a timm process (glibc's
    defaults), interleaved: two warm-up calls each, then ``repeats`` rounds, the order alternating."""
    context = multiprocessing.get_context("spawn")
    arms = {"vitkit process": ("vitkit", True), "timm process": ("timm", False)}
    pipes, workers = {}, []
    for arm, (library, keep) in arms.items():
        parent, child = context.Pipe()
        worker = context.Process(target=_forward_server, args=(spec, precision, library, threads, keep, child), daemon=True)
        worker.start()
        pipes[arm] = parent
        workers.append(worker)

    def ask(arm: str) -> float:
        pipes[arm].send(True)
        return pipes[arm].recv()

    try:
        return interleaved_times({arm: partial(ask, arm) for arm in arms}, repeats=repeats, warmup=2)
    finally:
        for arm in arms:
            pipes[arm].send(False)
        for worker in workers:
            worker.join()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["vit_small_patch16_224:32"], help="NAME:BATCH[:overrides]")
    parser.add_argument("--repeats", type=int, default=15, help="interleaved rounds per cell")
    parser.add_argument("--busy", type=int, nargs="+", default=[0, 2], help="other torch jobs per condition")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(f"# {os.cpu_count()} CPUs, torch {torch.__version__}, {args.threads} threads, {args.repeats} rounds", flush=True)
    rows = ["| machine | model | batch | precision | timm img/s | vitkit img/s | vitkit.predict img/s | "
            "vitkit / timm | predict path / timm | vitkit / vitkit unfused | vitkit process / timm process |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for jobs in args.busy:
        condition = "idle" if jobs == 0 else f"{jobs} other torch jobs"
        with busy(jobs):
            for spec in args.models:
                for precision in PRECISIONS:
                    calls, batch_size = callers(spec, precision)
                    times = interleaved_times(calls, repeats=args.repeats, warmup=2)
                    ips = {name: batch_size / statistics.median(values) for name, values in times.items()}
                    processes = process_times(spec, precision, args.repeats, args.threads)
                    rows.append(f"| {condition} | {spec} | {batch_size} | {precision} | {ips['timm']:.1f} | "
                                f"{ips['vitkit']:.1f} | {ips['vitkit.predict path']:.1f} | "
                                f"{median_ratio(times, 'timm', 'vitkit'):.2f} | "
                                f"{median_ratio(times, 'timm', 'vitkit.predict path'):.2f} | "
                                f"{median_ratio(times, 'vitkit, MLP unfused', 'vitkit'):.2f} | "
                                f"{median_ratio(processes, 'timm process', 'vitkit process'):.2f} |")
                    print(rows[-1], flush=True)
    print("\n".join(rows))
    print("\nThe attention kernel vitkit's autotuner chose (one process; later conditions reuse its choice):\n")
    print(format_autotune_report(autotune_report()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
