"""vitkit.timing.op_wall_times: each ATen operator's wall time within one call."""

from __future__ import annotations

import itertools

import torch

from vitkit.timing import OpClock, op_wall_times


def test_each_operator_gets_the_time_read_around_its_calls() -> None:
    ticks = itertools.count()  # every clock read is one second later than the last
    a, b = torch.ones(2, 2), torch.ones(2, 2)

    def call() -> None:
        torch.mm(a, b)
        a + b
        a + b

    total, seconds = op_wall_times(call, clock=lambda: float(next(ticks)))
    # reads: start 0; mm 1-2; add 3-4; add 5-6; end 7
    assert seconds == {"aten.mm": 1.0, "aten.add": 2.0}
    assert total == 7.0


def test_the_backward_operators_are_timed_too() -> None:
    x = torch.ones(3, requires_grad=True)
    _, seconds = op_wall_times(lambda: (x * 2).sum().backward())
    assert {"aten.mul", "aten.sum", "aten.expand"} <= set(seconds)  # expand: the sum's backward
    assert torch.equal(x.grad, torch.full((3,), 2.0))


def test_a_key_names_the_calls_it_keeps_and_counts_them() -> None:
    ticks = itertools.count()
    a = torch.ones(2, 2)
    keep_mm = OpClock(clock=lambda: float(next(ticks)), key=lambda func, args: tuple(args[0].shape) if func.overloadpacket.__name__ == "mm" else None)
    with keep_mm:
        torch.mm(a, a)
        a + a  # left out
        torch.mm(a[:1], a)
    assert keep_mm.seconds == {(2, 2): 1.0, (1, 2): 1.0} and keep_mm.calls == {(2, 2): 1, (1, 2): 1}
