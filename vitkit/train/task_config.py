"""The recipe's ``task`` section (:class:`TaskConfig`): the name of a registered training task
(:mod:`vitkit.tasks.registry`) and its options, parsed with the task's own options dataclass."""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Any

from ..schema import MAX_EPOCHS, Config, FieldError, bounds, build, describe
from ..tasks import Task, get_task, task_names


@dataclass(init=False, eq=False)
class TaskConfig(Config):
    """The training objective: a task registered under ``name`` (:func:`vitkit.tasks.task_names`:
    the shipped ones, listed in docs/tasks.md, and any registered in the user's script) and its
    options, the section ``task.<name>`` (parsed with the task's :attr:`~vitkit.tasks.Task.Options`).

    Attributes:
        name: the registered task's name; what it trains and which recipe sections it reads are the
            task's (its class's docstring and capabilities).
        options: the named task's options (its section, or its defaults).
        knn_every: a task that releases an encoder also measures the weighted k-NN accuracy of its
            features (:mod:`vitkit.train.pretraining`) every this many epochs (``null``: at the end only).
        linear_probe: such a task also fits a linear classifier on the encoder's frozen features at
            the end (``summary.json``'s ``linear_probe_acc1``; seconds, labels used for it only).
        knn_root: a labelled image folder (class folders) for those measurements instead of the
            training data's labels: a flat folder of unlabelled images gets a quality number too.
    """

    name: str = "classify"
    knn_every: int | None = field(default=None, metadata=bounds(ge=1, le=MAX_EPOCHS))
    linear_probe: bool = False
    knn_root: str | None = None

    def __init__(
        self, name: str = "classify", knn_every: int | None = None, linear_probe: bool = False,
        knn_root: str | None = None, **options: Config | dict[str, Any],
    ) -> None:
        self.name, self.knn_every, self.linear_probe, self.knn_root = name, knn_every, linear_probe, knn_root
        self._given = options
        self.__post_init__()

    @classmethod
    def sections(cls) -> dict[str, type[Config]]:
        """Each registered task's options section, by the task's name."""
        return {name: get_task(name).Options for name in task_names()}

    def section_values(self) -> dict[str, Config]:
        return {self.name: self.options}

    @property
    def task_class(self) -> type[Task]:
        """The registered :class:`~vitkit.tasks.Task` subclass ``name`` names."""
        return get_task(self.name)

    def validate(self) -> None:
        """A registered task, options of that task only (another's would be ignored: refused), and
        the k-NN options only for a task that releases an encoder.

        Raises:
            FieldError: one line naming the key.
        """
        if self.name not in task_names():
            close = difflib.get_close_matches(self.name, task_names(), n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise FieldError("name", f"is {describe(self.name, with_type=False)}, which is no registered task (known: "
                             f"{', '.join(task_names())}).{hint}")
        sections = self.sections()
        unknown = [key for key in self._given if key not in sections]
        if unknown:
            raise FieldError(unknown[0], f"is no registered task's section (known: {', '.join(sections)}).")
        given = {key: value if isinstance(value, Config) else build(sections[key], value, source="the arguments",
                                                                      path=f"{key}.")
                 for key, value in self._given.items()}
        self.options = given.get(self.name) or self.task_class.Options()
        unused = [f"task.{key}" for key, value in given.items() if key != self.name and value != sections[key]()]
        if not self.task_class.releases_encoder:
            unused += [f"task.{key}" for key in ("knn_every", "linear_probe", "knn_root") if getattr(self, key) not in (None, False)]
        if unused:
            raise FieldError(
                "name", f"is {self.name!r}, which does not read {', '.join(unused)}: remove those options, or set "
                "task.name to the task they configure."
            )

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TaskConfig) and self.to_dict() == other.to_dict()
