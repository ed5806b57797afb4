"""``magi_code.dataclass`` behaves as the standard library's ``@dataclass`` for what the
product uses, and the product uses it everywhere."""

from __future__ import annotations

import ast
import copy
import dataclasses
import inspect
import itertools
import pickle
import typing
from pathlib import Path
from typing import Any

import pytest

import magi_code
from magi_code.dataclass import dataclass, field
from tests.support.product_source import parsed_modules

OPTIONS = [
    dict(zip(("frozen", "slots", "eq", "kw_only"), values, strict=True))
    for values in itertools.product((False, True), repeat=4)
]


def both(options: dict[str, bool]) -> tuple[type, type]:
    """The same class body made by the standard library and by ours."""

    def body() -> type:
        class Point:
            x: int
            y: str = "y"
            tags: list[str] = dataclasses.field(default_factory=list)
            secret: str = dataclasses.field(default="", repr=False)

        return Point

    return dataclasses.dataclass(**options)(body()), dataclass(**options)(body())


def outcome(action: Any) -> Any:
    try:
        return ("value", action())
    except Exception as exc:  # the kind of failure is what is compared
        return ("raised", type(exc))


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: ",".join(k for k, v in o.items() if v))
def test_a_class_behaves_as_the_standard_librarys(options: dict[str, bool]) -> None:
    theirs, ours = both(options)
    assert str(inspect.signature(ours)) == str(inspect.signature(theirs))
    assert ours.__match_args__ == theirs.__match_args__
    assert hasattr(ours, "__slots__") == hasattr(theirs, "__slots__") == options["slots"]
    assert [(f.name, f.default, f.kw_only) for f in dataclasses.fields(ours)] == [
        (f.name, f.default, f.kw_only) for f in dataclasses.fields(theirs)
    ]
    kw = options["kw_only"]

    def make(cls: type, x: int, y: str = "y") -> Any:
        return cls(x=x, y=y, secret="s") if kw else cls(x, y, secret="s")

    a, b, c = make(ours, 1), make(ours, 1), make(ours, 2)
    ta, tb, tc = make(theirs, 1), make(theirs, 1), make(theirs, 2)
    assert repr(a).replace(ours.__qualname__, "") == repr(ta).replace(theirs.__qualname__, "")
    assert "secret" not in repr(a)
    assert (a == b, a == c, a != b, a == object()) == (ta == tb, ta == tc, ta != tb, ta == object())
    # Hashable (or not: a frozen one holds a list) as theirs.
    assert outcome(lambda: hash(a))[0] == outcome(lambda: hash(ta))[0]
    assert outcome(lambda: setattr(a, "x", 5)) == outcome(lambda: setattr(ta, "x", 5))
    assert outcome(lambda: delattr(b, "y")) == outcome(lambda: delattr(tb, "y"))
    assert outcome(lambda: setattr(c, "other", 1))[0] == outcome(lambda: setattr(tc, "other", 1))[0]
    fresh = make(ours, 3)
    assert fresh.tags == [] and fresh.tags is not make(ours, 3).tags
    changed = dataclasses.replace(fresh, y="z")
    assert (changed.x, changed.y) == (3, "z")
    assert dataclasses.asdict(fresh) == {"x": 3, "y": "y", "tags": [], "secret": "s"}


@dataclass(frozen=True, slots=True)
class Frozen:
    name: str
    items: tuple[int, ...] = ()


@dataclass(slots=True)
class Mutable:
    name: str
    count: int = 0


def test_frozen_values_hash_by_their_fields_and_mutable_ones_not_at_all() -> None:
    assert hash(Frozen("a", (1,))) == hash(Frozen("a", (1,)))
    assert len({Frozen("a"), Frozen("a"), Frozen("b")}) == 2
    with pytest.raises(TypeError):
        hash(Mutable("a"))


@pytest.mark.parametrize("value", [Frozen("a", (1, 2)), Mutable("b", 3)])
def test_copies_and_pickles_are_equal(value: Any) -> None:
    for duplicate in (copy.copy(value), copy.deepcopy(value), pickle.loads(pickle.dumps(value))):
        assert duplicate == value and duplicate is not value


def test_post_init_runs_after_the_fields_are_set() -> None:
    seen: list[int] = []

    @dataclass(frozen=True)
    class Checked:
        n: int

        def __post_init__(self) -> None:
            seen.append(self.n)

    Checked(4)
    assert seen == [4]


def test_methods_the_class_defines_are_kept() -> None:
    @dataclass(frozen=True, slots=True)
    class Own:
        n: int

        def __repr__(self) -> str:
            return "own"

        def __eq__(self, other: object) -> bool:
            return True

        def __hash__(self) -> int:
            return 7

    assert (repr(Own(1)), Own(1) == Own(2), hash(Own(1))) == ("own", True, 7)


def test_eq_defined_alone_still_gets_the_frozen_hash() -> None:
    @dataclass(frozen=True)
    class Keyed:
        n: int

        def __eq__(self, other: object) -> bool:
            return isinstance(other, Keyed) and other.n == self.n

    assert hash(Keyed(1)) == hash(Keyed(1))


def test_a_subclass_has_its_parents_fields_first() -> None:
    @dataclass(frozen=True, kw_only=True)
    class Base:
        a: int = 0

    @dataclass(frozen=True, kw_only=True)
    class Child(Base):
        b: str = ""

    child = Child(a=1, b="x")
    assert repr(child) == "test_a_subclass_has_its_parents_fields_first.<locals>.Child(a=1, b='x')"
    assert child != Base(a=1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        child.a = 2  # type: ignore[misc]


def test_init_false_fields_are_refused() -> None:
    class Unsupported:
        n: int = field(default=0, init=False)

    with pytest.raises(TypeError, match="init=False"):
        dataclass(Unsupported)


def test_a_class_without_a_docstring_keeps_none() -> None:
    @dataclass
    class Bare:
        n: int

    assert Bare.__doc__ is None


def test_no_product_module_uses_the_standard_dataclass_decorator() -> None:
    # Start-up cost: each standard @dataclass compiles several methods (~0.35 ms a class).
    root = Path(magi_code.__file__).parent
    uses = []
    for path, tree in parsed_modules():
        if path == root / "dataclass.py":
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == "dataclasses":
                uses += [f"{path.name}: {a.name}" for a in node.names if a.name == "dataclass"]
            elif (
                isinstance(node, ast.Attribute)
                and node.attr == "dataclass"
                and isinstance(node.value, ast.Name)
                and node.value.id == "dataclasses"
            ):
                uses.append(f"{path.name}: dataclasses.dataclass")
    assert uses == []


def test_init_belongs_to_the_classs_module_and_its_hints_resolve() -> None:
    assert Frozen.__init__.__module__ == __name__
    assert typing.get_type_hints(Frozen.__init__) == {
        "name": str,
        "items": tuple[int, ...],
        "return": type(None),
    }


def test_frozen_and_mutable_dataclasses_are_not_mixed() -> None:
    with pytest.raises(TypeError, match="non-frozen dataclass from a frozen one"):

        @dataclass
        class MutableChild(Frozen):
            extra: int = 0

    with pytest.raises(TypeError, match="frozen dataclass from a non-frozen one"):

        @dataclass(frozen=True)
        class FrozenChild(Mutable):
            extra: int = 0


@dataclass(frozen=True)
class FrozenSubclass(Frozen):
    extra: int = 0


def test_a_subclass_of_a_slotted_frozen_class_copies_and_pickles_its_own_fields() -> None:
    value = FrozenSubclass("a", (1,), 7)
    for duplicate in (copy.copy(value), copy.deepcopy(value), pickle.loads(pickle.dumps(value))):
        assert duplicate == value and duplicate.extra == 7
