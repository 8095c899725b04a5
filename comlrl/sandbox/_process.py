"""Launching one run (a fresh interpreter, or a fork of the warm zygote), collecting its output under
caps, and cleaning up."""

from __future__ import annotations

import json
import marshal
import os
import secrets
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ._types import SandboxLimits
from .harness._harness_os import kill_uid  # the harness processes use the same one

HARNESS = Path(__file__).parent / "harness" / "_harness.py"
RESULT_CAP_BYTES = 4 * 1024 * 1024  # result records kept; more is a program flooding the channel
DRAIN_SECONDS = 0.5  # after the harness exits, how long to wait for pipes still held open
FINISH_SECONDS = 10.0  # how long a finished run's processes may take to go before a uid sweep
POLL_SECONDS = 0.02  # exit polling interval where pidfd_open is unavailable
KILL_GRACE_SECONDS = 5.0  # after SIGKILL, how long to wait for the harness to go away

# Sandbox uids for root mode: two per concurrent run (candidate, judge = candidate + 1), unique per
# trainer process, so that RLIMIT_NPROC counts exactly one run and leftovers can be found by uid.
UID_BASE = 1_000_000_000
UID_SLOTS = 512  # uids per trainer process
RUN_SLOTS = UID_SLOTS // 2
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
    pending: bool = False  # the run's processes were still going away when collection ended


class _UidPool:
    """Hands out per-run sandbox uids (root mode only): the candidate's; the judge's is one more."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._free: list[int] = []
        self._pid = -1
        self._swept: set[int] = set()

    def acquire(self) -> int:
        with self._cond:
            if self._pid != os.getpid():  # first use, or we are a forked copy
                base = UID_BASE + (os.getpid() % (1 << 22)) * UID_SLOTS
                self._free = [base + 2 * i for i in reversed(range(RUN_SLOTS))]
                self._pid, self._swept = os.getpid(), set()
            while not self._free:
                self._cond.wait()
            uid = self._free.pop()
            fresh = uid not in self._swept
            self._swept.add(uid)
        if fresh:  # a crashed earlier process with our pid may have left processes behind
            kill_uid(uid)
            kill_uid(uid + 1)
        return uid

    def release(self, uid: int) -> None:
        with self._cond:
            if self._pid == os.getpid():
                self._free.append(uid)
                self._cond.notify()


UID_POOL = _UidPool()


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


def memfd(data: bytes, name: str = "comlrl-sandbox") -> int:
    """An anonymous file holding ``data``, positioned at its start."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create(name)
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
    """Reads stdout, stderr and the result channel of one run until it is over.

    A spawned run is over when its process has exited (pidfd or polling); a zygote run when the
    result channel reaches end of file, which happens after the zygote has reaped the run and
    written how it ended (the "reaped" record)."""

    def __init__(
        self,
        fds: tuple[int, int, int],
        limits: SandboxLimits,
        deadline: float,
        uid: int | None,
        nonce: str,
        pidns: bool,
        proc: subprocess.Popen | None = None,
        kill: Any = None,
        early: bool = False,
    ) -> None:
        self.limits, self.deadline, self.uid, self.nonce, self.pidns = limits, deadline, uid, nonce, pidns
        # early: the run is over at the judge's "done" record (split runs in a pid namespace).
        # Whatever the program printed before its last answer is in the pipe by then; the run's
        # processes finish dying off the critical path (see _Finisher).
        self.early, self.finished = early, False
        self.proc, self.kill_run = proc, kill
        self.out_fd, self.err_fd, self.res_fd = fds
        self.bufs = {fd: bytearray() for fd in fds}
        self.caps = {self.out_fd: limits.max_output_bytes, self.err_fd: limits.max_output_bytes}
        self.caps[self.res_fd] = RESULT_CAP_BYTES
        self.raw = RawRun()
        self.poll = select.poll()
        self.open: set[int] = set()  # descriptors not at end of file yet
        for fd in fds:
            os.set_blocking(fd, False)
            self.poll.register(fd, select.POLLIN)
            self.open.add(fd)
        self.pidfd = self._pidfd(proc.pid) if proc is not None else None
        self.result_eof = False
        self.parsed: tuple[int, list[dict[str, Any]], int] | None = None  # (bytes parsed, records, forged)

    def _pidfd(self, pid: int) -> int | None:
        try:
            fd = os.pidfd_open(pid)  # readable once the process exits
        except (AttributeError, OSError):
            return None
        self.poll.register(fd, select.POLLIN)
        return fd

    def _kill_uids(self) -> None:
        if self.uid is not None:
            kill_uid(self.uid)
            kill_uid(self.uid + 1)

    def kill(self, reason: str) -> None:
        if self.raw.killed is None and self.raw.returncode is None:
            self.raw.killed = reason
            if self.proc is not None:
                _killpg(self.proc.pid)
            else:
                self.kill_run()
            self._kill_uids()

    def _read(self, fd: int) -> None:
        try:
            chunk = os.read(fd, 1 << 16)
        except BlockingIOError:
            return
        if not chunk:
            self.poll.unregister(fd)
            self.open.discard(fd)
            self.result_eof = self.result_eof or fd == self.res_fd
            return
        buf = self.bufs[fd]
        if len(buf) < self.caps[fd]:
            buf += chunk[: self.caps[fd] - len(buf)]
        if fd == self.res_fd and self.early and b'"done"' in chunk:
            records, forged = _parse_records(bytes(buf), self.nonce)
            self.parsed = (len(buf), records, forged)
            self.finished = any(r.get("type") == "done" for r in records)
        if fd != self.res_fd:
            self.raw.output_bytes += len(chunk)
            if self.raw.output_bytes > self.limits.output_kill_bytes:
                self.kill("output")

    def _drain_now(self) -> None:
        for fd in (self.out_fd, self.err_fd):
            for _ in range(64):
                if fd not in self.open or self.raw.killed:
                    break
                before = self.raw.output_bytes
                self._read(fd)
                if self.raw.output_bytes == before:
                    break

    def _exited(self) -> bool:
        if self.proc is None:
            return self.result_eof or self.finished
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
        if self.raw.killed or not self.pidns:
            # A relay that exited by itself has reaped init, whose exit already killed the
            # whole pid namespace; only a killed relay can leave namespace processes dying.
            self._kill_uids()
        return True

    def run(self) -> RawRun:
        """Collect until the run is over and its pipes are drained (or given up)."""
        try:
            self._loop()
        finally:
            if self.pidfd is not None:
                os.close(self.pidfd)
        return self._finish()

    def _loop(self) -> None:
        drain_until = None
        while True:
            now = time.monotonic()
            if drain_until is None and now >= self.deadline:
                self.kill("timeout")
            if drain_until is not None and (not self.open or now >= drain_until):
                break
            if drain_until is None and now >= self.deadline + KILL_GRACE_SECONDS:
                break  # unkillable (e.g. stuck in the kernel): give up rather than hang the pool
            if drain_until is not None:
                wait = drain_until - now
            elif self.raw.killed:
                wait = POLL_SECONDS  # SIGKILL sent; the exit is a moment away
            else:
                wait = self.deadline - now
            if self.proc is not None and self.pidfd is None:
                wait = min(wait, POLL_SECONDS)
            for fd, _ in self.poll.poll(1e3 * min(max(wait, 0.0), 3600.0)):
                if fd != self.pidfd and fd in self.open:
                    self._read(fd)
            if drain_until is None and self._exited():
                if self.pidfd is not None:
                    self.poll.unregister(self.pidfd)  # stays readable; stop waking up on it
                if self.finished and not self.result_eof:
                    self._drain_now()  # the output is in the pipes already; take it and go
                    break
                drain_until = time.monotonic() + DRAIN_SECONDS

    def _finish(self) -> RawRun:
        raw = self.raw
        raw.pending = self.proc is None and not self.result_eof
        raw.stdout, raw.stderr = bytes(self.bufs[self.out_fd]), bytes(self.bufs[self.err_fd])
        result = self.bufs[self.res_fd]
        if self.parsed is not None and self.parsed[0] == len(result):  # nothing came after "done"
            raw.records, raw.forged = self.parsed[1], self.parsed[2]
        else:
            raw.records, raw.forged = _parse_records(bytes(result), self.nonce)
        reaped = next((r for r in raw.records if r.get("type") == "reaped"), None)
        if self.proc is None and reaped is not None:
            raw.returncode = reaped.get("code") if isinstance(reaped.get("code"), int) else None
            raw.cpu = float(reaped.get("cpu") or 0.0)
            if raw.killed or not self.pidns:
                self._kill_uids()
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


def _spawn(cfg: dict[str, Any], workdir: str, pass_fds: tuple[int, ...]) -> subprocess.Popen:
    cfg_fd = memfd(marshal.dumps(cfg), "comlrl-sandbox-cfg")
    cmd = [sys.executable, "-I", "-S", "-X", "utf8", str(HARNESS), "run", str(cfg_fd)]
    try:
        return subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=workdir,
            env=clean_env(workdir),
            start_new_session=True,
            pass_fds=(cfg_fd, *pass_fds),
            close_fds=True,
        )
    finally:
        os.close(cfg_fd)


def execute(
    job: dict[str, Any],
    *,
    mode: str,
    netns: bool,
    limits: SandboxLimits,
    timeout: float,
    nproc: int | None,
    verdict: str = "shared",
    zygote: Any = None,
) -> RawRun:
    """Run ``job`` once under the given isolation mode and limits.

    ``verdict``: "split" (judge and candidate processes) or "shared" (one interpreter).
    ``zygote``: a started ``_zygote.Zygote`` to fork the run from; None starts a fresh interpreter."""
    start = time.monotonic()
    uid = UID_POOL.acquire() if mode in UID_MODES else None
    if zygote is not None:
        view = zygote.view
    else:  # a spawned run mounts the whole tree read-only in the namespace modes, as a zygote without its view
        view = "full" if mode.startswith("ns-") else "none"
    workdir = "/sandbox" if view == "minimal" else tempfile.mkdtemp(prefix="comlrl-sandbox-")
    try:
        if uid is not None and view != "minimal":
            os.chown(workdir, uid, uid)
            os.chmod(workdir, 0o2770)  # the judge (another uid, in the candidate's group) shares it
        cfg = dict(
            nonce=secrets.token_hex(16),
            mode=mode,
            netns=netns,
            uid=uid,
            judge_uid=uid + 1 if uid is not None and verdict == "split" else None,
            workdir=workdir,
            parent_pid=os.getpid(),
            nproc=nproc,
            cpu_seconds=limits.cpu_seconds,
            memory_mb=limits.memory_mb,
            file_size_mb=limits.file_size_mb,
            disk_mb=limits.disk_mb,
            verdict=verdict,
            view=view,
            launcher="zygote" if zygote is not None else "spawn",
            unshare_net=netns and zygote is None,
            unshare_user=mode == "ns-user" and zygote is None,
            site_paths=site_paths(),
            probe=bool(job.get("probe")),
            seccomp=zygote.seccomp if zygote is not None else "off",
            cgroup=zygote.cgroup if zygote is not None else "off",
            packages=zygote.packages if zygote is not None else [],
        )
        tests = {k: job.get(k, "") for k in ("tests", "setup", "kind")}
        tests["per_test_timeout"] = limits.per_test_timeout
        tests["allow_shadowing"] = list(job.get("allow_shadowing") or ())
        tests["strict"] = bool(job.get("strict"))
        payload = (marshal.dumps(job.get("program", "")), marshal.dumps(tests))
        raw = _run(cfg, payload, limits, start + timeout, uid, zygote)
    except BaseException:
        raw = None
        raise
    finally:
        if view != "minimal":
            shutil.rmtree(workdir, ignore_errors=True)
        if uid is not None and (raw is None or not raw.pending):
            UID_POOL.release(uid)
    raw.duration = time.monotonic() - start
    return raw


def _run(
    cfg: dict[str, Any],
    payload: tuple[bytes, bytes],
    limits: SandboxLimits,
    deadline: float,
    uid: int | None,
    zygote: Any,
) -> RawRun:
    pidns = cfg["mode"].startswith("ns-")
    program_fd, tests_fd = memfd(payload[0], "comlrl-program"), memfd(payload[1], "comlrl-tests")
    result_r, result_w = os.pipe()
    proc = None
    out_r = err_r = -1
    taken = False  # a prepared run of the zygote's
    try:
        try:
            if zygote is None:
                cfg.update(result_fd=result_w, program_fd=program_fd, tests_fd=tests_fd)
                proc = _spawn(cfg, cfg["workdir"], (result_w, program_fd, tests_fd))
                assert proc.stdout is not None and proc.stderr is not None
                fds = (proc.stdout.fileno(), proc.stderr.fileno(), result_r)
                kill = None
            else:
                out_r, out_w = os.pipe()
                err_r, err_w = os.pipe()
                try:
                    relay, taken = _dispatch(zygote, cfg, (out_w, err_w, result_w, program_fd, tests_fd))
                finally:
                    os.close(out_w)
                    os.close(err_w)
                fds = (out_r, err_r, result_r)

                def kill() -> None:
                    zygote.kill(relay)

        finally:
            # Our copies: end of file arrives once the run's side is gone.
            for fd in (result_w, program_fd, tests_fd):
                os.close(fd)
        early = zygote is not None and pidns and cfg["verdict"] == "split"
        raw = _Collector(fds, limits, deadline, uid, cfg["nonce"], pidns, proc=proc, kill=kill, early=early).run()
        if raw.pending:  # the finisher closes it at end of file, then frees the uids
            FINISHER.add(result_r, uid)
            result_r = -1
        return raw
    finally:
        for fd in (result_r, out_r, err_r):
            if fd >= 0:
                os.close(fd)
        if proc is not None:
            _cleanup(proc, uid)
        if taken:
            zygote.ended()


def _dispatch(zygote: Any, cfg: dict[str, Any], fds: tuple[int, int, int, int, int]) -> tuple[int, bool]:
    """Start the run: hand it to a prepared run (its three processes get their parts of the job
    directly from us), or have the zygote fork a fresh one. Returns the pid to kill it by, and
    whether it was a prepared run (``zygote.ended()`` is due when it is over)."""
    out_w, err_w, result_w, program_fd, tests_fd = fds
    eligible = cfg["verdict"] == "split" and cfg["disk_mb"] == zygote.pool_disk_mb
    while eligible:
        prepared = zygote.take_prepared()
        if prepared is None:
            break
        relay, (init, judge, candidate) = prepared
        msg = json.dumps(dict(cfg, launcher="pool")).encode()
        try:
            socket.send_fds(init, [msg], [out_w, err_w, result_w, program_fd])
            socket.send_fds(judge, [msg], [result_w, tests_fd, err_w])
            socket.send_fds(candidate, [msg], [program_fd, out_w, err_w])
            return relay, True
        except OSError:  # it died while waiting (before any part of this job ran): take another
            zygote.kill(relay)
            zygote.ended()
        finally:
            for sock in (init, judge, candidate):
                sock.close()
    return zygote.launch(cfg, fds), False


def _cleanup(proc: subprocess.Popen, uid: int | None) -> None:
    if proc.returncode is None:  # only on errors or an unkillable harness
        _killpg(proc.pid)
        try:
            proc.wait(timeout=KILL_GRACE_SECONDS)
        except subprocess.TimeoutExpired:
            pass  # Popen reaps it later; we must not block the caller
        if uid is not None:
            kill_uid(uid)
            kill_uid(uid + 1)
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()


class _Finisher:
    """Waits, off the critical path, for finished runs to be reaped (end of file on their result
    channel), then frees their uids; a run that takes too long gets a uid sweep first."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[int, tuple[int | None, float]] = {}  # fd -> (uid, give-up time)
        self._pid = -1
        self._epoll: Any = None

    def add(self, fd: int, uid: int | None) -> None:
        with self._lock:
            if self._pid != os.getpid():  # first use, or a forked copy: a thread of our own
                self._pid = os.getpid()
                self._pending = {}
                self._epoll = select.epoll()
                threading.Thread(
                    target=self._loop, args=(self._epoll,), name="comlrl-sandbox-finisher", daemon=True
                ).start()
            self._pending[fd] = (uid, time.monotonic() + FINISH_SECONDS)
            self._epoll.register(fd, select.EPOLLIN)  # its thread wakes up when there is something to do

    def _done(self, fd: int, sweep: bool) -> None:
        uid, _ = self._pending.pop(fd)
        self._epoll.unregister(fd)
        os.close(fd)
        if uid is not None:
            if sweep:
                kill_uid(uid)
                kill_uid(uid + 1)
            UID_POOL.release(uid)

    def _loop(self, epoll: Any) -> None:
        while True:
            ready = [fd for fd, _ in epoll.poll(0.5)]
            with self._lock:
                for fd in ready:
                    if fd in self._pending:
                        try:
                            chunk = os.read(fd, 65536)
                        except OSError:
                            chunk = b""
                        if not chunk:
                            self._done(fd, sweep=False)
                now = time.monotonic()
                for fd, (_, give_up) in list(self._pending.items()):
                    if now >= give_up:
                        self._done(fd, sweep=True)


FINISHER = _Finisher()
