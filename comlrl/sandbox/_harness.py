"""Test harness that runs inside the sandbox child process (never imported by the trainer).

Started as ``python -I _harness.py PAYLOAD_FD RESULT_FD``. It reads its job (program, tests,
limits, nonce) from PAYLOAD_FD, isolates itself (namespaces, mounts, unprivileged uid,
rlimits), runs the program and its tests, and streams one JSON record per line to
RESULT_FD. Every record carries the nonce so the parent can tell harness records from
anything the untrusted program writes. Standard library only: this file runs as a script.

Process layout in namespace mode (``ns-root`` / ``ns-user``)::

    relay (the Popen child, outside the new pid namespace)
      └─ init (pid 1 of the new pid namespace; mounts, reaps, reports the exit status)
           └─ worker (drops privileges, sets rlimits, runs untrusted code)

When init exits the kernel kills every process left in the namespace, so nothing the
program spawned can outlive the run. In ``plain`` mode the relay is the worker.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import stat
import sys
import traceback
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
    "ro": MS_RDONLY, "nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC,
    "noatime": MS_NOATIME, "nodiratime": MS_NODIRATIME, "relatime": MS_RELATIME,
    "strictatime": MS_STRICTATIME,
}

_libc = ctypes.CDLL(None, use_errno=True)


class TestTimeout(BaseException):
    """Raised by the per-test alarm; a BaseException so ``except Exception`` does not eat it."""


class Reporter:
    """Writes nonce-tagged JSON records to the result descriptor."""

    def __init__(self, fd: int, nonce: str) -> None:
        self.fd = fd
        self.nonce = nonce

    def emit(self, kind: str, **fields: object) -> None:
        record = dict(fields, type=kind, nonce=self.nonce)
        data = (json.dumps(record) + "\n").encode()
        try:
            while data:
                data = data[os.write(self.fd, data):]
        except OSError:
            pass  # the program closed our descriptor: its tests simply go unreported


def clip(text: str) -> str:
    return text if len(text) <= MESSAGE_CHARS else text[:MESSAGE_CHARS] + "..."


def describe(exc: BaseException) -> str:
    return clip(f"{type(exc).__name__}: {exc}")


# --------------------------------------------------------------------------- isolation


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int,
           data: str | None = None) -> None:
    enc = (lambda s: None if s is None else s.encode())
    _check(_libc.mount(enc(source), enc(target), enc(fstype), flags, enc(data)),
           f"mount {fstype or source} on {target}")


def _mountinfo() -> list[tuple[str, int]]:
    """Mount points of this namespace with their per-mount flags (for read-only remounts)."""
    out = []
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            parts = line.split()
            point = parts[4].encode().decode("unicode_escape")  # octal escapes such as \040
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


def _blocked_ancestor(paths: list[str]) -> tuple[str, set[str]] | None:
    """First directory on the way to ``paths`` that other users cannot traverse, and the
    child entries of it that must stay reachable."""
    for path in paths:
        parts = path.strip("/").split("/")
        for depth in range(len(parts)):
            anc = "/" + "/".join(parts[:depth])
            if not os.stat(anc).st_mode & stat.S_IXOTH:
                prefix = anc.rstrip("/") + "/"
                children = {p[len(prefix):].split("/")[0] for p in paths if p.startswith(prefix)}
                return anc, children
    return None


def _expose_interpreter(paths: list[str]) -> None:
    """Make the interpreter's import path reachable for the unprivileged uid.

    A directory such as /root (mode 0700) on the way to the interpreter is covered with a
    read-only tmpfs holding only bind mounts of the needed entries, which also hides the
    rest of it (keys, tokens) from the program."""
    for _ in range(16):
        found = _blocked_ancestor(paths)
        if found is None:
            return
        anc, children = found
        if anc == "/":
            raise OSError("the root directory is not traversable; cannot expose the interpreter")
        fds = {c: os.open(os.path.join(anc, c), os.O_PATH) for c in children}
        _tmpfs(anc, 1, "0755", None)
        for child, fd in fds.items():
            target = os.path.join(anc, child)
            if stat.S_ISDIR(os.fstat(fd).st_mode):
                os.mkdir(target)
            else:
                open(target, "w").close()
            _mount(f"/proc/self/fd/{fd}", target, None, MS_BIND | MS_REC)
            _mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY)
            os.close(fd)
        _mount(None, anc, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
    raise OSError(f"could not expose interpreter paths {paths}")


def _setup_mounts(cfg: dict) -> None:
    """Private, read-only view of the file system with fresh tmpfs scratch space."""
    _mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing below may propagate to the host
    _remount_all_readonly()
    size, uid = cfg["disk_mb"], cfg["uid"]
    for scratch in ("/tmp", "/var/tmp", "/dev/shm"):
        if os.path.isdir(scratch) and not os.path.islink(scratch):
            _tmpfs(scratch, size, "1777", None)
    workdir = cfg["workdir"]
    os.makedirs(workdir, exist_ok=True)
    _tmpfs(workdir, size, "0700", uid)
    if uid is not None:
        paths = [os.path.realpath(p) for p in sys.path if p and os.path.exists(p)]
        _expose_interpreter(sorted(set(paths)))
    _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)


def _write_id_maps() -> None:
    uid, gid = os.getuid(), os.getgid()
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


def _init(worker: int, rep: Reporter) -> None:
    """Pid 1: reap everything; when the worker ends, report how and exit (killing the rest)."""
    while True:
        pid, status, usage = os.wait4(-1, 0)
        if pid == worker:
            rep.emit("exit", code=os.waitstatus_to_exitcode(status),
                     cpu=usage.ru_utime + usage.ru_stime)
            os._exit(_exit_code(status))


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


def isolate(cfg: dict, rep: Reporter) -> dict:
    """Enter the configured isolation; returns in the worker process only."""
    mode = cfg["mode"]
    if mode == "plain":
        return {"mode": mode, "netns": False, "pidns": False, "uid": os.getuid()}
    flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS
    if cfg["netns"]:
        flags |= CLONE_NEWNET
    if mode == "ns-user":
        flags |= CLONE_NEWUSER
    _check(_libc.unshare(flags), "unshare")
    if mode == "ns-user":
        _write_id_maps()
    child = os.fork()
    if child:
        _relay(child)
    # If the relay is killed (wall-clock timeout), pid 1 dies and takes the namespace with it.
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    _setup_mounts(cfg)
    worker = os.fork()
    if worker:
        _init(worker, rep)
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


def _start_timer(seconds: float) -> None:
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.001))


def _stop_timer() -> None:
    signal.setitimer(signal.ITIMER_REAL, 0)


def _failure_message(exc: BaseException, source: str) -> str:
    if str(exc):
        return clip(str(exc))
    tb = traceback.extract_tb(exc.__traceback__)
    frames = [f for f in tb if f.filename.startswith("<test")]
    if frames and frames[-1].lineno:
        lines = source.splitlines()
        lineno = frames[-1].lineno
        if 0 < lineno <= len(lines):
            return clip(f"line {lineno}: {lines[lineno - 1].strip()}")
    return clip(source.strip())


def run_statement_test(index: int, source: str, namespace: dict, timeout: float) -> tuple[str, str]:
    """Run one assert statement / test block; returns (status, message)."""
    try:
        code = compile(source, f"<test {index}>", "exec")
    except (SyntaxError, ValueError) as exc:
        return "error", describe(exc)
    try:
        _start_timer(timeout)
        try:
            exec(code, namespace)
        finally:
            _stop_timer()
    except TestTimeout:
        return "timeout", f"test exceeded {timeout:g} s"
    except AssertionError as exc:
        return "failed", _failure_message(exc, source)
    except BaseException as exc:  # SystemExit and KeyboardInterrupt are test errors too
        return "error", describe(exc)
    return "passed", ""


def run_asserts(tests: list[str] | str, namespace: dict, timeout: float, rep: Reporter) -> None:
    items = [("check", tests)] if isinstance(tests, str) else [
        (f"assert {i}", t) for i, t in enumerate(tests)]
    rep.emit("plan", names=[name for name, _ in items])
    for index, (name, source) in enumerate(items):
        rep.emit("start", index=index)
        status, message = run_statement_test(index, source, namespace, timeout)
        rep.emit("test", index=index, name=name, status=status, message=message)


def _test_case_classes(namespace: dict) -> list[type]:
    import unittest

    return [v for v in list(namespace.values())
            if isinstance(v, type) and issubclass(v, unittest.TestCase)
            and v.__module__ == PROGRAM_MODULE]


def _make_result_class():  # noqa: ANN202 - built lazily so plain asserts never import unittest
    import unittest

    class StreamingResult(unittest.TestResult):
        """Reports each test as it finishes and arms the per-test alarm around it."""

        def __init__(self, rep: Reporter, index: dict, timeout: float) -> None:
            super().__init__()
            self.rep, self.index, self.timeout = rep, index, timeout
            self.outcome: tuple[str, str] = ("passed", "")
            self.fixture_error = ""
            self.reported: set[str] = set()

        def _name(self, test: unittest.TestCase) -> str:
            return f"{type(test).__name__}.{test._testMethodName}"

        def startTest(self, test):  # noqa: N802, ANN001, ANN201
            super().startTest(test)
            self.outcome = ("passed", "")
            self.rep.emit("start", index=self.index.get(self._name(test), -1))
            _start_timer(self.timeout)

        def stopTest(self, test):  # noqa: N802, ANN001, ANN201
            _stop_timer()
            name = self._name(test)
            self.reported.add(name)
            status, message = self.outcome
            self.rep.emit("test", index=self.index.get(name, -1), name=name,
                          status=status, message=message)
            super().stopTest(test)

        def _set(self, status: str, message: str) -> None:
            if self.outcome[0] == "passed":  # keep the first problem of a test
                self.outcome = (status, clip(message))

        def addFailure(self, test, err):  # noqa: N802, ANN001, ANN201
            self._set("failed", str(err[1]) or "assertion failed")

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


def run_unittests(namespace: dict, timeout: float, rep: Reporter) -> None:
    """Run every TestCase class the program/test source defined, one record per method."""
    import unittest

    loader = unittest.TestLoader()
    classes = _test_case_classes(namespace)
    names = [f"{c.__name__}.{m}" for c in classes for m in loader.getTestCaseNames(c)]
    rep.emit("plan", names=names)
    index = {name: i for i, name in enumerate(names)}
    result = _make_result_class()(rep, index, timeout)
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
                rep.emit("test", index=index[name], name=name, status=status,
                         message=result.fixture_error or "test did not run")


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


def run_job(cfg: dict, rep: Reporter) -> None:
    module = types.ModuleType(PROGRAM_MODULE)
    sys.modules[PROGRAM_MODULE] = module  # so pickling and unittest fixtures find it
    namespace = module.__dict__
    failure = load_source(cfg["program"], "<program>", namespace)
    if failure is None and cfg["setup"]:
        failure = load_source(cfg["setup"], "<setup>", namespace)
        if failure is not None:
            failure = ("program_error", "setup: " + failure[1])
    if failure is None and cfg["kind"] == "unittest":
        failure = load_source(cfg["tests"], "<tests>", namespace)
        if failure is not None:
            failure = ("program_error", "tests failed to load: " + failure[1])
    if failure is not None:
        rep.emit("load", status=failure[0], message=failure[1])
        return
    signal.signal(signal.SIGALRM, _alarm)
    if cfg["kind"] == "unittest":
        run_unittests(namespace, cfg["per_test_timeout"], rep)
    else:
        run_asserts(cfg["tests"], namespace, cfg["per_test_timeout"], rep)
    rep.emit("done")


def probe(rep: Reporter) -> None:
    """Check that the isolated worker can still import and write (used to pick a mode)."""
    import fractions  # noqa: F401  (a stdlib module nothing has imported yet)

    with open("probe.txt", "w") as fh:
        fh.write("ok")
    rep.emit("done")


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


def main() -> None:
    payload_fd, result_fd = int(sys.argv[1]), int(sys.argv[2])
    cfg = json.loads(_read_all(payload_fd))
    os.set_inheritable(result_fd, False)  # programs the code execs do not get the channel
    rep = Reporter(result_fd, cfg.pop("nonce"))
    try:
        info = isolate(cfg, rep)
        apply_limits(cfg)
    except Exception as exc:  # noqa: BLE001 - reported, then the run counts as crashed
        rep.emit("setup_failed", message=describe(exc))
        os._exit(3)
    rep.emit("hello", isolation=info)
    if cfg.get("probe"):
        probe(rep)
    else:
        run_job(cfg, rep)
    _flush_and_exit()


if __name__ == "__main__":
    main()
