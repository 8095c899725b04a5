"""The judge process: runs the (trusted) tests against the program in another process (inside).

The tests run here with this interpreter's own builtins and unittest; the program runs in the
candidate process and is reached through :class:`Remote` references over a socket. Only plain
data comes back (see ``_harness_codec``), so comparisons and asserts never run program code.
Neither the test source nor its expected values are ever sent to the candidate: it receives the
arguments of calls, nothing else.

What the program can still do is answer calls badly: raise (the judge raises the same builtin
exception, or a stand-in class), exit or die (the test is an error, the candidate restarts for the
next test), hang (the per-test alarm; restart), or send garbage (an error and a restart). Each of
those that hints at reward hacking is reported as a "suspect" record.
"""

from __future__ import annotations

import builtins
import importlib
import json
import marshal
import os
import signal
import socket
import sys
import types

import _harness_codec as codec
import _harness_os as hos
import _harness_remote as hr
import _harness_tests as ht
from _harness_remote import COMPARISONS, LIVE_CLASSES, MUTABLE_ARGS, LazyModule, NotData, Remote

MAX_RESTARTS = 20  # candidate restarts per run (each costs a fork and a program load)
MAX_SUSPECTS = 50  # suspect records per run
# Modules the tests may get from the program's imports: the judge imports its own copy by name.
DENIED_MODULES = frozenset(
    "antigravity this webbrowser idlelib tkinter turtle turtledemo pydoc pdb code __hello__ __phello__ "
    "lib2to3 ensurepip venv".split()
)
# Functions and classes the program imported that the judge may replace with its own (by name).
VALUE_MODULES = frozenset(
    "math cmath collections itertools functools heapq bisect operator string re statistics fractions "
    "decimal datetime calendar random json copy typing array numbers enum textwrap unicodedata difflib "
    "hashlib binascii base64 struct time zlib numpy pandas scipy sympy".split()
)


class ProgramExit(BaseException):
    """The program raised SystemExit, KeyboardInterrupt or another BaseException during a call."""


class ProgramDied(BaseException):
    """The candidate process died, hung up, misbehaved on the channel or could not be restarted."""


class ProgramError(Exception):
    """An exception of the program whose class the judge does not have (e.g. one of its own)."""


class ResultNotData(TypeError):
    """A result the program could not (or would not) send as data."""


class ProgramCPU(ht.TestTimeout):
    """The candidate used up its CPU time limit."""


BUILTIN_NAMES = frozenset(dir(builtins))
MODULE_ALIASES = {"np": "numpy", "pd": "pandas", "plt": "matplotlib.pyplot"}


def _exit_text(info: dict) -> str:
    if info.get("signal"):
        return f"was killed by {info['signal']}"
    return f"exited with code {info.get('code')}"


class Link:
    """The judge's end of the channel to the candidate, and the candidate's life cycle."""

    def __init__(self, cfg: dict, ctl: socket.socket, emit, channel: int | None = None) -> None:  # noqa: ANN001
        self.cfg, self.ctl, self.emit, self.channel = cfg, ctl, emit, channel
        self.fd: int | None = None
        self.gen = 0
        self.seq = 0
        self.broken = True
        self.restarts = -1  # the first start is not a restart
        self.suspects = 0
        self.notes: list[str] = []  # reasons attached to the current test's failure message
        self.needs_shared: str | None = None
        self.strict = False  # verdict="strict": never fall back to one interpreter
        self.handles: dict[tuple, Remote] = {}
        self.exc_classes: dict[str, type] = {}
        self.resolved: dict[int, list] = {}  # id(judge object) -> the program's reference to it
        self.enc = codec.Encoder(self._arg_ref, lower_subclasses=False)
        self.copy_enc = codec.Encoder(self._arg_ref, lower_subclasses=False)  # stale live containers
        self.dec = codec.Decoder(self._result_ref, self._on_subclass, self._live)

    # --- reporting ---------------------------------------------------------------------------

    def suspect(self, kind: str, message: str) -> None:
        self.notes.append(message)
        self.suspects += 1
        if self.suspects <= MAX_SUSPECTS:
            self.emit("suspect", category=kind, message=ht.clip(message))

    def compared(self, remote: Remote, how: str) -> None:
        note = f"the program returned a {remote._type} object, not data; {how} compares it by identity"
        faking = sorted(COMPARISONS.intersection(remote._fakes))
        if faking:  # a class of the program that would have decided this comparison
            self.suspect("eq", f"{note} (its class defines {', '.join(faking)})")
        elif note not in self.notes:
            self.notes.append(note)

    def _on_subclass(self, typename: str, fakes: list) -> None:
        if fakes:
            self.suspect(
                "subclass", f"the program returned a {typename} overriding {', '.join(fakes)}; checked as plain data"
            )

    # --- candidate life cycle ----------------------------------------------------------------

    def start(self) -> tuple[str, str, list]:
        """(Re)start the candidate from the program; returns its load status, message, globals."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        self.restarts += 1
        if self.channel is not None:  # a prepared run: the first candidate's channel came with us
            fds, self.channel = [self.channel], None
        else:
            if self.restarts:  # the supervisor started the first candidate unasked
                self.ctl.send(b"spawn")
            _, fds, _, _ = socket.recv_fds(self.ctl, 64, 1)
        if not fds:
            raise RuntimeError("the supervisor could not start the candidate")
        self.fd, self.gen, self.broken = fds[0], self.gen + 1, False
        try:
            data = codec.recv_frame(self.fd)
            msg = None if data is None else codec.loads(data)
        except codec.BadMessage as exc:
            self.broken = True
            self.suspect("channel", f"the program wrote to the judge's channel while loading ({exc})")
            return "program_error", "the program wrote to the judge's channel while loading", []
        if data is None:
            self.broken = True
            info = self.reap()
            self.suspect("exit", f"the program {_exit_text(info)} while loading")
            return "program_error", f"the program {_exit_text(info)} while loading", []
        if type(msg) is not list or len(msg) != 4 or msg[0] != "loaded" or type(msg[3]) is not list:
            self.broken = True
            self.suspect("channel", "the program sent an invalid load report")
            return "program_error", "the program sent an invalid load report", []
        status, message = str(msg[1]), str(msg[2])
        if status not in ("ok", "syntax_error", "program_error"):
            status = "program_error"
        if status != "ok" and message.split(":")[0] in ("SystemExit", "KeyboardInterrupt", "GeneratorExit"):
            self.suspect("exit", f"the program raised {message} while loading")
        return status, message, msg[3]

    def restart(self) -> None:
        if self.restarts >= MAX_RESTARTS:
            raise ProgramDied(f"the program was restarted {MAX_RESTARTS} times; giving up")
        status, message, _ = self.start()
        self.emit("restart", generation=self.gen)
        if status != "ok":
            self.broken = True
            raise ProgramDied(f"the program failed to load again: {message}")

    def reap(self) -> dict:
        """Kill the candidate if needed and learn how it ended (from the supervisor)."""
        self.ctl.send(b"reap")
        try:
            info = json.loads(self.ctl.recv(4096))
        except ValueError:
            info = {}
        return info if type(info) is dict else {}

    def died(self, during: str) -> BaseException:
        info = self.reap()
        if info.get("signal") == "SIGSYS":
            self.suspect("seccomp", f"the program was killed by the seccomp filter (a forbidden system call) {during}")
            return ProgramDied(f"the program made a forbidden system call {during}")
        cpu_limit = float(self.cfg["cpu_seconds"])
        if (
            info.get("signal") in ("SIGXCPU", "SIGKILL")
            and float(info.get("cpu") or 0) >= hos.CPU_KILL_SHARE * cpu_limit
        ):
            return ProgramCPU(f"CPU time limit of {cpu_limit:g} s exceeded")
        self.suspect("exit", f"the program {_exit_text(info)} {during}")
        return ProgramDied(f"the program {_exit_text(info)} {during}")

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    # --- requests ----------------------------------------------------------------------------

    def _live(self, hid: int, inner: object) -> object:
        return hr.make_live(inner, ["h", hid], self.gen)

    def _arg_ref(self, obj: object) -> object:
        if type(obj) is Remote:
            if obj._gen is not None and obj._gen != self.gen:
                raise ProgramDied("an object of the program from before it was restarted")
            return obj._ref
        if type(obj) in LIVE_CLASSES.values():
            ref, gen = obj._live  # type: ignore[attr-defined]
            if gen == self.gen:
                return ref  # the program's own container, as the tests (and their changes) see it
            return self.copy_enc(obj.__reduce_ex__(2)[0](*obj.__reduce_ex__(2)[1]))
        ref = self.resolved.get(id(obj))
        if ref is not None:
            return ref
        named = _by_name(obj)
        if named is not None:
            return named  # a standard function or class: the candidate uses its own copy
        raise NotData(
            f"the tests pass a {type(obj).__name__} ({ht.clip(repr(obj))[:80]}) to the program, which cannot cross as data"
        )

    def request(self, op: str, *parts: object) -> object:
        if self.broken:
            self.restart()
        back: list = []  # mutable arguments of a call: the program may change them in place
        if op == "call":
            args, kwargs = parts[1], parts[2]
            back = [a for a in args if type(a) in MUTABLE_ARGS] + [
                a for a in kwargs.values() if type(a) in MUTABLE_ARGS
            ]
            if back:
                indices = [i for i, a in enumerate(args) if type(a) in MUTABLE_ARGS]  # type: ignore[arg-type]
                names = [k for k, a in kwargs.items() if type(a) in MUTABLE_ARGS]  # type: ignore[union-attr]
                parts = (*parts, indices, names)
        try:
            trees = [self.enc(p) for p in parts]
        except NotData as exc:
            if op not in ("instancecheck", "subclasscheck") and self.needs_shared is None:
                self.needs_shared = str(exc)
            raise
        except codec.NotPlain as exc:
            raise NotData(str(exc)) from None
        self.seq += 1
        data = codec.dumps([op, self.seq, *trees])
        ok = False
        try:
            codec.send_frame(self.fd, data)  # type: ignore[arg-type]
            reply = codec.recv_frame(self.fd)  # type: ignore[arg-type]
            ok = reply is not None
        except OSError:
            reply = None
        except codec.BadMessage as exc:
            self.broken = True
            self.suspect("channel", f"the program sent an invalid reply ({exc})")
            raise ProgramDied("the program sent an invalid reply") from None
        finally:
            if not ok:
                self.broken = True  # timed out or died mid-request: the next request restarts it
        if reply is None:
            raise self.died("during a call")
        return self._answer(reply, back)

    def _answer(self, data: bytes, back: list) -> object:
        try:
            msg = codec.loads(data)
            ok = type(msg) is list and len(msg) in (3, 4) and msg[1] == self.seq
            if not ok or msg[0] not in ("ok", "raise", "exit", "bad") or (len(msg) == 4 and msg[0] != "ok"):
                raise codec.BadMessage("unexpected reply")
            kind = msg[0]
            if kind == "ok":
                result = self.dec(msg[2])
                if back:
                    if len(msg) != 4 or type(msg[3]) is not list or len(msg[3]) != len(back):
                        raise codec.BadMessage("missing argument states")
                    for arg, tree in zip(back, msg[3]):
                        hr.update_in_place(arg, self.dec(tree))
                return result
            if kind == "raise":
                exc = self._exception(msg[2])
            elif kind == "exit":
                self.suspect("exit", f"the program raised {ht.clip(str(msg[2]))} during a call")
                exc = ProgramExit(f"the program exited during the test ({ht.clip(str(msg[2]))})")
            else:
                exc = ResultNotData(ht.clip(str(msg[2])))
        except codec.BadMessage as exc_:
            self.broken = True
            self.suspect("channel", f"the program sent an invalid reply ({exc_})")
            raise ProgramDied("the program sent an invalid reply") from None
        raise exc

    # --- what comes back ---------------------------------------------------------------------

    def _result_ref(self, tree: list) -> object:
        tag = tree[0]
        if len(tree) < 3 or type(tree[1]) is not int:
            raise codec.BadMessage("bad reference")
        ref = ["h", tree[1]]
        if tag == "X":
            return self._exc_class(_s(tree, 2), _s(tree, 3))
        if tag == "M":
            module = self._module(_s(tree, 2))
            if module is not None:
                self.resolved[id(module)] = ref
                return module
            return self._remote(ref, self.gen, "module", 0, [])
        if tag == "F":
            obj = self._value_object(_s(tree, 2), _s(tree, 3))
            if obj is not None:
                self.resolved.setdefault(id(obj), ref)
                return obj
            return self._remote(ref, self.gen, _s(tree, 4), _i(tree, 5), [])
        if tag == "h":
            fakes = tree[4] if len(tree) > 4 and type(tree[4]) is list else []
            return self._remote(ref, self.gen, _s(tree, 2), _i(tree, 3), [str(f) for f in fakes[:32]])
        raise codec.BadMessage(f"unexpected reference {tag!r}")

    def _remote(self, ref: list, gen: int | None, typename: str, flags: int, fakes: list) -> Remote:
        key = (tuple(ref), gen)
        remote = self.handles.get(key)
        if remote is None:
            remote = self.handles[key] = Remote(
                ref, gen, typename.replace(ht.PROGRAM_MODULE + ".", "")[:200], flags, fakes
            )
        return remote

    def _exc_class(self, qualname: str, base_name: str) -> type:
        """A judge-side stand-in for an exception class of the program (so assertRaises works)."""
        cls = self.exc_classes.get(qualname)
        if cls is None:
            base = getattr(builtins, base_name, None)
            if not (isinstance(base, type) and issubclass(base, Exception)):
                base = Exception  # never a stand-in for SystemExit or KeyboardInterrupt
            short = qualname.rsplit(".", 1)[-1][:100]
            try:
                cls = type(short, (base,), {"__module__": "<program>", "__qualname__": short})
            except TypeError:
                cls = type(short, (Exception,), {"__module__": "<program>", "__qualname__": short})
            self.exc_classes[qualname] = cls
        return cls

    def _exception(self, tree: object) -> BaseException:
        if type(tree) is not list or len(tree) < 4 or tree[0] not in ("b", "o"):
            raise codec.BadMessage("bad exception")
        message = ht.clip(str(tree[-1]))
        args = self.dec(tree[-2]) if tree[-2] is not None else (message,)
        if type(args) is not tuple:
            args = (message,)
        cls: type | None = None
        if tree[0] == "b":
            cls = getattr(builtins, _s(tree, 1), None)
            if not (isinstance(cls, type) and issubclass(cls, Exception)):
                return ProgramError(f"{_s(tree, 1)}: {message}")
        else:
            module, _, name = _s(tree, 1).rpartition(".")
            cls = self._value_object(module, name)
            if not (isinstance(cls, type) and issubclass(cls, Exception)):
                cls = self._exc_class(_s(tree, 1), _s(tree, 2)) if module == ht.PROGRAM_MODULE else None
            if cls is None:
                return ProgramError(f"{_s(tree, 1)}: {message}")
        try:
            return cls(*args)
        except Exception:  # noqa: BLE001 - e.g. a constructor that wants other arguments
            exc = cls.__new__(cls)
            exc.args = args
            return exc

    def _may_import(self, name: str) -> bool:
        top = name.split(".")[0]
        return top in self.cfg.get("packages", ()) or (top in sys.stdlib_module_names and top not in DENIED_MODULES)

    def _module(self, name: str) -> types.ModuleType | None:
        if not self._may_import(name):
            return None
        try:
            return importlib.import_module(name)
        except Exception:  # noqa: BLE001 - not importable here: the tests get a reference instead
            return None

    def _value_object(self, module: str, qualname: str) -> object:
        """The judge's own copy of a function or class of a value module, else None."""
        if module.split(".")[0] not in VALUE_MODULES:
            return None
        obj: object = self._module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part, None)
            if obj is None or part.startswith("_"):
                return None
        return obj if callable(obj) else None

    def namespace(self, listing: list, allow_shadowing: list, used: _Names) -> dict:
        """The tests' view of the program's globals: data as data, the rest as references.

        A global that takes a builtin's name (``def abs(x): return 0``) is left out, so the tests'
        ``abs`` stays the builtin, unless the caller named it (MBPP 126's entry point is ``sum``);
        one that takes a module's name without being that module (``math = Fake()``) is replaced by
        the judge's own copy of the module."""
        ns: dict = {}
        for entry in listing:
            if type(entry) is not list or len(entry) != 2 or type(entry[0]) is not str or type(entry[1]) is not list:
                continue
            name, tree = entry
            if name in BUILTIN_NAMES and name not in allow_shadowing:
                if name in used:
                    self.suspect("shadow", f"the program defines {name!r}, a builtin's name; the tests use the builtin")
                continue
            module = MODULE_ALIASES.get(name, name)
            # ("F": a standard function or class, e.g. `from datetime import datetime`: the judge's own.)
            if tree[:1] not in (["M"], ["F"]) and self._may_import(module) and _is_module_name(module):
                if name in used:
                    self.suspect("shadow", f"the program binds {name!r} to a non-module; the tests get the module")
                ns[name] = LazyModule(module)
                continue
            try:
                ns[name] = self._global(name, tree)
            except codec.BadMessage:
                continue
        return ns

    def _global(self, name: str, tree: list) -> object:
        tag, ref = tree[0] if tree else None, ["g", name]
        if tag == "v" and len(tree) == 2:
            return self.dec(tree[1])
        if tag == "M" and self._may_import(_s(tree, 2)):
            lazy = LazyModule(_s(tree, 2))  # imported when the tests use it (numpy, pandas: slow)
            self.resolved[id(lazy)] = ref
            return lazy
        if tag in ("M", "F", "X"):
            obj = self._result_ref(tree)
            if type(obj) is not Remote:
                self.resolved[id(obj)] = ref
                return obj
        if tag in ("M", "F", "h"):
            fakes = tree[4] if tag == "h" and len(tree) > 4 and type(tree[4]) is list else []
            typename = "module" if tag == "M" else _s(tree, 4 if tag == "F" else 2)
            flags = 0 if tag == "M" else _i(tree, 5 if tag == "F" else 3)
            return self._remote(ref, None, typename, flags, [str(f) for f in fakes[:32]])
        raise codec.BadMessage("bad global")


class _Names:
    """``_names`` of the tests, parsed on the first question (most programs shadow nothing)."""

    def __init__(self, tests: object, setup: str) -> None:
        self.sources: tuple | None = (tests, setup)
        self.names: set = set()

    def __contains__(self, name: object) -> bool:
        if self.sources is not None:
            self.names, self.sources = _names(*self.sources), None
        return name in self.names


def _names(tests: object, setup: str) -> set:
    """Every name the test source and setup mention (to tell when a shadowed name matters)."""
    import ast

    found: set = set()
    for source in [setup, *([tests] if isinstance(tests, str) else list(tests))]:
        try:
            found |= {n.id for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Name)}
        except (SyntaxError, ValueError, RecursionError):
            pass
    return found


def _is_module_name(name: str) -> bool:
    top = name.split(".")[0]
    return top in sys.stdlib_module_names or name in MODULE_ALIASES.values()


def _by_name(obj: object) -> list | None:
    """``["F", module, qualname]`` for a function or class of a value module (or a builtin), which
    the candidate can look up itself; None for anything else."""
    if not callable(obj):
        return None
    owner = getattr(obj, "__self__", None)
    module = getattr(obj, "__module__", None) or (
        getattr(owner, "__module__", None) if isinstance(owner, type) else None
    )
    qualname = getattr(obj, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qualname, str):
        return None
    if module.split(".")[0] not in VALUE_MODULES and module != "builtins":
        return None
    try:
        found: object = importlib.import_module(module)
        for part in qualname.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError):
        return None
    return ["F", module, qualname] if found is obj or found == obj else None


def _s(tree: list, i: int) -> str:
    if len(tree) <= i or type(tree[i]) is not str:
        raise codec.BadMessage("expected a string")
    return tree[i]


def _i(tree: list, i: int) -> int:
    if len(tree) <= i or type(tree[i]) is not int:
        raise codec.BadMessage("expected an int")
    return tree[i]


def _tracking(emit, link: Link):  # noqa: ANN001, ANN202
    """Wrap ``emit``: reset the per-test notes at each start, and name them in a failing test."""
    test_fields = ("status", "message")

    def tracked(kind: str, **fields: object) -> None:
        if kind == "start":
            link.notes = []
        elif kind == "test" and all(k in fields for k in test_fields):
            if link.strict and link.needs_shared is not None:
                # This test passed the program something that is not data; strict: the test stays failed
                # here, named, and the next tests still run apart from the program.
                fields["shared_reason"] = link.needs_shared
                link.needs_shared = None
            if fields["status"] != "passed" and link.notes:
                fields["message"] = ht.clip(f"{fields['message']} [{'; '.join(dict.fromkeys(link.notes))}]")
            link.notes = []
        emit(kind, **fields)

    return tracked


def run(cfg: dict, job: dict, emit, link: Link) -> None:  # noqa: ANN001
    """Start the candidate, build the tests' namespace, run setup and tests, report each test."""
    status, message, listing = link.start()
    if status != "ok":
        emit("load", status=status, message=message)
        return
    module = types.ModuleType(ht.TESTS_MODULE)
    sys.modules[ht.TESTS_MODULE] = module  # so unittest and pickling find the test classes
    namespace = module.__dict__
    namespace["__file__"] = os.path.join(cfg["workdir"], "program.py")  # as the program's (never written)
    used = _Names(job["tests"], job["setup"])
    namespace.update(link.namespace(listing, list(job.get("allow_shadowing") or ()), used))
    failure = None
    if job["setup"]:
        failure = ht.load_source(job["setup"], "<setup>", namespace)
        if failure is not None:
            failure = ("program_error", "setup: " + failure[1])
    if failure is None and job["kind"] == "unittest":
        failure = ht.load_source(job["tests"], "<tests>", namespace)
        if failure is not None:
            failure = ("program_error", "tests failed to load: " + failure[1])
    if link.needs_shared is not None and link.strict:
        failure = ("program_error", f"setup: needs the program's interpreter ({link.needs_shared})")
    elif link.needs_shared is not None:
        emit("needs_shared", reason=link.needs_shared)
        return
    if failure is not None:
        emit("load", status=failure[0], message=failure[1])
        return
    signal.signal(signal.SIGALRM, ht._alarm)
    tracked = _tracking(emit, link)
    if job["kind"] == "unittest":
        ht.run_unittests(namespace, job["per_test_timeout"], tracked, module=ht.TESTS_MODULE)
    else:
        ht.run_asserts(job["tests"], namespace, job["per_test_timeout"], tracked)
    if link.needs_shared is not None and not link.strict:
        emit("needs_shared", reason=link.needs_shared)
        return
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)
    emit("judge", restarts=max(link.restarts, 0), suspects=link.suspects, cpu=usage.ru_utime + usage.ru_stime)
    emit("done")


def main(cfg: dict, emit, ctl: socket.socket, info: dict, channel: int | None = None) -> None:  # noqa: ANN001
    """Become the judge (forked by the supervisor). Never returns. ``channel``: the first
    candidate's channel, where it was made before the job (a prepared run)."""
    tests_fd = cfg["tests_fd"]
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)  # what the tests print is not the program's output (and must not leak)
    hos.keep_only_fds({0, 1, 2, cfg["result_fd"], ctl.fileno(), tests_fd, -1 if channel is None else channel})
    uid = cfg.get("judge_uid")
    hos.become(uid, files_as=cfg["uid"] if uid is not None else None, dumpable=False)
    os.umask(0)  # files the tests write stay writable for the candidate (another uid, same run)
    os.chdir(cfg["workdir"])
    hos.apply_limits(cfg)
    job = marshal.loads(hos.read_all(tests_fd))
    emit("hello", isolation=info)
    link = hr.LINK = Link(cfg, ctl, emit, channel)
    link.strict = bool(job.get("strict"))
    try:
        run(cfg, job, emit, link)
    finally:
        link.close()
    hos.flush_and_exit()
