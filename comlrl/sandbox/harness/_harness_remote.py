"""References to the program's objects, as the judge's tests see them (inside the judge).

:class:`Remote` stands for an object in the candidate: attribute access, calls and a few
value-producing operations go there, results come back as data. Comparisons stay in the judge:
a Remote equals only itself. Mutable containers read from an attribute are *live* copies: data for
comparisons, with every change sent on to the program's own container. ``LINK`` is the judge's
channel (``_harness_judge.Link``), set when the judge starts.
"""

from __future__ import annotations

import collections
import importlib

import _harness_codec as codec

LINK = None  # the judge's Link (set by _harness_judge.main)
COMPARISONS = frozenset("__eq__ __ne__ __lt__ __le__ __gt__ __ge__ __bool__".split())


def _checked(value: object, kind: type, what: str) -> object:
    if type(value) is not kind:
        raise TypeError(f"{what} of a program object returned {type(value).__name__}, not {kind.__name__}")
    return value


class Remote:
    """A reference to an object in the candidate. Attribute access and calls go there; results
    come back as data. Comparisons stay here: a Remote equals only itself, so an ``__eq__``
    written by the program can never make a test pass."""

    __slots__ = ("_ref", "_gen", "_type", "_flags", "_fakes", "__weakref__")

    def __init__(self, ref: list, gen: int | None, typename: str, flags: int, fakes: list) -> None:
        for name, value in zip(Remote.__slots__, (ref, gen, typename, flags, fakes)):
            object.__setattr__(self, name, value)

    def __getattr__(self, name: str) -> object:
        return LINK.request("getattr", self, name)

    def __setattr__(self, name: str, value: object) -> None:
        LINK.request("setattr", self, name, value)

    def __delattr__(self, name: str) -> None:
        LINK.request("delattr", self, name)

    def __call__(self, *args: object, **kwargs: object) -> object:
        return LINK.request("call", self, list(args), kwargs)

    def _same(self, other: object) -> bool:
        return other is self or (type(other) is Remote and other._ref == self._ref and other._gen == self._gen)

    def __eq__(self, other: object) -> bool:
        if self._same(other):
            return True
        LINK.compared(self, "==")
        return False

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    def __hash__(self) -> int:
        return hash((tuple(self._ref), self._gen))

    def _order(self, other: object) -> object:
        LINK.compared(self, "an ordering comparison")
        return NotImplemented

    __lt__ = __le__ = __gt__ = __ge__ = _order

    def __bool__(self) -> bool:
        if self._flags & codec.F_LEN:
            return len(self) != 0
        if "__bool__" in self._fakes:
            LINK.compared(self, "a truth test")
        return True

    def __len__(self) -> int:
        n = _checked(LINK.request("len", self), int, "len()")
        if n < 0:  # type: ignore[operator]
            raise ValueError("len() of a program object returned a negative number")
        return n  # type: ignore[return-value]

    def __iter__(self) -> RemoteIterator:
        it = LINK.request("iter", self)
        if type(it) is not Remote:
            raise TypeError("iter() of a program object did not return an iterator object")
        return RemoteIterator(it)

    def __next__(self) -> object:
        return LINK.request("next", self)

    def __contains__(self, item: object) -> bool:
        return any(x is item or x == item for x in self)  # compared here, never by the program

    def __getitem__(self, key: object) -> object:
        return LINK.request("getitem", self, key)

    def __setitem__(self, key: object, value: object) -> None:
        LINK.request("setitem", self, key, value)

    def __delitem__(self, key: object) -> None:
        LINK.request("delitem", self, key)

    def __str__(self) -> str:
        return _checked(LINK.request("str", self), str, "str()")  # type: ignore[return-value]

    def __repr__(self) -> str:
        try:
            return _checked(LINK.request("repr", self), str, "repr()")  # type: ignore[return-value]
        except Exception:  # noqa: BLE001 - repr is used in failure messages; never fail there
            return f"<{self._type} object of the program>"

    def __format__(self, spec: str) -> str:
        return _checked(LINK.request("format", self, spec), str, "format()")  # type: ignore[return-value]

    def __int__(self) -> int:
        return _checked(LINK.request("int", self), int, "int()")  # type: ignore[return-value]

    def __index__(self) -> int:
        return _checked(LINK.request("index", self), int, "operator.index()")  # type: ignore[return-value]

    def __float__(self) -> float:
        return _checked(LINK.request("float", self), float, "float()")  # type: ignore[return-value]

    def __complex__(self) -> complex:
        return _checked(LINK.request("complex", self), complex, "complex()")  # type: ignore[return-value]

    def __abs__(self) -> object:
        return LINK.request("abs", self)

    def __neg__(self) -> object:
        return LINK.request("neg", self)

    def __pos__(self) -> object:
        return LINK.request("pos", self)

    def __invert__(self) -> object:
        return LINK.request("invert", self)

    def __round__(self, ndigits: object = None) -> object:
        return LINK.request("round", self) if ndigits is None else LINK.request("round", self, ndigits)

    def __enter__(self) -> object:
        return LINK.request("enter", self)

    def __exit__(self, *exc: object) -> bool:
        LINK.request("exit", self)
        return False

    def __instancecheck__(self, obj: object) -> bool:
        try:
            return bool(_checked(LINK.request("instancecheck", self, obj), bool, "isinstance()"))
        except NotData:
            return False

    def __subclasscheck__(self, sub: object) -> bool:
        try:
            return bool(_checked(LINK.request("subclasscheck", self, sub), bool, "issubclass()"))
        except NotData:
            return False

    def __reduce__(self) -> object:
        raise TypeError("a program object cannot be pickled in the judge")


class RemoteIterator:
    """Iterates a program object, fetching items in chunks (each item is data or a Remote)."""

    def __init__(self, it: Remote) -> None:
        self.it, self.buf, self.done = it, collections.deque(), False

    def __iter__(self) -> RemoteIterator:
        return self

    def __next__(self) -> object:
        if not self.buf:
            if self.done:
                raise StopIteration
            chunk = LINK.request("next_n", self.it)
            if type(chunk) is not list or len(chunk) != 2 or type(chunk[0]) is not list or type(chunk[1]) is not bool:
                raise TypeError("iteration of a program object returned a malformed chunk")
            self.buf.extend(chunk[0])
            self.done = chunk[1]
            if not self.buf:
                raise StopIteration
        return self.buf.popleft()


LIVE_MUTATORS = {
    list: "__setitem__ __delitem__ append extend insert pop remove clear sort reverse __iadd__ __imul__",
    dict: "__setitem__ __delitem__ pop popitem clear update setdefault __ior__",
    set: "add discard remove pop clear update difference_update intersection_update "
    "symmetric_difference_update __ior__ __iand__ __isub__ __ixor__",
    collections.deque: "__setitem__ __delitem__ append appendleft pop popleft extend extendleft clear rotate "
    "remove insert __iadd__",
}
LIVE_MUTATORS[collections.OrderedDict] = LIVE_MUTATORS[dict] + " move_to_end"
LIVE_MUTATORS[collections.Counter] = LIVE_MUTATORS[dict] + " subtract"
LIVE_MUTATORS[collections.defaultdict] = LIVE_MUTATORS[dict]


def _live_class(base: type) -> type:
    """A subclass of ``base`` holding the judge's copy of a container of the program: reads and
    comparisons use the copy (data, compared by the judge), mutations go to both."""

    def forwarding(name: str):  # noqa: ANN202
        local = getattr(base, name)

        def method(self, *args: object, **kwargs: object) -> object:
            LINK.request("method", self, name, list(args), kwargs)
            return local(self, *args, **kwargs)

        method.__name__ = name
        return method

    def reduce(self, protocol: object) -> tuple:  # copies are plain containers
        if base is collections.deque:
            return (base, (list(self), self.maxlen))
        if base is collections.defaultdict:
            return (base, (self.default_factory, dict(self)))
        return (base, (base(self),))

    namespace = {name: forwarding(name) for name in LIVE_MUTATORS[base].split()}
    namespace["__reduce_ex__"] = reduce
    return type(base.__name__, (base,), namespace)


LIVE_CLASSES = {base: _live_class(base) for base in LIVE_MUTATORS}


def make_live(inner: object, ref: list, gen: int) -> object:
    base = type(inner)
    cls = LIVE_CLASSES[base]
    if base is collections.deque:
        live = cls(inner, inner.maxlen)  # type: ignore[attr-defined]
    elif base is collections.defaultdict:
        live = cls(inner.default_factory, inner)  # type: ignore[attr-defined]
    else:
        live = cls(inner)
    live._live = (ref, gen)
    return live


MUTABLE_ARGS = frozenset(LIVE_MUTATORS) | frozenset(LIVE_CLASSES.values())


def update_in_place(arg: object, state: object) -> None:
    """Give a mutable argument the contents the program left it with (as data); the base type's
    own methods, so that a live container does not send the change back."""
    base = next(b for b in LIVE_MUTATORS if isinstance(arg, b))
    if not isinstance(state, base):
        raise codec.BadMessage(f"an argument came back as {type(state).__name__}, not {base.__name__}")
    if base is list:
        list.__setitem__(arg, slice(None), state)  # type: ignore[arg-type]
    elif base is set:
        set.clear(arg)  # type: ignore[arg-type]
        set.update(arg, state)  # type: ignore[arg-type]
    elif base is collections.deque:
        collections.deque.clear(arg)  # type: ignore[arg-type]
        collections.deque.extend(arg, state)  # type: ignore[arg-type]
    else:
        dict.clear(arg)  # type: ignore[arg-type]
        dict.update(arg, state)  # type: ignore[arg-type]


class LazyModule:
    """A module the program imported, for the tests: the judge's own copy, imported on first use."""

    def __init__(self, name: str) -> None:
        self.__dict__["_name"] = name

    def __getattr__(self, attr: str) -> object:
        module = importlib.import_module(self.__dict__["_name"])  # NameError-like failures surface here
        return getattr(module, attr)

    def __repr__(self) -> str:
        return f"<module {self.__dict__['_name']!r} (the judge's copy)>"


class NotData(Exception):
    """An argument the tests made that cannot cross to the program (see Link.needs_shared)."""
