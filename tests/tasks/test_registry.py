"""The task registry (``vitkit.tasks.registry``): names are recipe keys, a name belongs to one
class, an unknown name is refused in one line that lists the registered ones and the closest."""

from __future__ import annotations

import pytest
from tiny_runs import shipped_tasks

from vitkit.errors import VitkitError
from vitkit.tasks import Task, registry
from vitkit.tasks.registry import UnknownTaskError, get_task, register_task, task_names


@pytest.fixture(autouse=True)
def scratch_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test registers into a copy of the shipped tasks: they stay as they were, and other test
    files' tasks are not in it."""
    monkeypatch.setattr(registry, "_TASKS", shipped_tasks())


@pytest.mark.parametrize("name", ["Rotation", "two words", "3d", "jigsaw-puzzle"])
def test_a_name_must_be_a_lower_case_identifier(name: str) -> None:
    with pytest.raises(ValueError) as caught:
        register_task(name)
    assert str(caught.value) == f"a task name is a recipe key (task.<name>): a lower-case identifier, got {name!r}."


def test_a_registered_task_is_found_by_its_name_which_it_learns() -> None:
    @register_task("rotation")
    class Rotation(Task):
        pass

    assert get_task("rotation") is Rotation and Rotation.name == "rotation"
    register_task("affine")(type("Affine", (Task,), {}))  # registered last, listed first
    names = task_names()
    assert names[0] == "affine" and names == sorted(names) and {"classify", "dino", "mae", "rotation"} <= set(names)
    assert register_task("rotation")(Rotation) is Rotation  # the same class again (a module imported twice)


def test_a_name_belongs_to_one_class_and_only_tasks_register() -> None:
    @register_task("rotation")
    class Rotation(Task):
        pass

    class Other(Task):
        pass

    with pytest.raises(ValueError) as caught:
        register_task("rotation")(Other)
    assert str(caught.value) == ("task name 'rotation' is already registered to "
                                 "test_a_name_belongs_to_one_class_and_only_tasks_register.<locals>.Rotation; choose another name.")
    assert get_task("rotation") is Rotation and getattr(Other, "name", None) != "rotation"
    for thing in (object, 3):
        with pytest.raises(TypeError) as refused:
            register_task("thing")(thing)
        assert str(refused.value) == f"register_task('thing') takes a subclass of vitkit.tasks.Task, got {thing!r}."
    assert "thing" not in task_names()


def test_an_unknown_name_is_refused_with_the_known_ones_and_the_closest() -> None:
    known = ", ".join(sorted(registry._TASKS))
    with pytest.raises(UnknownTaskError) as caught:
        get_task("dinoo")
    assert isinstance(caught.value, VitkitError)
    assert str(caught.value) == (f"'dinoo' is not a registered task (known: {known}). Did you mean 'dino'? Register your "
                                 "Task subclass with @vitkit.tasks.register_task('dinoo') before training.")
    with pytest.raises(UnknownTaskError) as far:
        get_task("zzzz")
    assert str(far.value).startswith(f"'zzzz' is not a registered task (known: {known}). Register your")
