"""Launching one harness process, collecting its output under caps, and cleaning up."""

from __future__ import annotations

import json
import marshal
import os
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ._types import SandboxLimits

HARNESS = Path(__file__).with_name("_harness.py")
RESULT_CAP_BYTES = 4 * 1024 * 1024  # result records kept; more is a program flooding the channel
DRAIN_SECONDS = 0.5  # after the harness exits, how long to wait for pipes still held open
POLL_SECONDS = 0.02  # exit polling interval where pidfd_open is unavailable
KILL_GRACE_SECONDS = 5.0  # after SIGKILL, how long to wait for the harness to go away

# Sandbox uids for root mode: one per concurrent run, unique per trainer process, so that
# RLIMIT_NPROC counts exactly one run and leftovers can be found and killed by uid.
UID_BASE = 1_000_000_000
UID_SLOTS = 256
UID_MODES = ("ns-root", "uid")  # isolation modes that run the program under a sandbox uid


@dataclass
class RawRun:
    """What one harness process produced, before interpretation."""

    records: list[dict[str, Any]] = field(default_factory=list)
    stdout: bytes = b""
    stderr: bytes = b""
    output_bytes: int = 0  # stdout + stderr, including what was dropped
    returncode: int | None = None
    cpu: float = 0.0  # user + system seconds of the whole process tree that was reaped
    killed: str | None = None  # "timeout" | "output" when the parent killed the run
    forged: int = 0  # lines on the result channel without the right nonce
    duration: float = 0.0


class _UidPool:
    """Hands out per-run sandbox uids (root mode only)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._free: list[int] = []
        self._pid = -1
        self._swept: set[int] = set()

    def acquire(self) -> int:
        with self._cond:
            if self._pid != os.getpid():  # first use, or we are a forked copy
                base = UID_BASE + (os.getpid() % (1 << 22)) * UID_SLOTS
                self._free = [base + i for i in reversed(range(UID_SLOTS))]
                self._pid, self._swept = os.getpid(), set()
            while not self._free:
                self._cond.wait()
            uid = self._free.pop()
            fresh = uid not in self._swept
            self._swept.add(uid)
        if fresh:  # a crashed earlier process with our pid may have left processes behind
            kill_uid(uid)
        return uid

    def release(self, uid: int) -> None:
        with self._cond:
            if self._pid == os.getpid():
                self._free.append(uid)
                self._cond.notify()


UID_POOL = _UidPool()


def _task_uid_and_state(pid: str) -> tuple[int, str] | None:
    try:
        with open(f"/proc/{pid}/status") as fh:
            text = fh.read()
    except OSError:
        return None
    uid, state = -1, ""
    for line in text.splitlines():
        if line.startswith("Uid:"):
            uid = int(line.split()[1])
        elif line.startswith("State:"):
            state = line.split()[1]
    return uid, state


def processes_of_uid(uid: int) -> list[int]:
    """Live (non-zombie) processes whose real uid is ``uid``."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            info = _task_uid_and_state(entry)
            if info is not None and info[0] == uid and info[1] not in ("Z", "X"):
                found.append(int(entry))
    return found


def kill_uid(uid: int) -> None:
    """SIGKILL every process of a sandbox uid, repeating while new ones appear."""
    for _ in range(50):
        victims = processes_of_uid(uid)
        if not victims:
            return
        for pid in victims:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.002)


def clean_env(workdir: str) -> dict[str, str]:
    """The child's whole environment: nothing is inherited from the trainer."""
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "HOME": workdir,
        "TMPDIR": workdir,
        # One BLAS/OpenMP thread: thread pools would eat the process and memory limits.
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }


_site_paths: list[str] | None = None


def site_paths() -> list[str]:
    """Import paths that ``site`` would add (site-packages and path lines of .pth files).

    The harness runs with -S, so it gets these from us; ``import`` lines of .pth files
    (editable-install finders and the like) are deliberately not run."""
    global _site_paths
    if _site_paths is None:
        import site

        paths: list[str] = []
        for directory in site.getsitepackages():
            if not os.path.isdir(directory):
                continue
            paths.append(directory)
            for name in sorted(os.listdir(directory)):
                if name.endswith(".pth"):
                    paths.extend(_pth_paths(directory, name))
        _site_paths = list(dict.fromkeys(paths))
    return _site_paths


def _pth_paths(directory: str, name: str) -> list[str]:
    try:
        with open(os.path.join(directory, name), encoding="utf-8", errors="replace") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return []
    paths = []
    for line in lines:
        line = line.strip()
        if line and not line.startswith(("#", "import ", "import\t")):
            path = os.path.normpath(os.path.join(directory, line))
            if os.path.isdir(path):
                paths.append(path)
    return paths


def _payload_fd(payload: dict[str, Any]) -> int:
    """An anonymous file holding the job; the harness reads and closes it before isolating."""
    data = marshal.dumps(payload)
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("comlrl-sandbox-job")
    else:
        with tempfile.TemporaryFile() as tmp:
            fd = os.dup(tmp.fileno())
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _killpg(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass


class _Collector:
    """Reads stdout, stderr and the result channel of one run until it is over."""

    def __init__(
        self,
        proc: subprocess.Popen,
        result_fd: int,
        limits: SandboxLimits,
        deadline: float,
        uid: int | None,
        nonce: str,
        pidns: bool,
    ) -> None:
        assert proc.stdout is not None and proc.stderr is not None
        self.proc, self.limits, self.deadline, self.uid = proc, limits, deadline, uid
        self.nonce, self.pidns = nonce, pidns
        self.out_fd, self.err_fd, self.res_fd = proc.stdout.fileno(), proc.stderr.fileno(), result_fd
        self.bufs = {self.out_fd: bytearray(), self.err_fd: bytearray(), self.res_fd: bytearray()}
        self.caps = {
            self.out_fd: limits.max_output_bytes,
            self.err_fd: limits.max_output_bytes,
            self.res_fd: RESULT_CAP_BYTES,
        }
        self.raw = RawRun()
        self.sel = selectors.DefaultSelector()
        for fd in self.bufs:
            os.set_blocking(fd, False)
            self.sel.register(fd, selectors.EVENT_READ)
        self.pidfd = self._pidfd(proc.pid)

    def _pidfd(self, pid: int) -> int | None:
        try:
            fd = os.pidfd_open(pid)  # readable once the process exits
        except (AttributeError, OSError):
            return None
        self.sel.register(fd, selectors.EVENT_READ)
        return fd

    def kill(self, reason: str) -> None:
        if self.raw.killed is None and self.raw.returncode is None:
            self.raw.killed = reason
            _killpg(self.proc.pid)
            if self.uid is not None:
                kill_uid(self.uid)

    def _read(self, fd: int) -> None:
        try:
            chunk = os.read(fd, 1 << 16)
        except BlockingIOError:
            return
        if not chunk:
            self.sel.unregister(fd)
            return
        buf = self.bufs[fd]
        if len(buf) < self.caps[fd]:
            buf += chunk[: self.caps[fd] - len(buf)]
        if fd != self.res_fd:
            self.raw.output_bytes += len(chunk)
            if self.raw.output_bytes > self.limits.output_kill_bytes:
                self.kill("output")

    def _reap_if_exited(self) -> bool:
        # WNOWAIT leaves the zombie in place, so its pid (= process group id) cannot be
        # reused while we kill whatever is left in its group.
        try:
            info = os.waitid(os.P_PID, self.proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            if info is None:
                return False
            _killpg(self.proc.pid)
            _, status, usage = os.wait4(self.proc.pid, 0)
        except ChildProcessError:  # someone else in the trainer reaped it (waitpid(-1))
            self.proc.returncode = -signal.SIGKILL  # unknown; keeps Popen from waiting again
            return True
        self.proc.returncode = self.raw.returncode = os.waitstatus_to_exitcode(status)
        self.raw.cpu = usage.ru_utime + usage.ru_stime
        if self.uid is not None and (self.raw.killed or not self.pidns):
            # A relay that exited by itself has reaped init, whose exit already killed the
            # whole pid namespace; only a killed relay can leave namespace processes dying.
            kill_uid(self.uid)
        return True

    def run(self) -> RawRun:
        """Collect until the harness has exited and its pipes are drained (or given up)."""
        try:
            self._loop()
        finally:
            self.sel.close()
            if self.pidfd is not None:
                os.close(self.pidfd)
        return self._finish()

    def _loop(self) -> None:
        drain_until = None
        while True:
            now = time.monotonic()
            if drain_until is None and now >= self.deadline:
                self.kill("timeout")
            readers = [k for k in self.sel.get_map().values() if k.fd != self.pidfd]
            if drain_until is not None and (not readers or now >= drain_until):
                break
            if drain_until is None and now >= self.deadline + KILL_GRACE_SECONDS:
                break  # unkillable (e.g. stuck in the kernel): give up rather than hang the pool
            if drain_until is not None:
                wait = drain_until - now
            elif self.raw.killed:
                wait = POLL_SECONDS  # SIGKILL sent; the exit is a moment away
            else:
                wait = self.deadline - now
            if self.pidfd is None:
                wait = min(wait, POLL_SECONDS)
            for key, _ in self.sel.select(max(wait, 0.0)):
                if key.fd != self.pidfd:
                    self._read(key.fd)
            if drain_until is None and self._reap_if_exited():
                if self.pidfd is not None:
                    self.sel.unregister(self.pidfd)  # stays readable; stop waking up on it
                drain_until = time.monotonic() + DRAIN_SECONDS

    def _finish(self) -> RawRun:
        raw = self.raw
        raw.stdout, raw.stderr = bytes(self.bufs[self.out_fd]), bytes(self.bufs[self.err_fd])
        raw.records, raw.forged = _parse_records(bytes(self.bufs[self.res_fd]), self.nonce)
        return raw


def _parse_records(data: bytes, nonce: str) -> tuple[list[dict[str, Any]], int]:
    records, forged = [], 0
    for line in data.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            forged += 1
            continue
        if isinstance(record, dict) and record.get("nonce") == nonce:
            records.append(record)
        else:
            forged += 1
    return records, forged


def _spawn(payload: dict[str, Any], workdir: str, result_w: int) -> subprocess.Popen:
    payload_fd = _payload_fd(payload)
    cmd = [sys.executable, "-I", "-S", "-X", "utf8", str(HARNESS), str(payload_fd), str(result_w)]
    try:
        return subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=workdir,
            env=clean_env(workdir),
            start_new_session=True,
            pass_fds=(payload_fd, result_w),
            close_fds=True,
        )
    finally:
        os.close(payload_fd)


def execute(
    job: dict[str, Any], *, mode: str, netns: bool, limits: SandboxLimits, timeout: float, nproc: int | None
) -> RawRun:
    """Run the harness once on ``job`` under the given isolation mode and limits."""
    start = time.monotonic()
    uid = UID_POOL.acquire() if mode in UID_MODES else None
    workdir = tempfile.mkdtemp(prefix="comlrl-sandbox-")
    try:
        if uid is not None:
            os.chown(workdir, uid, uid)
        nonce = secrets.token_hex(16)
        payload = dict(
            job,
            nonce=nonce,
            mode=mode,
            netns=netns,
            uid=uid,
            workdir=workdir,
            parent_pid=os.getpid(),
            nproc=nproc,
            cpu_seconds=limits.cpu_seconds,
            memory_mb=limits.memory_mb,
            file_size_mb=limits.file_size_mb,
            disk_mb=limits.disk_mb,
            per_test_timeout=limits.per_test_timeout,
            site_paths=site_paths(),
        )
        raw = _run_harness(payload, limits, start + timeout, uid, pidns=mode.startswith("ns-"))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        if uid is not None:
            UID_POOL.release(uid)
    raw.duration = time.monotonic() - start
    return raw


def _run_harness(
    payload: dict[str, Any], limits: SandboxLimits, deadline: float, uid: int | None, pidns: bool
) -> RawRun:
    result_r, result_w = os.pipe()
    proc = None
    try:
        try:
            proc = _spawn(payload, payload["workdir"], result_w)
        finally:
            os.close(result_w)  # our copy: EOF arrives once the harness side is gone
        return _Collector(proc, result_r, limits, deadline, uid, payload["nonce"], pidns).run()
    finally:
        os.close(result_r)
        if proc is not None:
            _cleanup(proc, uid)


def _cleanup(proc: subprocess.Popen, uid: int | None) -> None:
    if proc.returncode is None:  # only on errors or an unkillable harness
        _killpg(proc.pid)
        try:
            proc.wait(timeout=KILL_GRACE_SECONDS)
        except subprocess.TimeoutExpired:
            pass  # Popen reaps it later; we must not block the caller
        if uid is not None:
            kill_uid(uid)
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()
