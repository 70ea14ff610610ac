"""The registry of training objectives, by the name a recipe gives in ``task.name``.

A task is a :class:`~vitkit.tasks.Task` subclass registered under a name, as blocks, attention
layers and MLPs are (:mod:`vitkit.layers.parts`)::

    @register_task("rotation")
    class RotationTask(Task):
        ...

Registering it in a script before :func:`vitkit.train.train` is all a recipe needs to run it
(``task: {name: rotation, rotation: {...}}``): the recipe's ``task.<name>`` section is parsed with
the task's :attr:`~vitkit.tasks.Task.Options`, and the rest of the run reads the task's
capabilities, never its name.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from typing import TypeVar

from ..errors import VitkitError
from .base import Task

TaskT = TypeVar("TaskT", bound=type[Task])
_TASKS: dict[str, type[Task]] = {}


class UnknownTaskError(VitkitError, ValueError):
    """A ``task.name`` that no task is registered under."""


def register_task(name: str) -> Callable[[TaskT], TaskT]:
    """Class decorator: make a :class:`~vitkit.tasks.Task` subclass the recipe's ``task.name: name``.

    Raises:
        ValueError: ``name`` is taken by another class, or is no plain lower-case identifier (it
            is a recipe key, ``task.<name>``).
    """
    if not name.isidentifier() or name != name.lower():
        raise ValueError(f"a task name is a recipe key (task.<name>): a lower-case identifier, got {name!r}.")

    def add(cls: TaskT) -> TaskT:
        if not (isinstance(cls, type) and issubclass(cls, Task)):
            raise TypeError(f"register_task({name!r}) takes a subclass of vitkit.tasks.Task, got {cls!r}.")
        known = _TASKS.get(name)
        if known is not None and known is not cls:
            raise ValueError(f"task name {name!r} is already registered to {known.__qualname__}; choose another name.")
        cls.name = name
        _TASKS[name] = cls
        return cls

    return add


def task_names() -> list[str]:
    """The registered task names, sorted."""
    return sorted(_TASKS)


def get_task(name: str) -> type[Task]:
    """The task class registered as ``name``; a one-line :class:`UnknownTaskError` naming the
    registered ones otherwise."""
    try:
        return _TASKS[name]
    except KeyError:
        names = task_names()
        close = difflib.get_close_matches(name, names, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise UnknownTaskError(
            f"{name!r} is not a registered task (known: {', '.join(names)}).{hint} Register your Task subclass "
            f"with @vitkit.tasks.register_task({name!r}) before training."
        ) from None
