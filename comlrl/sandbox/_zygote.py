"""The warm zygote, trainer side: start it once per process and isolation setting, hand it runs.

Starting an interpreter costs most of a short run. The zygote (``_harness_zygote``) is started
once, imports what runs need, builds the file-system view, and then forks a fresh process per run
(never reused across runs), so the interpreter start leaves the critical path. When it cannot
start, or dies, runs fall back to a freshly started interpreter each (``launcher="spawn"``), with a
warning. ``COMLRL_SANDBOX_ZYGOTE=0`` turns it off.
"""

from __future__ import annotations

import array
import atexit
import collections
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from typing import Any

from . import _view
from ._process import HARNESS, clean_env, site_paths

logger = logging.getLogger("comlrl.sandbox")

ZYGOTE_ENV = "COMLRL_SANDBOX_ZYGOTE"
START_TIMEOUT = 60.0  # seconds for the zygote to import, build its view and report
PREPARED = 2  # prepared runs kept ready, plus one per run in progress (each: three idle processes, no task data)


class ZygoteError(RuntimeError):
    """The zygote could not start, or stopped answering."""


class Zygote:
    """A started zygote process and its control socket."""

    def __init__(self, mode: str, netns: bool) -> None:
        self.mode, self.netns, self.dead = mode, netns, False
        self.lock = threading.Lock()
        ns = mode.startswith("ns-")
        self.view_root = tempfile.mkdtemp(prefix="comlrl-view-") if ns else None
        steps, self.packages = _view.plan(mode) if ns else (None, [])
        self.sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.proc = self._start(theirs)
        finally:
            theirs.close()
        config = {"mode": mode, "netns": netns, "site_paths": site_paths(), "view_plan": steps}
        config["debug"] = os.environ.get("COMLRL_SANDBOX_DEBUG", "") not in ("", "0")
        config["view_root"] = self.view_root
        try:
            self.sock.settimeout(START_TIMEOUT)
            self.sock.send(json.dumps(config).encode())
            reply = json.loads(self.sock.recv(1 << 20) or b"{}")
            self.sock.settimeout(None)
        except (OSError, ValueError) as exc:
            self.close()
            raise ZygoteError(f"the zygote did not start: {exc}") from exc
        if not reply.get("ok"):
            self.close()
            raise ZygoteError(f"the zygote did not start: {reply.get('error', 'no answer')}")
        self.view, self.seccomp, self.cgroup = reply["view"], reply["seccomp"], reply["cgroup"]
        self.pid = reply["pid"]
        self.view_error = reply.get("view_error")
        self.pool_disk_mb = reply.get("pool_disk_mb")
        self.pooling = ns and self.view == "minimal"
        self.prepared: collections.deque[tuple[int, list[socket.socket]]] = collections.deque()
        self.asked = 0  # "prepare" requests not answered yet
        self.running = 0  # runs in progress (taken, not ended): as many again are kept in preparation
        self.answers: collections.deque[dict] = collections.deque()  # replies to "run"
        if self.pooling:
            with self.lock:
                for _ in range(PREPARED):
                    self._ask_prepare()

    def _start(self, theirs: socket.socket) -> subprocess.Popen:
        # PR_SET_PDEATHSIG fires when the thread that forked the zygote exits: fork it from a
        # thread that lives as long as the zygote (and reaps it), not from a short-lived worker.
        box: dict[str, Any] = {}
        started = threading.Event()
        cmd = [sys.executable, "-I", "-S", "-X", "utf8", str(HARNESS), "zygote", str(theirs.fileno())]

        def keeper() -> None:
            try:
                box["proc"] = subprocess.Popen(
                    cmd,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    cwd="/",
                    env=clean_env("/"),
                    start_new_session=True,
                    pass_fds=(theirs.fileno(),),
                    close_fds=True,
                )
            except OSError as exc:
                box["error"] = exc
            started.set()
            if "proc" in box:
                box["proc"].wait()
                self.dead = True

        threading.Thread(target=keeper, name="comlrl-sandbox-zygote", daemon=True).start()
        started.wait()
        if "error" in box:
            raise ZygoteError(f"could not start the zygote: {box['error']}")
        return box["proc"]

    def _send(self, msg: dict, fds: tuple[int, ...] = ()) -> None:
        try:
            socket.send_fds(self.sock, [json.dumps(msg).encode()], list(fds))
        except OSError as exc:
            self.dead = True
            raise ZygoteError(f"the zygote stopped answering: {exc}") from exc

    def _ask_prepare(self) -> None:
        self._send({"op": "prepare"})
        self.asked += 1

    def _receive(self, block: bool) -> bool:
        """Read one message (a prepared run, or an answer to "run"); False if none was waiting."""
        try:
            msg, fds = _recv_fds(self.sock, 1 << 16, 3, 0 if block else socket.MSG_DONTWAIT)
        except BlockingIOError:
            return False
        except OSError as exc:
            self.dead = True
            raise ZygoteError(f"the zygote stopped answering: {exc}") from exc
        if not msg:
            self.dead = True
            raise ZygoteError("the zygote is gone")
        answer = json.loads(msg)
        if "prepared" in answer:
            self.asked -= 1
            if answer["prepared"] is not None and len(fds) == 3:
                self.prepared.append((int(answer["prepared"]), [socket.socket(fileno=fd) for fd in fds]))
            else:
                for fd in fds:
                    os.close(fd)
        else:
            self.answers.append(answer)
        return True

    def take_prepared(self) -> tuple[int, list[socket.socket]] | None:
        """A prepared run (its relay's pid, sockets to its init, judge and candidate), or None."""
        if not self.pooling:
            return None
        with self.lock:
            while self._receive(block=False):
                pass
            self.running += 1
            # Refilled while this one runs; one more per concurrent run, so that workers do not
            # take runs whose processes are still being forked.
            while len(self.prepared) + self.asked < PREPARED + self.running:
                self._ask_prepare()
            while not self.prepared and self.asked:
                self._receive(block=True)
            if not self.prepared:
                self.running -= 1
                return None
            run = self.prepared.popleft()
        return run

    def ended(self) -> None:
        """A run taken with ``take_prepared`` is over."""
        with self.lock:
            self.running = max(self.running - 1, 0)

    def launch(self, cfg: dict[str, Any], fds: tuple[int, ...]) -> int:
        """Fork one run with these descriptors (stdout, stderr, result, program, tests); its pid."""
        with self.lock:
            self._send({"op": "run", "cfg": cfg}, fds)
            while not self.answers:
                self._receive(block=True)
            answer = self.answers.popleft()
        if "pid" not in answer:
            raise ZygoteError(f"the zygote could not start the run: {answer.get('error')}")
        return int(answer["pid"])

    def kill(self, pid: int) -> None:
        with self.lock:
            try:
                self.sock.send(json.dumps({"op": "kill", "pid": pid}).encode())
            except OSError:
                pass

    def close(self) -> None:
        self.dead = True
        self.sock.close()
        for _, socks in getattr(self, "prepared", ()):
            for sock in socks:
                sock.close()
        proc = getattr(self, "proc", None)
        if proc is not None and proc.poll() is None:
            proc.kill()
        if self.view_root is not None:
            shutil.rmtree(self.view_root, ignore_errors=True)  # an empty mount point on the host


def _recv_fds(sock: socket.socket, size: int, max_fds: int, flags: int) -> tuple[bytes, list[int]]:
    # socket.recv_fds ignores its flags argument (CPython 3.11), so MSG_DONTWAIT needs this.
    fds = array.array("i")
    msg, ancdata, _, _ = sock.recvmsg(size, socket.CMSG_LEN(max_fds * fds.itemsize), flags)
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
    return msg, list(fds)


_lock = threading.Lock()
_zygotes: dict[tuple, Zygote] = {}
_failed: dict[tuple, str] = {}


def zygote_for(mode: str, netns: bool) -> Zygote | None:
    """The zygote for this isolation setting (started on first use), or None to spawn instead."""
    if os.environ.get(ZYGOTE_ENV, "1") == "0":
        return None
    key = (mode, netns, os.getpid())  # a forked trainer starts its own
    with _lock:
        zygote = _zygotes.get(key)
        if zygote is not None and not zygote.dead:
            return zygote
        if key in _failed:
            return None
        try:
            zygote = Zygote(mode, netns)
        except (ZygoteError, OSError) as exc:
            _failed[key] = str(exc)
            logger.warning("sandbox: no zygote (%s); every run starts a fresh interpreter", exc)
            return None
        _zygotes[key] = zygote
    _report(zygote)
    return zygote


def discard(zygote: Zygote) -> None:
    with _lock:
        for key, z in list(_zygotes.items()):
            if z is zygote:
                del _zygotes[key]
    zygote.close()


def _report(z: Zygote) -> None:
    logger.info("sandbox zygote: mode=%s view=%s seccomp=%s cgroup=%s", z.mode, z.view, z.seccomp, z.cgroup)
    if z.mode.startswith("ns-") and z.view != "minimal":
        logger.warning(
            "sandbox: the restricted file-system view could not be built (%s); programs can read every "
            "file the sandbox user can (task data included)",
            z.view_error,
        )
    if z.seccomp != "on":
        logger.warning("sandbox: seccomp filter for candidates %s", z.seccomp)
    if z.cgroup != "on":
        logger.info("sandbox: per-run cgroup limits %s; rlimits only", z.cgroup)


@atexit.register
def _close_all() -> None:
    for zygote in list(_zygotes.values()):
        zygote.close()
