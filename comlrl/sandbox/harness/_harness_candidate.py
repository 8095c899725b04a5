"""The candidate process: loads the model's program and answers the judge (inside; stdlib only).

It never sees the tests. After loading the program it reports the module's globals, then serves
requests from the judge, one at a time: call, attribute get/set/delete, and a few value-producing
operations (len, iter, next, item access, str, repr, ...). Results cross as plain data; other
objects stay here and cross as handles. Everything in this process is the program's to tamper
with: nothing here is trusted, which is why the judge checks every reply itself.
"""

from __future__ import annotations

import marshal
import operator
import os
import sys
import types

import _harness_codec as codec
import _harness_os as hos
from _harness_tests import PROGRAM_MODULE, describe, load_source, text_of

LISTING_VALUE_BYTES = 1 << 20  # a global larger than this as data crosses as a handle instead
NEXT_CHUNK = 64  # items per round trip when the judge iterates a program object

_OPS = {
    "len": len,
    "iter": iter,
    "next": next,
    "getitem": operator.getitem,
    "setitem": operator.setitem,
    "delitem": operator.delitem,
    "str": str,
    "repr": repr,
    "format": format,
    "int": int,
    "float": float,
    "complex": complex,
    "index": operator.index,
    "abs": abs,
    "neg": operator.neg,
    "pos": operator.pos,
    "invert": operator.invert,
    "round": round,
    "hasattr": hasattr,
    "enter": lambda obj: type(obj).__enter__(obj),
    "exit": lambda obj: type(obj).__exit__(obj, None, None, None),
    "instancecheck": lambda cls, obj: isinstance(obj, cls),
    "subclasscheck": lambda cls, sub: issubclass(sub, cls),
}


def _is_program(obj: object) -> bool:
    module = obj.__module__ if isinstance(obj, type) else type(obj).__module__
    return module == PROGRAM_MODULE


def _builtin_base(cls: type) -> type:
    return next(k for k in cls.__mro__ if k.__module__ == "builtins")


class Server:
    """Answers the judge's requests on the channel until it closes."""

    def __init__(self, fd: int, namespace: dict) -> None:
        self.fd, self.ns = fd, namespace
        self.objs: dict[int, object] = {}
        self.ids: dict[int, int] = {}  # id(obj) -> handle (objects are kept alive, so ids stay unique)
        self.enc = codec.Encoder(self.ref, lower_subclasses=True, live_ref=self._hid)
        self.dec = codec.Decoder(self.deref)

    # --- references -------------------------------------------------------------------------

    def _hid(self, obj: object) -> int:
        hid = self.ids.get(id(obj))
        if hid is None:
            hid = self.ids[id(obj)] = len(self.objs) + 1
            self.objs[hid] = obj
        return hid

    def ref(self, obj: object) -> list:
        hid = self._hid(obj)
        if isinstance(obj, type) and issubclass(obj, BaseException):
            return ["X", hid, f"{obj.__module__}.{obj.__qualname__}", _builtin_base(obj).__name__]
        if isinstance(obj, types.ModuleType):
            return ["M", hid, obj.__name__]
        typename = f"{type(obj).__module__}.{type(obj).__qualname__}"
        flags = 0
        if callable(obj):
            flags |= codec.F_CALLABLE
        if isinstance(obj, type):
            flags |= codec.F_CLASS
        if _is_program(obj):
            flags |= codec.F_PROGRAM
        faked = codec.overrides(type(obj)) if _is_program(obj) else []
        if faked:
            flags |= codec.F_OVERRIDES
        for bit, name in ((codec.F_LEN, "__len__"), (codec.F_ITER, "__iter__"), (codec.F_NEXT, "__next__")):
            if hasattr(type(obj), name):
                flags |= bit
        module = getattr(obj, "__module__", None)
        if (callable(obj) or isinstance(obj, type)) and not _is_program(obj) and isinstance(module, str):
            qualname = getattr(obj, "__qualname__", None)
            if isinstance(qualname, str):
                return ["F", hid, module, qualname, typename, flags]
        return ["h", hid, typename, flags, faked]

    def deref(self, tree: list) -> object:
        tag = tree[0]
        if tag == "h" and len(tree) > 1 and type(tree[1]) is int and tree[1] in self.objs:
            return self.objs[tree[1]]
        if tag == "F" and len(tree) == 3 and type(tree[1]) is str and type(tree[2]) is str:
            import importlib

            found = importlib.import_module(tree[1])
            for part in tree[2].split("."):
                found = getattr(found, part)
            return found
        if tag == "g" and len(tree) > 1 and type(tree[1]) is str:
            try:
                return self.ns[tree[1]]
            except KeyError:
                raise NameError(f"name {tree[1]!r} is not defined") from None
        raise codec.BadMessage(f"unknown reference {tree!r:.80}")

    # --- load --------------------------------------------------------------------------------

    def listing(self) -> list:
        """The program's globals, as data where they are data, else as references."""
        out = []
        for name, value in list(self.ns.items()):
            if not isinstance(name, str) or name.startswith("__"):
                continue
            try:
                tree = self.enc(value)
            except Exception:  # noqa: BLE001 - too deep, or a hostile __eq__ in a dict key
                continue
            if tree is not None and type(tree) is list and tree[0] in ("h", "F", "X", "M"):
                out.append([name, tree])
            elif len(codec.dumps(tree)) <= LISTING_VALUE_BYTES:
                out.append([name, ["v", tree]])
        return out

    # --- serving -----------------------------------------------------------------------------

    def reply(self, tree: list) -> None:
        # What the program printed reaches its pipe before the answer does: the trainer stops
        # reading output when the judge is done, without waiting for this process to exit.
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BaseException:  # noqa: BLE001 - the program may have closed or replaced it
                pass
        codec.send_frame(self.fd, codec.dumps(tree))

    def serve(self) -> None:
        while True:
            data = codec.recv_frame(self.fd)
            if data is None:
                return
            msg = codec.loads(data)
            seq = msg[1] if type(msg) is list and len(msg) > 1 else -1
            self.reply(self.handle(msg, seq))

    def handle(self, msg: list, seq: int) -> list:
        changed: list = []
        try:
            op = msg[0]
            args = [self.dec(x) for x in msg[2:]]
            if op == "call":
                result = args[0](*args[1], **args[2])
                if len(args) == 5:  # the judge's mutable arguments: their state after the call
                    changed = [args[1][i] for i in args[3]] + [args[2][k] for k in args[4]]
            elif op == "getattr":
                result = getattr(args[0], args[1])
            elif op == "setattr":
                result = setattr(args[0], args[1], args[2])
            elif op == "delattr":
                result = delattr(args[0], args[1])
            elif op == "method":  # a mutation the judge made to a live container (see codec)
                getattr(args[0], args[1])(*args[2], **args[3])
                result = None  # the judge has its own result
            elif op == "next_n":
                result = self.next_n(args[0])
            elif op in _OPS:
                result = _OPS[op](*args)
            else:
                return ["bad", seq, f"unknown operation {op!r}"]
        except Exception as exc:  # noqa: BLE001 - the program's exception goes back to the judge
            return ["raise", seq, self.exc_tree(exc)]
        except BaseException as exc:  # noqa: BLE001 - SystemExit, KeyboardInterrupt, ...
            return ["exit", seq, describe(exc)]
        try:
            tree = self.enc(result, live=op == "getattr")
            if op == "call" and len(args) == 5:
                return ["ok", seq, tree, [self.enc(x) for x in changed]]
            return ["ok", seq, tree]
        except Exception as exc:  # noqa: BLE001
            return ["bad", seq, f"result cannot cross: {text_of(exc)}"]

    def next_n(self, it: object) -> list:
        items, done = [], False
        for _ in range(NEXT_CHUNK):
            try:
                items.append(next(it))  # type: ignore[call-overload]
            except StopIteration:
                done = True
                break
        return [items, done]

    def exc_tree(self, exc: BaseException) -> list:
        cls = type(exc)
        try:
            args = self.enc(tuple(exc.args))
        except Exception:  # noqa: BLE001
            args = None
        message = text_of(exc)
        if cls.__module__ == "builtins":
            return ["b", cls.__name__, args, message]
        return ["o", f"{cls.__module__}.{cls.__qualname__}", _builtin_base(cls).__name__, args, message]


def main(cfg: dict, chan_fd: int, seccomp: object) -> None:
    """Become the candidate: drop everything, load the program, serve the judge. Never returns."""
    program_fd = cfg["program_fd"]
    hos.keep_only_fds({0, 1, 2, chan_fd, program_fd})
    try:
        os.setpgid(0, 0)  # the supervisor kills the candidate's group where uids are shared
    except OSError:
        pass
    hos.become(cfg["uid"])
    os.umask(0)  # files it writes in the work directory stay writable for the judge
    os.chdir(cfg["workdir"])
    hos.apply_limits(cfg)
    program = hos.pread_all(program_fd)
    os.close(program_fd)
    if seccomp is not None:
        seccomp.load()  # type: ignore[attr-defined]  # last step before the program's code runs
    module = types.ModuleType(PROGRAM_MODULE)
    sys.modules[PROGRAM_MODULE] = module
    namespace = module.__dict__
    namespace["__file__"] = os.path.join(cfg["workdir"], "program.py")  # never written
    server = Server(chan_fd, namespace)
    failure = load_source(marshal.loads(program), "<program>", namespace)
    if failure is None:
        server.reply(["loaded", "ok", "", server.listing()])
        server.serve()
    else:
        server.reply(["loaded", failure[0], failure[1], []])
    hos.flush_and_exit()
