"""Fewer Lightning hook calls per training step (the host work of a small step).

Lightning 2.6 calls each per-step hook on every callback, whether or not the callback's class
implements it: for each call it formats a debug message and a profiler label (ModelCheckpoint's
``state_key`` renders a dict), enters the profiler's context and sets the module's
``_current_fx_name`` twice, about 1.5-2 us for a hook that does nothing. A vitkit run has 7-9
callbacks and 6 per-step hooks: about 40 such calls a step. Lightning skips a hook attribute that
is not callable (``lightning/pytorch/trainer/call.py``: ``if callable(fn)``, reached through
:mod:`vitkit.train.lightning_compat`), so the hooks a
callback leaves as Lightning's no-op are set to ``None`` on that instance, and the module's no-op
per-step hooks likewise. Nothing else changes: a ``None`` hook is exactly a call that did nothing.
The installed Lightning's dispatcher is probed for that rule once per process; one without it gets
every hook as before.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from types import SimpleNamespace

import lightning as L
from lightning.pytorch.profilers import PassThroughProfiler

from .lightning_compat import HOOK_NAME_ATTRIBUTE, call_callback_hooks, call_module_hook

#: The hooks Lightning calls on every callback, and on the module, at every training step; each
#: returns nothing in Lightning's base classes.
STEP_HOOKS = (
    "on_train_batch_start",
    "on_before_backward",
    "on_after_backward",
    "on_before_zero_grad",
    "on_before_optimizer_step",
    "on_train_batch_end",
)


def skip_idle_step_hooks(callbacks: Iterable[L.Callback], module: L.LightningModule) -> None:
    """Set to ``None``, on each of ``callbacks`` and on ``module``, the :data:`STEP_HOOKS` whose
    class keeps the base class's no-op, so that Lightning's per-step dispatch passes them over.

    Only objects the run itself built should be given: a user's callback keeps its hooks callable.
    Does nothing where the installed Lightning would call a ``None`` hook
    (:func:`lightning_skips_none_hooks`).
    """
    if not lightning_skips_none_hooks():
        return
    for callback in callbacks:
        _skip(callback, L.Callback)
    _skip(module, L.LightningModule)


def _skip(instance: object, base: type) -> None:
    for hook in STEP_HOOKS:
        if getattr(type(instance), hook) is getattr(base, hook):
            setattr(instance, hook, None)


@functools.cache
def lightning_skips_none_hooks() -> bool:
    """Whether the installed Lightning's hook dispatch (callbacks and module) passes over a hook
    attribute that is ``None``, as 2.6 does: probed on stand-ins for a callback, a module and a
    trainer."""
    class Probe:
        state_key = "probe"
        on_train_batch_start = None

    module = SimpleNamespace(on_train_batch_start=None, **{HOOK_NAME_ATTRIBUTE: None})
    trainer = SimpleNamespace(callbacks=[Probe()], lightning_module=module, profiler=PassThroughProfiler())
    try:
        call_callback_hooks(trainer, "on_train_batch_start", None, 0)
        call_module_hook(trainer, "on_train_batch_start", None, 0, pl_module=module)
    except Exception:  # noqa: BLE001 - any failure means the rule is not there: skip nothing
        return False
    return True
