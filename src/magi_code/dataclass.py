"""``@dataclass``, defined in a fraction of the standard library's time.

The product defines over a hundred dataclasses, most of them while the service starts. The
standard library writes and compiles the source of every method it adds to each of them
(``__init__``, ``__repr__``, ``__eq__``, and for a frozen class ``__hash__``,
``__setattr__`` and ``__delattr__``): about 0.35 ms a class, a third of the service's
import time. Here the standard library still makes the class a dataclass (its fields,
``__slots__``, ``__match_args__``; ``fields``, ``replace`` and ``asdict`` work as ever),
but adds no method: ``__init__`` is compiled alone (in the class's module, as the
standard library does), and the rest are shared functions bound to the class's field
names, none compiled.

The behaviour is the standard library's for what the product uses: ``frozen``, ``slots``,
``eq``, ``kw_only``, defaults, ``field(default_factory=..., repr=False, compare=False)``,
``__post_init__``, inheritance (frozen and mutable dataclasses are not mixed). A method
the class defines itself is kept. Not supported: ``order``, ``unsafe_hash``, ``InitVar``,
``field(hash=...)``, a recursion guard in ``__repr__``, and ``init=False`` fields (refused
with ``TypeError`` when the class is defined). ``__dataclass_params__`` describes what the
standard library generated, which is nothing; an undocumented class keeps ``__doc__``
``None``.
"""

from __future__ import annotations

import dataclasses
import operator
import sys
import weakref
from collections.abc import Callable
from dataclasses import MISSING, Field, FrozenInstanceError, field
from typing import Any, Final, TypeVar, cast, dataclass_transform, overload

__all__ = ["dataclass", "field"]

_T = TypeVar("_T", bound=type)
_NO_DOC = "(no docstring)"


class _Factory:
    """The default of a parameter whose field has a ``default_factory``."""

    def __repr__(self) -> str:
        return "<factory>"


_FACTORY = _Factory()
# The frozen classes made here (their __dataclass_params__ say what the standard library
# generated, which is nothing).
_FROZEN: Final[weakref.WeakSet[type]] = weakref.WeakSet()


@overload
def dataclass(
    cls: _T, /, *, frozen: bool = ..., slots: bool = ..., eq: bool = ..., kw_only: bool = ...
) -> _T: ...


@overload
def dataclass(
    cls: None = None,
    /,
    *,
    frozen: bool = ...,
    slots: bool = ...,
    eq: bool = ...,
    kw_only: bool = ...,
) -> Callable[[_T], _T]: ...


@dataclass_transform(field_specifiers=(field, Field))
def dataclass(
    cls: _T | None = None,
    /,
    *,
    frozen: bool = False,
    slots: bool = False,
    eq: bool = True,
    kw_only: bool = False,
) -> _T | Callable[[_T], _T]:
    def wrap(cls: _T) -> _T:
        return _process(cls, frozen=frozen, slots=slots, eq=eq, kw_only=kw_only)

    return wrap if cls is None else wrap(cls)


def _process(cls: _T, *, frozen: bool, slots: bool, eq: bool, kw_only: bool) -> _T:
    own = cls.__dict__
    _check_bases(cls, frozen)
    # Whether the class body sets __hash__ itself (Python sets it to None for a body that
    # defines __eq__ alone: that is not an explicit one).
    explicit_hash = "__hash__" in own and not (own["__hash__"] is None and "__eq__" in own)
    undocumented = own.get("__doc__") is None
    if undocumented:
        cls.__doc__ = _NO_DOC  # else the standard library describes it with inspect (slow)
    made = cast(
        _T,
        dataclasses.dataclass(init=False, repr=False, eq=False, slots=slots, kw_only=kw_only)(cls),
    )
    if undocumented:
        made.__doc__ = None
    every = dataclasses.fields(made)
    if any(not f.init for f in every):
        raise TypeError(f"{made.__qualname__}: init=False fields are not supported")
    names = tuple(f.name for f in every)
    methods: dict[str, Any] = {"__init__": _init(made, every, frozen)}
    shown = tuple(f.name for f in every if f.repr)
    methods["__repr__"] = _repr(shown)
    if eq:
        values = _getter(tuple(f.name for f in every if f.compare))
        methods["__eq__"] = _eq(values)
        if not explicit_hash:
            # As the standard library: frozen values hash by their fields, mutable ones
            # that compare by value are unhashable.
            methods["__hash__"] = _hash(values) if frozen else None
    if frozen:
        methods["__setattr__"], methods["__delattr__"] = _frozen(made, frozenset(names))
        if slots:
            methods["__getstate__"], methods["__setstate__"] = _getstate, _setstate
        _FROZEN.add(made)
    for name, method in methods.items():
        if name in own and name != "__hash__":
            continue  # the class's own
        if name == "__hash__" and explicit_hash:
            continue
        if method is not None:
            method.__qualname__ = f"{made.__qualname__}.{name}"
        setattr(made, name, method)
    return made


def _check_bases(cls: type, frozen: bool) -> None:
    """Refuse what the standard library refuses: frozen and mutable dataclasses mixed."""
    bases = [base for base in cls.__mro__[1:] if "__dataclass_fields__" in base.__dict__]
    if not bases:
        return
    frozen_bases = any(
        base in _FROZEN or base.__dict__["__dataclass_params__"].frozen for base in bases
    )
    if frozen_bases and not frozen:
        raise TypeError("cannot inherit non-frozen dataclass from a frozen one")
    if frozen and not frozen_bases:
        raise TypeError("cannot inherit frozen dataclass from a non-frozen one")


def _init(cls: type, every: tuple[Field[Any], ...], frozen: bool) -> Callable[..., None]:
    # Compiled as the standard library does, inside a function whose parameters hold what
    # the body refers to, so that __init__ has the class's module as its globals (its
    # __module__, and typing.get_type_hints, resolve there).
    scope: dict[str, Any] = {"__set": object.__setattr__, "__factory": _FACTORY}
    positional: list[str] = []
    keyword: list[str] = []
    body: list[str] = []
    for f in every:
        if f.default is not MISSING:
            scope[f"__default_{f.name}"] = f.default
            param = f"{f.name}=__default_{f.name}"
            value = f.name
        elif f.default_factory is not MISSING:
            scope[f"__factory_{f.name}"] = f.default_factory
            param = f"{f.name}=__factory"
            value = f"__factory_{f.name}() if {f.name} is __factory else {f.name}"
        else:
            param = value = f.name
        (keyword if f.kw_only else positional).append(param)
        body.append(
            f"    __set(self, {f.name!r}, {value})" if frozen else f"    self.{f.name} = {value}"
        )
    if hasattr(cls, "__post_init__"):
        body.append("    self.__post_init__()")
    params = ["self", *positional, *(["*", *keyword] if keyword else [])]
    source = (
        f"def __create__({', '.join(scope)}):\n"
        f" def __init__({', '.join(params)}):\n"
        + ("\n".join(f" {line}" for line in body) or "     pass")
        + "\n return __init__"
    )
    created: dict[str, Any] = {}
    module = sys.modules.get(cls.__module__)
    # Built from the field names alone.
    exec(source, module.__dict__ if module is not None else {}, created)
    init: Callable[..., None] = created["__create__"](**scope)
    init.__annotations__ = {f.name: f.type for f in every} | {"return": None}
    return init


def _getter(names: tuple[str, ...]) -> Callable[[Any], tuple[Any, ...]]:
    if len(names) > 1:
        return operator.attrgetter(*names)
    if names:
        (name,) = names
        return lambda obj: (getattr(obj, name),)
    return lambda obj: ()


def _repr(names: tuple[str, ...]) -> Callable[[Any], str]:
    def __repr__(self: Any) -> str:
        shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in names)
        return f"{type(self).__qualname__}({shown})"

    return __repr__


def _eq(values: Callable[[Any], tuple[Any, ...]]) -> Callable[[Any, object], Any]:
    def __eq__(self: Any, other: object) -> Any:
        if other.__class__ is self.__class__:
            return values(self) == values(other)
        return NotImplemented

    return __eq__


def _hash(values: Callable[[Any], tuple[Any, ...]]) -> Callable[[Any], int]:
    def __hash__(self: Any) -> int:
        return hash(values(self))

    return __hash__


def _frozen(
    cls: type, names: frozenset[str]
) -> tuple[Callable[[Any, str, Any], None], Callable[[Any, str], None]]:
    def __setattr__(self: Any, name: str, value: Any) -> None:
        if type(self) is cls or name in names:
            raise FrozenInstanceError(f"cannot assign to field {name!r}")
        super(cls, self).__setattr__(name, value)  # type: ignore[arg-type]

    def __delattr__(self: Any, name: str) -> None:
        if type(self) is cls or name in names:
            raise FrozenInstanceError(f"cannot delete field {name!r}")
        super(cls, self).__delattr__(name)  # type: ignore[arg-type]

    return __setattr__, __delattr__


# A frozen class with slots has no __dict__ for copy and pickle to fill in: its state is
# its fields' values (a subclass's too), set back past the frozen __setattr__.
def _getstate(self: Any) -> list[Any]:
    return [getattr(self, f.name) for f in dataclasses.fields(self)]


def _setstate(self: Any, state: list[Any]) -> None:
    for f, value in zip(dataclasses.fields(self), state, strict=True):
        object.__setattr__(self, f.name, value)
