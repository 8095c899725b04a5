"""Plain data across the judge/candidate channel (runs inside the sandbox; standard library only).

A value crosses as tagged JSON: None, bool, int, float and str as JSON scalars, everything else as
a list whose first item is a tag, e.g. ``["t", 1, 2]`` for ``(1, 2)``. The same codec runs on both
sides, but only the judge's decoder is a security boundary: it reads bytes the candidate fully
controls, builds nothing but exact builtin (or trusted standard-library) objects of its own, and
caps depth and size. Whatever the candidate's encoder claims, the judge compares only its own
objects, so an ``__eq__`` written by the program never runs in the judge.

Objects that are not data (functions, classes, instances of the program's classes, iterators)
stay where they are and cross as references: ``["h", id, type name, flags]`` from the candidate,
resolved back to the object when the judge sends them as arguments.
"""

from __future__ import annotations

import binascii
import collections
import datetime
import decimal
import fractions
import json
import re
import sys

MAX_DEPTH = 100  # nesting of containers in one value
MAX_ITEMS = 2_000_000  # scalars + containers in one message
BIG_INT = 1 << 62  # larger ints cross as hex (no str-conversion digit limit, exact)

# Handle flags (from the candidate's description of the object; informative only).
F_CALLABLE, F_CLASS, F_PROGRAM, F_OVERRIDES, F_LEN, F_ITER, F_NEXT = 1, 2, 4, 8, 16, 32, 64

BUILTIN_TYPES = {
    t.__name__: t
    for t in (int, float, complex, str, bytes, bytearray, bool, list, tuple, dict, set, frozenset, object, type, range)
}
BUILTIN_TYPES["NoneType"] = type(None)
MUTABLE = frozenset({list, dict, set, collections.deque, collections.Counter, collections.OrderedDict})
MUTABLE |= {collections.defaultdict}
# Dunders whose override in a subclass of a builtin (or a program class) can fake a comparison.
FAKERS = frozenset(
    "__eq__ __ne__ __lt__ __le__ __gt__ __ge__ __bool__ __len__ __contains__ __iter__ __getitem__ __abs__ "
    "__add__ __radd__ __sub__ __rsub__ __mul__ __rmul__ __truediv__ __rtruediv__ __round__ __float__ "
    "__int__ __index__ __instancecheck__ __subclasscheck__".split()
)
_NUMPY_DTYPE = re.compile(r"[<>|=]?[?biufc][0-9]{0,2}")
PIL_MODES = frozenset({"1", "L", "LA", "RGB", "RGBA", "CMYK", "YCbCr", "HSV", "I", "F"})  # images as data
MAX_PIXELS = 1 << 26


class NotPlain(TypeError):
    """A value that cannot cross (judge side: an argument the tests made that is not data)."""


class BadMessage(ValueError):
    """The other side sent something that is not a valid message."""


def overrides(cls: type, base: type | None = None) -> list[str]:
    """Comparison-faking dunders that ``cls`` defines above ``base`` (or above ``object``)."""
    found = []
    for klass in cls.__mro__:
        if klass is base or klass is object:
            break
        found += [n for n in vars(klass) if n in FAKERS]
    return sorted(set(found))


# ----------------------------------------------------------------------------- encoding


class Encoder:
    """Value -> JSON-able tree. ``ref(obj)`` returns the reference tree for a non-data object."""

    def __init__(self, ref, lower_subclasses: bool, live_ref=None) -> None:  # noqa: ANN001
        self.ref = ref
        self.lower = lower_subclasses  # candidate: subclasses cross as their builtin value
        self.live_ref = live_ref  # candidate: handle of a mutable container (see ``live``)
        self.live = False
        self.wrapping: object = None
        self.items = 0
        self.numpy = sys.modules.get("numpy")

    def __call__(self, value: object, live: bool = False) -> object:
        """``live``: mutable containers (at any depth) also carry a handle, so that the judge can
        change the program's own container (``obj.items["k"] = v`` in a test) and not a copy."""
        self.items, self.live, self.wrapping = 0, live, None
        self.numpy = sys.modules.get("numpy")
        return self.enc(value, 0)

    def enc(self, v: object, depth: int) -> object:  # noqa: C901 - one dispatch table, read top-down
        self.items += 1
        if depth > MAX_DEPTH or self.items > MAX_ITEMS:
            raise NotPlain("value too deep or too large to cross")
        t = type(v)
        if self.live and t in MUTABLE and v is not self.wrapping:
            self.wrapping = v  # encode the container itself once, its items wrapped in turn
            return ["live", self.live_ref(v), self.enc(v, depth)]
        if v is None or t is bool or t is str or t is float:
            return v
        if t is int:
            return v if -BIG_INT < v < BIG_INT else ["I", hex(v)]
        d = depth + 1
        if t is list or t is tuple or t is set or t is frozenset:
            tag = {list: "l", tuple: "t", set: "s", frozenset: "f"}[t]
            return [tag, *(self.enc(x, d) for x in v)]
        if t is dict:
            return ["d", *self._pairs(v.items(), d)]
        if t is bytes or t is bytearray:
            return ["b" if t is bytes else "B", binascii.b2a_base64(v, newline=False).decode()]
        if t is complex:
            return ["c", v.real, v.imag]
        trusted = self._trusted(v, t, d)
        if trusted is not None:
            return trusted
        if self.lower:
            lowered = self._lowered(v, t, d)
            if lowered is not None:
                return lowered
        return self.ref(v)

    def _pairs(self, items, depth: int) -> list:  # noqa: ANN001
        out = []
        for k, x in items:
            out += [self.enc(k, depth), self.enc(x, depth)]
        return out

    def _trusted(self, v: object, t: type, d: int) -> list | None:
        """Standard-library value types the other side rebuilds from data."""
        if t is type and v in BUILTIN_TYPES.values():
            return ["T", "NoneType" if v is type(None) else v.__name__]  # type: ignore[union-attr]
        if t is range:
            return ["r", v.start, v.stop, v.step]  # type: ignore[attr-defined]
        if t is slice:
            return ["S", self.enc(v.start, d), self.enc(v.stop, d), self.enc(v.step, d)]  # type: ignore[attr-defined]
        if v is Ellipsis:
            return ["E"]
        if t is collections.Counter or t is collections.OrderedDict:
            return ["C" if t is collections.Counter else "O", *self._pairs(v.items(), d)]  # type: ignore[attr-defined]
        if t is collections.defaultdict:
            factory = v.default_factory  # type: ignore[attr-defined]
            name = factory.__name__ if factory in BUILTIN_TYPES.values() else None
            return ["D", name, *self._pairs(v.items(), d)]  # type: ignore[attr-defined]
        if t is collections.deque:
            return ["Q", v.maxlen, *(self.enc(x, d) for x in v)]  # type: ignore[attr-defined]
        if t is type({}.keys()) or t is type({}.items()):
            return ["K" if t is type({}.keys()) else "J", *(self.enc(x, d) for x in v)]  # type: ignore[attr-defined]
        if t is decimal.Decimal:
            return ["dec", str(v)]
        if t is fractions.Fraction:
            return ["fr", self.enc(v.numerator, d), self.enc(v.denominator, d)]  # type: ignore[attr-defined]
        if t is datetime.timedelta:
            return ["td", v.days, v.seconds, v.microseconds]  # type: ignore[attr-defined]
        if t is datetime.date:
            return ["date", v.year, v.month, v.day]  # type: ignore[attr-defined]
        if t is datetime.datetime or t is datetime.time:
            return self._clock(v, t)
        np = self.numpy
        if np is not None and (t is np.ndarray or isinstance(v, np.generic)):
            return self._numpy(v, t, np)
        etree = sys.modules.get("xml.etree.ElementTree")
        if etree is not None and t is etree.Element:
            return ["xml", etree.tostring(v, encoding="unicode")]
        pil = sys.modules.get("PIL.Image")
        if pil is not None and isinstance(v, pil.Image) and t.__module__.startswith("PIL."):
            if v.mode in PIL_MODES:  # type: ignore[attr-defined]
                data = binascii.b2a_base64(v.tobytes(), newline=False).decode()  # type: ignore[attr-defined]
                extra = [x if type(x) is str else None for x in (v.format, getattr(v, "filename", None))]  # type: ignore[attr-defined]
                return ["pil", v.mode, v.size[0], v.size[1], data, *extra]  # type: ignore[attr-defined]
        return None

    @staticmethod
    def _clock(v, t: type) -> list | None:  # noqa: ANN001
        offset = v.utcoffset() if v.tzinfo is not None else None
        if offset is not None and type(v.tzinfo) is not datetime.timezone:
            return None  # a tzinfo class of unknown behaviour: crosses as a reference
        parts = [v.hour, v.minute, v.second, v.microsecond, v.fold]
        if t is datetime.datetime:
            parts = [v.year, v.month, v.day, *parts]
        return ["dt" if t is datetime.datetime else "tm", *parts, None if offset is None else offset.total_seconds()]

    @staticmethod
    def _numpy(v, t: type, np) -> list | None:  # noqa: ANN001
        dtype = v.dtype
        if dtype.kind not in "?biufc" or dtype.fields is not None or dtype.subdtype is not None:
            return None
        data = binascii.b2a_base64(np.ascontiguousarray(v).tobytes(), newline=False).decode()
        if t is np.ndarray:
            return ["np", dtype.str, list(v.shape), data]
        return ["ns", dtype.str, data]

    def _lowered(self, v: object, t: type, d: int) -> list | None:
        """A subclass of a builtin data type crosses as its builtin value, read through the base
        type's own methods (the subclass's overrides never decide what the judge sees)."""
        for base in (bool, int, float, complex, str, bytes, tuple, list, dict, set, frozenset):
            if isinstance(v, base):
                break
        else:
            return None
        if base is int:
            plain: object = int.__add__(v, 0)  # type: ignore[operator]
        elif base is float:
            plain = float.__add__(v, 0.0)  # type: ignore[operator]
        elif base is complex:
            plain = complex.__add__(v, 0j)  # type: ignore[operator]
        elif base is str:
            plain = str.__str__(v)  # type: ignore[arg-type]
        elif base is bytes:
            plain = bytes.__getitem__(v, slice(None))  # type: ignore[arg-type]
        elif base is dict:
            plain = dict(dict.items(v))  # type: ignore[arg-type]
        else:
            plain = base(base.__iter__(v))  # type: ignore[call-arg, attr-defined]
        return ["~", f"{t.__module__}.{t.__qualname__}", overrides(t, base), self.enc(plain, d)]


def dumps(tree: object) -> bytes:
    return json.dumps(tree, separators=(",", ":"), ensure_ascii=True, allow_nan=True).encode()


# ----------------------------------------------------------------------------- decoding


class Decoder:
    """JSON-able tree -> value. ``ref(tree)`` resolves a reference tag (``h``, ``g``, ``X``...).

    On the judge it reads what the candidate controls: every branch checks types and sizes and
    builds only exact builtin or trusted standard-library objects; anything else is BadMessage."""

    REF_TAGS = frozenset("h g X M F".split())

    def __init__(self, ref, on_subclass=None, on_live=None) -> None:  # noqa: ANN001
        self.ref = ref
        self.on_subclass = on_subclass  # called with (type name, overridden dunders)
        self.on_live = on_live  # (handle, container) -> the judge's linked copy of the container
        self.items = 0

    def __call__(self, tree: object) -> object:
        self.items = 0
        return self.dec(tree, 0)

    def dec(self, v: object, depth: int) -> object:  # noqa: C901
        self.items += 1
        if depth > MAX_DEPTH or self.items > MAX_ITEMS:
            raise BadMessage("value too deep or too large")
        t = type(v)
        if v is None or t is bool or t is str or t is float or t is int:
            return v
        if t is not list or not v or type(v[0]) is not str:  # type: ignore[index]
            raise BadMessage(f"not a tagged value: {type(v).__name__}")
        tag, rest, d = v[0], v[1:], depth + 1  # type: ignore[index]
        if tag in ("l", "t", "s", "f"):
            items = [self.dec(x, d) for x in rest]
            return {"l": list, "t": tuple, "s": set, "f": frozenset}[tag](items)
        if tag in ("d", "C", "O", "D"):
            return self._mapping(tag, rest, d)
        if tag == "I":
            return int(self._str(rest, 0), 16)
        if tag in ("b", "B"):
            data = binascii.a2b_base64(self._str(rest, 0))
            return data if tag == "b" else bytearray(data)
        if tag == "c":
            return complex(self._num(rest, 0), self._num(rest, 1))
        if tag == "T":
            name = self._str(rest, 0)
            if name not in BUILTIN_TYPES:
                raise BadMessage(f"unknown builtin type {name!r}")
            return BUILTIN_TYPES[name]
        if tag == "~":
            if self.on_subclass is not None:
                self.on_subclass(self._str(rest, 0), [str(x) for x in self._list(rest, 1)])
            return self.dec(rest[2] if len(rest) == 3 else None, d)
        if tag in self.REF_TAGS:
            return self.ref(v)
        if tag == "live" and self.on_live is not None and len(rest) == 2 and type(rest[0]) is int:
            inner = self.dec(rest[1], d)
            if type(inner) not in MUTABLE:
                raise BadMessage("a live value must be a mutable container")
            return self.on_live(rest[0], inner)
        return self._other(tag, rest, d)

    def _mapping(self, tag: str, rest: list, d: int) -> object:
        factory = None
        if tag == "D":
            name = rest[0] if rest else None
            if name is not None and name not in BUILTIN_TYPES:
                raise BadMessage("unknown defaultdict factory")
            factory, rest = (BUILTIN_TYPES[name] if name else None), rest[1:]
        if len(rest) % 2:
            raise BadMessage("odd mapping")
        pairs = [(self.dec(rest[i], d), self.dec(rest[i + 1], d)) for i in range(0, len(rest), 2)]
        try:
            if tag == "d":
                return dict(pairs)
            if tag == "C":
                return collections.Counter(dict(pairs))
            if tag == "O":
                return collections.OrderedDict(pairs)
            return collections.defaultdict(factory, pairs)
        except TypeError as exc:  # an unhashable key
            raise BadMessage(str(exc)) from None

    def _other(self, tag: str, rest: list, d: int) -> object:  # noqa: C901
        try:
            if tag == "r":
                return range(self._int(rest, 0), self._int(rest, 1), self._int(rest, 2))
            if tag == "S":
                return slice(*(self.dec(x, d) for x in rest[:3]))
            if tag == "E":
                return Ellipsis
            if tag == "Q":
                maxlen = rest[0] if rest else None
                if maxlen is not None and (type(maxlen) is not int or maxlen < 0):
                    raise BadMessage("bad deque maxlen")
                return collections.deque((self.dec(x, d) for x in rest[1:]), maxlen)
            if tag in ("K", "J"):
                items = [self.dec(x, d) for x in rest]
                return dict.fromkeys(items).keys() if tag == "K" else dict(items).items()
            if tag == "dec":
                return decimal.Decimal(self._str(rest, 0))
            if tag == "fr":
                num, den = self.dec(rest[0], d), self.dec(rest[1], d)
                if type(num) is not int or type(den) is not int:
                    raise BadMessage("bad fraction")
                return fractions.Fraction(num, den)
            if tag == "td":
                return datetime.timedelta(self._int(rest, 0), self._int(rest, 1), self._int(rest, 2))
            if tag == "date":
                return datetime.date(self._int(rest, 0), self._int(rest, 1), self._int(rest, 2))
            if tag in ("dt", "tm"):
                return self._clock(tag, rest)
            if tag in ("np", "ns"):
                return self._numpy(tag, rest)
            if tag == "pil":
                return self._image(rest)
            if tag == "xml":
                from xml.etree import ElementTree

                return ElementTree.fromstring(self._str(rest, 0))
        except (TypeError, ValueError, OverflowError, ZeroDivisionError, SyntaxError, decimal.InvalidOperation) as exc:
            raise BadMessage(f"bad {tag!r} value: {exc}") from None
        raise BadMessage(f"unknown tag {tag!r}")

    def _clock(self, tag: str, rest: list) -> object:
        n = 8 if tag == "dt" else 5
        parts = [self._int(rest, i) for i in range(n)]
        offset = rest[n] if len(rest) > n else None
        tz = None if offset is None else datetime.timezone(datetime.timedelta(seconds=self._num(rest, n)))
        if tag == "dt":
            return datetime.datetime(*parts[:7], tzinfo=tz, fold=parts[7])
        return datetime.time(*parts[:4], tzinfo=tz, fold=parts[4])

    def _numpy(self, tag: str, rest: list) -> object:
        import numpy as np  # the judge imports it only when numpy data arrives

        dtype_str = self._str(rest, 0)
        if not _NUMPY_DTYPE.fullmatch(dtype_str):
            raise BadMessage(f"numpy dtype {dtype_str!r} not allowed")
        dtype = np.dtype(dtype_str)
        data = binascii.a2b_base64(self._str(rest, 2 if tag == "np" else 1))
        if tag == "ns":
            if len(data) != dtype.itemsize:
                raise BadMessage("bad numpy scalar")
            return np.frombuffer(data, dtype=dtype)[0]
        shape = self._list(rest, 1)
        if not all(type(n) is int and n >= 0 for n in shape) or len(shape) > 32:
            raise BadMessage("bad numpy shape")
        count = 1
        for n in shape:
            count *= n
        if count * dtype.itemsize != len(data):
            raise BadMessage("numpy data does not match its shape")
        return np.frombuffer(data, dtype=dtype).reshape(shape).copy()

    def _image(self, rest: list) -> object:
        from PIL import Image  # the judge imports it only when an image arrives

        mode, width, height = self._str(rest, 0), self._int(rest, 1), self._int(rest, 2)
        if mode not in PIL_MODES or not (0 <= width and 0 <= height and width * height <= MAX_PIXELS):
            raise BadMessage("bad image")
        image = Image.frombytes(mode, (width, height), binascii.a2b_base64(self._str(rest, 3)))
        for name, value in zip(("format", "filename"), rest[4:6]):
            if type(value) is str:
                setattr(image, name, value)
        return image

    @staticmethod
    def _str(rest: list, i: int) -> str:
        if len(rest) <= i or type(rest[i]) is not str:
            raise BadMessage("expected a string")
        return rest[i]

    @staticmethod
    def _int(rest: list, i: int) -> int:
        if len(rest) <= i or type(rest[i]) is not int:
            raise BadMessage("expected an int")
        return rest[i]

    @staticmethod
    def _num(rest: list, i: int) -> float:
        if len(rest) <= i or type(rest[i]) not in (int, float):
            raise BadMessage("expected a number")
        return float(rest[i])

    @staticmethod
    def _list(rest: list, i: int) -> list:
        if len(rest) <= i or type(rest[i]) is not list:
            raise BadMessage("expected a list")
        return rest[i]


def loads(data: bytes) -> object:
    """Parse one message; anything malformed (or absurdly nested) is BadMessage."""
    try:
        return json.loads(data)
    except (ValueError, RecursionError, UnicodeDecodeError) as exc:
        raise BadMessage(f"malformed message: {type(exc).__name__}") from None


# ----------------------------------------------------------------------------- framing

MAX_FRAME = 64 * 1024 * 1024  # one message; a result larger than this is not a test value


def send_frame(fd: int, data: bytes, _write=None) -> None:  # noqa: ANN001
    import os

    write = _write or os.write
    view = memoryview(len(data).to_bytes(4, "big") + data)
    while view:
        view = view[write(fd, view) :]


def recv_frame(fd: int, limit: int = MAX_FRAME) -> bytes | None:
    """One length-prefixed message; None at a clean end of stream."""
    head = _read_exact(fd, 4)
    if head is None:
        return None
    size = int.from_bytes(head, "big")
    if size > limit:
        raise BadMessage(f"message of {size} bytes exceeds {limit}")
    body = _read_exact(fd, size) if size else b""
    if body is None:
        raise BadMessage("truncated message")
    return body


def _read_exact(fd: int, n: int) -> bytes | None:
    import os

    chunks, got = [], 0
    while got < n:
        chunk = os.read(fd, min(n - got, 1 << 20))
        if not chunk:
            if got:
                raise BadMessage("truncated message")
            return None
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)
