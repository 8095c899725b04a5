"""Test harness that runs inside the sandbox child process (never imported by the trainer).

Started as ``python -I -S _harness.py PAYLOAD_FD RESULT_FD``. It reads its job (program,
tests, limits, nonce; marshal format, written by the trainer) from PAYLOAD_FD, isolates
itself (namespaces, mounts, unprivileged uid, rlimits), runs the program and its tests, and
streams one JSON record per line to RESULT_FD. Every record carries the nonce so the
parent can tell harness records from anything the untrusted program writes. Standard
library only: this file runs as a script, and it avoids heavy imports (json, re,
traceback) on the common path to start fast.

Modes: ``ns-root`` (root: namespaces + a sandbox uid), ``ns-user`` (unprivileged user
namespace), ``uid`` (root without namespaces: only the sandbox uid) and ``plain``
(rlimits only). Process layout in the namespace modes::

    relay (the Popen child, outside the new pid namespace)
      └─ init (pid 1 of the new pid namespace; mounts, reaps, reports the exit status)
           └─ worker (drops privileges, sets rlimits, runs untrusted code)

When init exits the kernel kills every process left in the namespace, so nothing the
program spawned can outlive the run. Without namespaces the relay is the worker.
"""

from __future__ import annotations

import _json
import ctypes
import marshal
import os
import signal
import stat
import sys
import types

PROGRAM_MODULE = "__sandbox_program__"
MESSAGE_CHARS = 2000

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_NOATIME = 1024
MS_NODIRATIME = 2048
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
MS_RELATIME = 1 << 21
MS_STRICTATIME = 1 << 24
PR_SET_PDEATHSIG = 1
PR_SET_NO_NEW_PRIVS = 38
MOUNT_OPTION_FLAGS = {
    "ro": MS_RDONLY,
    "nosuid": MS_NOSUID,
    "nodev": MS_NODEV,
    "noexec": MS_NOEXEC,
    "noatime": MS_NOATIME,
    "nodiratime": MS_NODIRATIME,
    "relatime": MS_RELATIME,
    "strictatime": MS_STRICTATIME,
}

_libc = ctypes.CDLL(None, use_errno=True)
Emit = "Callable[..., None]"  # annotation only (typing is not imported, to start fast)


class TestTimeout(BaseException):
    """Raised by the per-test alarm; a BaseException so ``except Exception`` does not eat it."""


def _make_encoder():  # noqa: ANN202
    encode_str = _json.encode_basestring_ascii

    def to_json(value: object) -> str:
        """Minimal JSON encoder (str, int, float, bool, None, list, dict); no json import."""
        if isinstance(value, str):
            return encode_str(value)
        if value is None or isinstance(value, bool):
            return {None: "null", True: "true", False: "false"}[value]
        if isinstance(value, (int, float)):
            return repr(value) if value == value and abs(value) != float("inf") else "null"
        if isinstance(value, (list, tuple)):
            return "[" + ",".join(to_json(v) for v in value) + "]"
        if isinstance(value, dict):
            return "{" + ",".join(f"{to_json(str(k))}:{to_json(v)}" for k, v in value.items()) + "}"
        return to_json(str(value))

    return to_json


# The program runs in this interpreter and can rebind module globals and builtins, so the
# reporting path keeps its own references (closures, default arguments), taken at import.
to_json = _make_encoder()


def make_emitter(fd: int, nonce: str, _write=os.write, _encode=to_json):  # noqa: ANN001, ANN201
    """A function writing nonce-tagged JSON records, one per line, to the result fd."""

    def emit(kind: str, **fields: object) -> None:
        record = dict(fields, type=kind, nonce=nonce)
        data = (_encode(record) + "\n").encode()
        try:
            while data:
                data = data[_write(fd, data) :]
        except OSError:
            pass  # the program closed our descriptor: its tests simply go unreported

    return emit


def clip(text: str) -> str:
    return text if len(text) <= MESSAGE_CHARS else text[:MESSAGE_CHARS] + "..."


def text_of(exc: BaseException) -> str:
    """str(exc), which runs program code and so may itself raise."""
    try:
        return str(exc)
    except BaseException:  # noqa: BLE001
        return "<unprintable exception>"


def describe(exc: BaseException) -> str:
    text = text_of(exc)
    return clip(f"{type(exc).__name__}: {text}" if text else type(exc).__name__)


# --------------------------------------------------------------------------- isolation


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    def enc(s: str | None) -> bytes | None:
        return None if s is None else s.encode()

    _check(
        _libc.mount(enc(source), enc(target), enc(fstype), flags, enc(data)), f"mount {fstype or source} on {target}"
    )


def _unescape_octal(field: str) -> str:
    """Undo mountinfo's escapes (space is \\040, newline \\012, ...)."""
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and field[i + 1 : i + 4].isdigit():
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def _mountinfo() -> list[tuple[str, int]]:
    """Mount points of this namespace with their per-mount flags (for read-only remounts)."""
    out = []
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            parts = line.split()
            point = _unescape_octal(parts[4])
            flags = 0
            for opt in parts[5].split(","):
                flags |= MOUNT_OPTION_FLAGS.get(opt, 0)
            out.append((point, flags))
    return out


def _remount_all_readonly() -> None:
    # Locked flags (nosuid, nodev, ...) must be repeated or a user-namespace remount fails.
    for point, flags in _mountinfo():
        try:
            _mount(None, point, None, MS_REMOUNT | MS_BIND | MS_RDONLY | flags)
        except OSError:
            pass  # e.g. a mount hidden below another one; it stays as it was


def _tmpfs(target: str, size_mb: int, mode: str, uid: int | None) -> None:
    owner = "" if uid is None else f",uid={uid},gid={uid}"
    _mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV, f"size={size_mb}m,mode={mode}{owner}")


def _blocked_ancestor(paths: list[str]) -> str | None:
    """First directory on the way to ``paths`` that other users cannot traverse."""
    for path in paths:
        parts = path.strip("/").split("/")
        for depth in range(len(parts)):
            anc = "/" + "/".join(parts[:depth])
            if not os.stat(anc).st_mode & stat.S_IXOTH:
                return anc
    return None


def _cover(
    directory: str, keep: list[str], size_mb: int, mode: str, uid: int | None = None, readonly: bool = False
) -> None:
    """Mount a fresh tmpfs over ``directory``, with read-only bind mounts of the entries that
    lead to the ``keep`` paths below it (so the interpreter stays reachable)."""
    prefix = directory.rstrip("/") + "/"
    children = {p[len(prefix) :].split("/")[0] for p in keep if p.startswith(prefix)}
    fds = {c: os.open(prefix + c, os.O_PATH) for c in sorted(children)}  # before they vanish
    _tmpfs(directory, size_mb, mode, uid)
    for child, fd in fds.items():
        target = prefix + child
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            os.mkdir(target)
        else:
            open(target, "w").close()
        _mount(f"/proc/self/fd/{fd}", target, None, MS_BIND | MS_REC)
        _mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY)
        os.close(fd)
    if readonly:
        _mount(None, directory, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)


def _expose_interpreter(paths: list[str]) -> None:
    """Make the interpreter's files reachable for the unprivileged sandbox uid.

    A directory such as /root (mode 0700) on the way to the interpreter is covered with a
    read-only tmpfs holding only bind mounts of the needed entries, which also hides the
    rest of it (keys, tokens) from the program."""
    for _ in range(16):
        anc = _blocked_ancestor(paths)
        if anc is None:
            return
        if anc == "/":
            raise OSError("the root directory is not traversable; cannot expose the interpreter")
        _cover(anc, paths, 1, "0755", readonly=True)
    raise OSError(f"could not expose interpreter paths {paths}")


def _interpreter_paths() -> list[str]:
    """Everything the worker's Python needs to reach: import path and executable."""
    paths = [p for p in sys.path if p and os.path.exists(p)] + [sys.executable]
    return sorted({q for p in paths for q in (os.path.abspath(p), os.path.realpath(p))})


def _setup_mounts(cfg: dict) -> None:
    """Private, read-only view of the file system with fresh tmpfs scratch space."""
    _mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing below may propagate to the host
    _remount_all_readonly()
    size, uid, workdir = cfg["disk_mb"], cfg["uid"], cfg["workdir"]
    needed = _interpreter_paths()
    for scratch in ("/tmp", "/var/tmp", "/dev/shm"):
        if os.path.isdir(scratch) and not os.path.islink(scratch):
            _cover(scratch, needed, size, "1777")  # e.g. a virtualenv in /tmp stays visible
    os.makedirs(workdir, exist_ok=True)
    _tmpfs(workdir, size, "0700", uid)
    if uid is not None:
        _expose_interpreter(needed + [workdir])
    _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)


def _write_id_maps(uid: int, gid: int) -> None:
    """Map our own uid/gid into the new user namespace (unmapped ids cannot create files)."""
    with open("/proc/self/setgroups", "w") as fh:
        fh.write("deny")
    with open("/proc/self/uid_map", "w") as fh:
        fh.write(f"{uid} {uid} 1")
    with open("/proc/self/gid_map", "w") as fh:
        fh.write(f"{gid} {gid} 1")


def _exit_code(status: int) -> int:
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


def _relay(child: int) -> None:
    """Outside the pid namespace: wait for init and exit with its status."""
    _, status = os.waitpid(child, 0)
    os._exit(_exit_code(status))


def _init(worker: int, emit: Emit) -> None:
    """Pid 1: reap everything; when the worker ends, report how and exit (killing the rest)."""
    while True:
        pid, status, usage = os.wait4(-1, 0)
        if pid == worker:
            emit("exit", code=os.waitstatus_to_exitcode(status), cpu=usage.ru_utime + usage.ru_stime)
            os._exit(_exit_code(status))


def _die_with_parent() -> None:
    prctl = getattr(_libc, "prctl", None)  # Linux only
    if prctl is not None:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _drop_capabilities() -> None:
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this thread
    data = (ctypes.c_uint32 * 6)()
    _check(_libc.capset(header, data), "capset")


def _drop_privileges(cfg: dict) -> None:
    uid = cfg["uid"]
    if uid is not None:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)  # a uid change also clears every capability
    else:
        _drop_capabilities()
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(NO_NEW_PRIVS)")
    _die_with_parent()  # a uid change cleared the earlier setting


def isolate(cfg: dict, emit: Emit) -> dict:
    """Enter the configured isolation; returns in the worker process only."""
    mode = cfg["mode"]
    if mode in ("plain", "uid"):  # no namespaces; "uid" still drops root for a sandbox uid
        if mode == "uid":
            _drop_privileges(cfg)
        return {"mode": mode, "netns": False, "pidns": False, "uid": os.getuid()}
    flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS
    if cfg["netns"]:
        flags |= CLONE_NEWNET
    if mode == "ns-user":
        flags |= CLONE_NEWUSER
    uid, gid = os.getuid(), os.getgid()  # read before unsharing: unmapped ids read as 65534
    _check(_libc.unshare(flags), "unshare")
    if mode == "ns-user":
        _write_id_maps(uid, gid)
    child = os.fork()
    if child:
        _relay(child)
    # If the relay is killed (wall-clock timeout), pid 1 dies and takes the namespace with it.
    _die_with_parent()
    _setup_mounts(cfg)
    worker = os.fork()
    if worker:
        _init(worker, emit)
    _drop_privileges(cfg)
    os.chdir(cfg["workdir"])
    return {"mode": mode, "netns": bool(cfg["netns"]), "pidns": True, "uid": os.getuid()}


def apply_limits(cfg: dict) -> None:
    import resource

    mb = 1024 * 1024
    cpu = int(cfg["cpu_seconds"])
    limits = {
        resource.RLIMIT_CPU: cpu,
        resource.RLIMIT_AS: int(cfg["memory_mb"]) * mb,
        resource.RLIMIT_FSIZE: int(cfg["file_size_mb"]) * mb,
        resource.RLIMIT_CORE: 0,
    }
    if cfg["nproc"] is not None:
        limits[resource.RLIMIT_NPROC] = int(cfg["nproc"])
    for which, value in limits.items():
        resource.setrlimit(which, (value, value))
    # Oversized writes then fail with an OSError the program sees, instead of killing it.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)


# --------------------------------------------------------------------------- running tests


def _alarm(_signum: int, _frame: object) -> None:
    raise TestTimeout()


def _start_timer(seconds: float, _setitimer=signal.setitimer) -> None:  # noqa: ANN001
    _setitimer(signal.ITIMER_REAL, max(seconds, 0.001))


def _stop_timer(_setitimer=signal.setitimer) -> None:  # noqa: ANN001
    _setitimer(signal.ITIMER_REAL, 0)


def _failure_message(exc: BaseException, source: str) -> str:
    """The assertion message, or else the failing line of the test source."""
    text = text_of(exc)
    if text:
        return clip(text)
    # Walk the traceback by hand: importing `traceback` now would run import machinery
    # the program may have tampered with.
    lineno, tb = None, exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename.startswith("<test"):
            lineno = tb.tb_lineno
        tb = tb.tb_next
    lines = source.splitlines()
    if lineno is not None and 0 < lineno <= len(lines):
        return clip(f"line {lineno}: {lines[lineno - 1].strip()}")
    return clip(source.strip())


def run_statement_test(
    index: int,
    source: str,
    namespace: dict,
    timeout: float,
    _compile=compile,
    _exec=exec,
    _start=_start_timer,  # noqa: ANN001
    _stop=_stop_timer,
) -> tuple[str, str]:  # noqa: ANN001
    """Run one assert statement / test block; returns (status, message)."""
    try:
        code = _compile(source, f"<test {index}>", "exec")
    except (SyntaxError, ValueError) as exc:
        return "error", describe(exc)
    try:
        _start(timeout)
        try:
            _exec(code, namespace)
        finally:
            _stop()
    except TestTimeout:
        return "timeout", f"test exceeded {timeout:g} s"
    except AssertionError as exc:
        return "failed", _failure_message(exc, source)
    except BaseException as exc:  # SystemExit and KeyboardInterrupt are test errors too
        return "error", describe(exc)
    return "passed", ""


def run_asserts(tests: list[str] | str, namespace: dict, timeout: float, emit: Emit, _run=run_statement_test) -> None:  # noqa: ANN001
    """Run each assert statement (or the one test block) as its own test."""
    items = [("check", tests)] if isinstance(tests, str) else [(f"assert {i}", t) for i, t in enumerate(tests)]
    emit("plan", names=[name for name, _ in items])
    for index, (name, source) in enumerate(items):
        emit("start", index=index)
        status, message = _run(index, source, namespace, timeout)
        emit("test", index=index, name=name, status=status, message=message)


def _test_case_classes(namespace: dict) -> list[type]:
    import unittest

    return [
        v
        for v in list(namespace.values())
        if isinstance(v, type) and issubclass(v, unittest.TestCase) and v.__module__ == PROGRAM_MODULE
    ]


def _make_result_class():  # noqa: ANN202 - built lazily so plain asserts never import unittest
    import unittest

    class StreamingResult(unittest.TestResult):
        """Reports each test as it finishes and arms the per-test alarm around it."""

        def __init__(self, emit: Emit, index: dict, timeout: float) -> None:
            super().__init__()
            self.emit, self.index, self.timeout = emit, index, timeout
            self.outcome: tuple[str, str] = ("passed", "")
            self.fixture_error = ""
            self.reported: set[str] = set()

        def _name(self, test: unittest.TestCase) -> str:
            return f"{type(test).__name__}.{test._testMethodName}"

        def startTest(self, test):  # noqa: N802, ANN001, ANN201
            super().startTest(test)
            self.outcome = ("passed", "")
            self.emit("start", index=self.index.get(self._name(test), -1))
            _start_timer(self.timeout)

        def stopTest(self, test):  # noqa: N802, ANN001, ANN201
            _stop_timer()
            name = self._name(test)
            self.reported.add(name)
            status, message = self.outcome
            self.emit("test", index=self.index.get(name, -1), name=name, status=status, message=message)
            super().stopTest(test)

        def _set(self, status: str, message: str) -> None:
            if self.outcome[0] == "passed":  # keep the first problem of a test
                self.outcome = (status, clip(message))

        def addFailure(self, test, err):  # noqa: N802, ANN001, ANN201
            self._set("failed", text_of(err[1]) or "assertion failed")

        def addError(self, test, err):  # noqa: N802, ANN001, ANN201
            if not isinstance(test, unittest.TestCase):  # setUpClass / module fixture failed
                self.fixture_error = describe(err[1])
            elif issubclass(err[0], TestTimeout):
                self._set("timeout", f"test exceeded {self.timeout:g} s")
            else:
                self._set("error", describe(err[1]))

        def addSubTest(self, test, subtest, err):  # noqa: N802, ANN001, ANN201
            if err is not None:
                failed = issubclass(err[0], test.failureException)
                (self.addFailure if failed else self.addError)(test, err)

        def addSkip(self, test, reason):  # noqa: N802, ANN001, ANN201
            self.outcome = ("passed", clip(f"skipped: {reason}"))

        def addUnexpectedSuccess(self, test):  # noqa: N802, ANN001, ANN201
            self._set("failed", "unexpected success")

    return StreamingResult


def run_unittests(namespace: dict, timeout: float, emit: Emit) -> None:
    """Run every TestCase class the program/test source defined, one record per method."""
    import unittest

    loader = unittest.TestLoader()
    classes = _test_case_classes(namespace)
    names = [f"{c.__name__}.{m}" for c in classes for m in loader.getTestCaseNames(c)]
    emit("plan", names=names)
    index = {name: i for i, name in enumerate(names)}
    result = _make_result_class()(emit, index, timeout)
    for cls in classes:
        result.fixture_error = ""
        try:
            loader.loadTestsFromTestCase(cls).run(result)
        except TestTimeout:  # the alarm fired inside unittest's own bookkeeping
            result.fixture_error = f"test exceeded {timeout:g} s"
        for method in loader.getTestCaseNames(cls):
            name = f"{cls.__name__}.{method}"
            if name not in result.reported:
                status = "timeout" if "exceeded" in result.fixture_error else "error"
                emit(
                    "test",
                    index=index[name],
                    name=name,
                    status=status,
                    message=result.fixture_error or "test did not run",
                )


def load_source(source: str, filename: str, namespace: dict) -> tuple[str, str] | None:
    """Compile and execute module-level code; returns (status, message) if that fails."""
    try:
        code = compile(source, filename, "exec")
    except (SyntaxError, ValueError) as exc:
        return "syntax_error", describe(exc)
    try:
        exec(code, namespace)
    except BaseException as exc:
        return "program_error", describe(exc)
    return None


def _testcase_guard():  # noqa: ANN202
    """Snapshot of unittest.TestCase's attributes, restored before tests run, so a program
    cannot simply neuter assertEqual and friends."""
    import unittest

    saved = dict(vars(unittest.TestCase))

    def restore() -> None:
        for name, value in saved.items():
            if vars(unittest.TestCase).get(name) is not value:
                setattr(unittest.TestCase, name, value)

    return restore


def load_all(cfg: dict, namespace: dict) -> tuple[str, str] | None:
    """Load program, setup code and (for unittest) the test module; (status, message) on failure."""
    failure = load_source(cfg["program"], "<program>", namespace)
    if failure is None and cfg["setup"]:
        failure = load_source(cfg["setup"], "<setup>", namespace)
        if failure is not None:
            failure = ("program_error", "setup: " + failure[1])
    if failure is None and cfg["kind"] == "unittest":
        failure = load_source(cfg["tests"], "<tests>", namespace)
        if failure is not None:
            failure = ("program_error", "tests failed to load: " + failure[1])
    return failure


def run_job(cfg: dict, emit: Emit) -> None:
    """Load the program, run its tests, report everything, then emit "done"."""
    unittest_kind = cfg["kind"] == "unittest"
    restore = _testcase_guard() if unittest_kind else None
    runner = run_unittests if unittest_kind else run_asserts  # taken before the program runs
    set_handler, alarm = signal.signal, _alarm
    module = types.ModuleType(PROGRAM_MODULE)
    sys.modules[PROGRAM_MODULE] = module  # so pickling and unittest fixtures find it
    namespace = module.__dict__
    namespace["__file__"] = os.path.join(cfg["workdir"], "program.py")  # never written
    failure = load_all(cfg, namespace)
    if failure is not None:
        emit("load", status=failure[0], message=failure[1])
        return
    set_handler(signal.SIGALRM, alarm)
    if restore is not None:
        restore()
        runner(namespace, cfg["per_test_timeout"], emit)
    else:
        runner(cfg["tests"], namespace, cfg["per_test_timeout"], emit)
    emit("done")


def probe(emit: Emit) -> None:
    """Check that the isolated worker can still import and write (used to pick a mode)."""
    import fractions  # noqa: F401  (a stdlib module nothing has imported yet)

    with open("probe.txt", "w") as fh:
        fh.write("ok")
    emit("done")


def _read_all(fd: int) -> bytes:
    chunks = []
    while True:
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(fd)
    return b"".join(chunks)


def _flush_and_exit() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:  # noqa: BLE001 - the program may have closed or replaced it
            pass
    os._exit(0)  # skip atexit handlers and non-daemon threads the program left behind


def _install_site_builtins() -> None:
    """exit() and quit(), which ``site`` would have added (programs do call them)."""
    import _sitebuiltins
    import builtins

    builtins.exit = _sitebuiltins.Quitter("exit", "Ctrl-D (i.e. EOF)")
    builtins.quit = _sitebuiltins.Quitter("quit", "Ctrl-D (i.e. EOF)")


def main() -> None:
    payload_fd, result_fd = int(sys.argv[1]), int(sys.argv[2])
    cfg = marshal.loads(_read_all(payload_fd))
    # Started with -S (site's .pth processing costs ~25 ms); the trainer sends the paths.
    sys.path.extend(p for p in cfg["site_paths"] if p not in sys.path)
    _install_site_builtins()
    os.set_inheritable(result_fd, False)  # programs the code execs do not get the channel
    emit = make_emitter(result_fd, cfg.pop("nonce"))
    # If the trainer dies, so do we (and with us, in namespace mode, everything we started).
    _die_with_parent()
    if os.getppid() != cfg["parent_pid"]:
        os._exit(4)  # the trainer died before the line above
    try:
        info = isolate(cfg, emit)
        apply_limits(cfg)
    except Exception as exc:  # noqa: BLE001 - reported, then the run counts as crashed
        emit("setup_failed", message=describe(exc))
        os._exit(3)
    emit("hello", isolation=info)
    if cfg.get("probe"):
        probe(emit)
    else:
        run_job(cfg, emit)
    _flush_and_exit()


if __name__ == "__main__":
    main()
