"""The warm zygote: one per trainer (and isolation setting), forks one run per request (inside).

It starts like any harness (``python -I -S``), imports what runs need, enters its own mount (and
network, and for ``ns-user`` user) namespace, builds the file-system view there, detects seccomp
(compiling the filter in a short-lived child) and cgroup v2, rehearses the judge's and the
candidate's code on a constant job of its own (``_harness_warm``), and then only forks. It never
reads a program or a test: those stay in anonymous files that it passes on unread, so no run's
memory (a fork of the zygote) can hold another run's data. After each run it reaps the run's first
process, kills what is left of its process group and reports the exit status on the run's result
channel ("reaped"), then closes that channel.

A prepared run's first process is its init, forked straight into a new pid namespace where the
zygote may return to its own afterwards (ns-root); else (ns-user) a relay that forks init.

Control socket (SOCK_SEQPACKET, JSON messages): first the trainer's configuration, answered by what
the zygote managed to set up; then ``{"op": "run", "cfg": ...}`` with five descriptors (stdout,
stderr, result, program, tests), answered by ``{"pid": ...}``; ``{"op": "prepare"}``, answered by
``{"prepared": pid}`` with three sockets (to the prepared run's init, judge and candidate, to which
the trainer then sends the job itself); and ``{"op": "kill", "pid": ...}``.
"""

from __future__ import annotations

import fcntl
import json
import os
import select
import signal
import socket
import sys

import _harness_os as hos

# Imported once here so that no run pays for them (and none needs the files after the pivot).
# Not unittest.mock: it imports asyncio, logging and threading, whose memory every fork copies and
# whose after-fork hooks every process of every run would execute; the few tests that use it
# (verdict="shared") import it themselves.
PRELOAD = (
    "_harness_judge _harness_candidate _harness_codec _harness_tests _harness_warm unittest json socket "
    "collections decimal fractions datetime math cmath re itertools functools heapq bisect string random "
    "typing operator copy statistics array hashlib struct textwrap dataclasses enum abc numbers fcntl "
    "resource traceback linecache tokenize inspect importlib importlib.util marshal binascii base64 io"
).split()
FDS = ("stdout", "stderr", "result", "program", "tests")
DEFAULT_DISK_MB = 64  # scratch size of a prepared run (a job asking for another size is forked afresh)


def _preload() -> None:
    import importlib

    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:
            pass


def _enter_namespaces(config: dict) -> None:
    mode = config["mode"]
    if not mode.startswith("ns-"):
        return
    flags = hos.CLONE_NEWNS | (hos.CLONE_NEWNET if config["netns"] else 0)
    if mode == "ns-user":
        flags |= hos.CLONE_NEWUSER
    uid, gid = os.getuid(), os.getgid()
    hos.check(hos.libc.unshare(flags), "unshare")
    if mode == "ns-user":
        hos.write_id_maps(uid, gid)


def setup(config: dict) -> dict:
    """Everything done once: imports, namespaces, view, seccomp, cgroup. Returns the report."""
    import _harness_seccomp

    _preload()
    report: dict = {"ok": True, "pid": os.getpid(), "pool_disk_mb": DEFAULT_DISK_MB}
    try:  # before the view hides /proc
        report["_pidns"] = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        report["_pidns"] = -1
    seccomp, report["seccomp"] = _harness_seccomp.build_compiled()
    cgroup, report["cgroup"] = _harness_seccomp.cgroup_base()  # before the view hides /sys
    _enter_namespaces(config)
    report["view"] = "none"
    if config["mode"].startswith("ns-"):
        report["view"] = "full"
        if config.get("view_plan") is not None:
            import _harness_view

            try:
                _harness_view.build(config["view_plan"], config["view_root"])
                report["view"] = "minimal"
            except Exception as exc:  # noqa: BLE001 - reported; runs then see the full tree read-only
                report["view_error"] = f"{type(exc).__name__}: {exc}"
    return report | {"_seccomp": seccomp, "_cgroup": cgroup}


class Zygote:
    def __init__(
        self, ctl: socket.socket, seccomp: object, cgroup: int | None, config: dict, view: str, pidns: int = -1
    ) -> None:
        self.ctl, self.seccomp, self.cgroup = ctl, seccomp, cgroup  # cgroup: directory descriptor or None
        self.runs: dict[int, tuple[int, str]] = {}  # pid -> (result fd, nonce), for the "reaped" record
        # Prepared runs (namespaces, mounts, judge and candidate forked, all waiting for a job):
        # the forks happen while earlier runs execute, off the critical path.
        self.pooling = config["mode"].startswith("ns-") and view == "minimal"
        self.prepared: set[int] = set()
        # Where it can (ns-root), a prepared run's init is our own child, forked straight into a new
        # pid namespace (unshare before the fork, setns back after it): no relay process per run.
        if not self.pooling and pidns >= 0:
            os.close(pidns)
        self.pidns = _usable_pid_namespace(pidns) if self.pooling else -1
        self.debug = bool(config.get("debug"))
        self.base = {"mode": config["mode"], "disk_mb": DEFAULT_DISK_MB, "uid": None, "workdir": "/sandbox"}
        if self.pooling:
            self.base["view_paths"] = hos.view_paths()  # found once, not in every run's init
        self.wake_r, wake_w = os.pipe()
        os.set_blocking(wake_w, False)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.set_wakeup_fd(wake_w)  # SIGCHLD makes select() return

    def serve(self) -> None:
        while True:
            try:
                ready, _, _ = select.select([self.ctl, self.wake_r], [], [])
            except InterruptedError:
                continue
            if self.wake_r in ready:
                os.read(self.wake_r, 4096)
                self.reap()
            if self.ctl in ready:
                try:
                    msg, fds, _, _ = socket.recv_fds(self.ctl, 1 << 20, len(FDS))
                except OSError:  # the trainer is gone
                    msg, fds = b"", []
                if not msg:
                    self.shutdown()
                    return
                self.handle(json.loads(msg), fds)

    def handle(self, request: dict, fds: list[int]) -> None:
        if request.get("op") == "prepare":
            self.prepare()
            return
        if request.get("op") == "kill":
            pid = request.get("pid")
            if pid in self.runs or pid in self.prepared:  # still our unreaped child: not reused
                for kill in (os.kill, os.killpg):
                    try:
                        kill(pid, signal.SIGKILL)
                    except OSError:
                        pass
            return
        try:
            pid = self.launch(request["cfg"], fds)
            self.ctl.send(json.dumps({"pid": pid}).encode())
        except Exception as exc:  # noqa: BLE001 - the trainer falls back to a fresh interpreter
            self.ctl.send(json.dumps({"error": f"{type(exc).__name__}: {exc}"}).encode())
        finally:
            for fd in fds:
                os.close(fd)

    def launch(self, cfg: dict, fds: list[int]) -> int:
        if len(fds) != len(FDS):
            raise ValueError(f"expected {len(FDS)} descriptors, got {len(fds)}")
        pid = os.fork()
        if pid == 0:
            self._child(cfg, fds)
        self.runs[pid] = (os.dup(fds[2]), cfg["nonce"])
        return pid

    def prepare(self) -> None:
        """Fork a prepared run and send the trainer its three job sockets."""
        if not self.pooling:
            self.ctl.send(json.dumps({"prepared": None}).encode())
            return
        pairs = [socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET) for _ in range(3)]
        direct = self.pidns >= 0
        pid = _fork_into_new_pid_namespace(self.pidns) if direct else os.fork()
        if pid == 0:
            try:
                self._reset_child()
                cgroup = self._enter_cgroup()
                hos.keep_only_fds({0, 1, 2, cgroup, *(theirs.fileno() for _, theirs in pairs)})
                prepared_run([theirs for _, theirs in pairs], self.seccomp, self.base, cgroup, direct)
            except BaseException:
                if self.debug:
                    import traceback

                    traceback.print_exc()
            finally:
                os._exit(3)
        self.prepared.add(pid)
        try:
            socket.send_fds(self.ctl, [json.dumps({"prepared": pid}).encode()], [ours.fileno() for ours, _ in pairs])
        finally:
            for ours, theirs in pairs:
                ours.close()
                theirs.close()

    def _enter_cgroup(self) -> int:
        """In a run's first process: its own cgroup (a descriptor of it), or -1 without cgroups."""
        if self.cgroup is None:
            return -1
        import _harness_seccomp

        fd = _harness_seccomp.enter_run_cgroup(self.cgroup, f"run-{os.getpid()}")
        os.close(self.cgroup)
        return fd

    def _reset_child(self) -> None:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.setsid()
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1) if self.debug else (0, 1, 2):  # debug: errors before a job reach our stderr
            os.dup2(devnull, fd)

    def _child(self, cfg: dict, fds: list[int]) -> None:
        """The run's relay: fixed descriptors, nothing of the zygote's, then the usual start."""
        try:
            self._reset_child()
            cgroup = self._enter_cgroup()
            # Out of the way of the targets 0..5 first, so that no dup2 below clobbers a source.
            high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 16) for fd in fds]
            cgroup = fcntl.fcntl(cgroup, fcntl.F_DUPFD, 16) if cgroup >= 0 else -1
            devnull = os.open(os.devnull, os.O_RDWR)
            os.dup2(devnull, 0)
            for target, fd in zip((1, 2, 3, 4, 5), high):
                os.dup2(fd, target)
            hos.keep_only_fds({0, 1, 2, 3, 4, 5, cgroup})
            cfg.update(result_fd=3, program_fd=4, tests_fd=5, parent_pid=os.getppid())
            if cgroup >= 0:
                _limit_cgroup(cgroup, cfg)
                os.close(cgroup)
            sys.modules["__main__"].start_run(cfg, self.seccomp)  # _harness.py, run as the script
        finally:
            os._exit(3)

    def reap(self) -> None:
        while True:
            try:
                info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                return
            if info is None:
                return
            pid = info.si_pid
            try:
                os.killpg(pid, signal.SIGKILL)  # the zombie keeps its group id from being reused
            except OSError:
                pass
            _, status, usage = os.wait4(pid, 0)
            if self.cgroup is not None:
                import _harness_seccomp

                _harness_seccomp.remove_run_cgroup(self.cgroup, f"run-{pid}")
            run = self.runs.pop(pid, None)
            if run is None:  # a prepared run: the trainer learns how it went from its own records
                self.prepared.discard(pid)
                continue
            result, nonce = run
            record = {"type": "reaped", "code": os.waitstatus_to_exitcode(status), "nonce": nonce}
            record["cpu"] = usage.ru_utime + usage.ru_stime
            try:
                os.write(result, (json.dumps(record) + "\n").encode())
            except OSError:
                pass
            os.close(result)

    def shutdown(self) -> None:
        for pid in list(self.runs) + list(self.prepared):
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass
        os._exit(0)


def serve(ctl_fd: int) -> None:
    """Main loop of the zygote process (``_harness.py zygote CTL_FD``)."""
    harness = sys.modules["__main__"]  # _harness.py, run as the script
    hos.die_with_parent()  # the trainer's keeper thread; also: end of file on the control socket
    ctl = socket.socket(fileno=ctl_fd)
    config = json.loads(ctl.recv(1 << 22))
    harness.prepare(config["site_paths"])
    try:
        report = setup(config)
    except Exception as exc:  # noqa: BLE001 - the trainer falls back to a fresh interpreter per run
        ctl.send(json.dumps({"ok": False, "error": f"{type(exc).__name__}: {exc}"}).encode())
        return
    seccomp, cgroup, pidns = report.pop("_seccomp"), report.pop("_cgroup"), report.pop("_pidns")
    ctl.send(json.dumps(report).encode())
    os.chdir("/")
    try:
        import _harness_warm

        _harness_warm.rehearse({"workdir": "/sandbox", "cpu_seconds": 10, "packages": []})
    except Exception:  # noqa: BLE001 - an optimisation only: runs then warm up themselves
        if config.get("debug"):
            import traceback

            traceback.print_exc()
    sys.stdout.flush()
    import gc

    gc.freeze()  # runs never collect the zygote's objects: fewer copy-on-write page faults
    zygote = Zygote(ctl, seccomp, cgroup, config, report["view"], pidns)
    zygote.serve()


def _limit_cgroup(fd: int, cfg: dict) -> None:
    import _harness_seccomp

    max_pids = int(cfg.get("nproc") or 32) + 16  # relay, init, judge, restarted candidates
    _harness_seccomp.limit_run_cgroup(fd, int(cfg["memory_mb"]), max_pids)


def _usable_pid_namespace(fd: int) -> int:
    """``fd`` (our own pid namespace) if we can fork into a new one and come back, else -1 (as in
    ns-user, where our pid namespace belongs to a user namespace we have no rights in). Tried in
    a child: a failed return would leave its forks in the new namespace."""
    if fd < 0:
        return -1
    tester = os.fork()
    if tester == 0:  # pragma: no cover - runs in the child
        try:
            pid = _fork_into_new_pid_namespace(fd)
            if pid == 0:
                os._exit(0 if os.getpid() == 1 else 1)
            ok = os.waitpid(pid, 0)[1] == 0
            later = os.fork()  # back in our namespace: an ordinary child is not pid 1
            if later == 0:
                os._exit(0 if os.getpid() != 1 else 1)
            os._exit(0 if ok and os.waitpid(later, 0)[1] == 0 else 1)
        finally:
            os._exit(1)
    if os.waitpid(tester, 0)[1] == 0:
        return fd
    os.close(fd)
    return -1


def _fork_into_new_pid_namespace(own: int) -> int:
    """fork(), the child as pid 1 of a new pid namespace; we stay in ours (``own``)."""
    hos.check(hos.libc.unshare(hos.CLONE_NEWPID), "unshare(CLONE_NEWPID)")
    try:
        pid = os.fork()
    except BaseException:
        _return_to(own)
        raise
    if pid:
        _return_to(own)
    return pid


def _return_to(own: int) -> None:
    if hos.libc.setns(own, hos.CLONE_NEWPID) != 0:
        os._exit(5)  # forking on into that namespace would put later runs together: no zygote at all


def prepared_run(
    socks: list[socket.socket], seccomp: object, base: dict, cgroup: int = -1, direct: bool = False
) -> None:
    """A run made ready before its job. Never returns. ``direct``: this process is pid 1 of its pid
    namespace already (the zygote forked it there), else it becomes the relay and forks init.

    Namespaces, scratch mounts, the judge, the first candidate and the channel between them exist
    before the job comes; all three wait, no privileges dropped and no code of the job run, until
    the trainer sends each its part of the job directly: init its output descriptors and the
    program (for restarts), the judge the tests, the candidate the program."""
    harness = sys.modules["__main__"]
    init_job, judge_job, candidate_job = socks
    hos.die_with_parent()
    if direct:
        hos.check(hos.libc.unshare(hos.CLONE_NEWNS | hos.CLONE_NEWIPC | hos.CLONE_NEWUTS), "unshare")
    else:
        harness.enter_pid_namespace()
    hos.setup_scratch_mounts(base)
    ctl, judge_ctl = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    judge_chan, candidate_chan = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    judge = os.fork()
    if judge == 0:
        for sock in (init_job, candidate_job, ctl, candidate_chan):
            sock.close()
        _waiting_judge(judge_job, judge_ctl, judge_chan)
    candidate = os.fork()
    if candidate == 0:
        for sock in (init_job, judge_job, ctl, judge_ctl, judge_chan):
            sock.close()
        _waiting_candidate(candidate_job, candidate_chan, seccomp)
    for sock in (judge_job, candidate_job, judge_ctl, judge_chan, candidate_chan):
        sock.close()
    cfg, fds = _receive_job(init_job, 4)
    if cgroup >= 0:  # the job's limits for the whole run (judge and candidate were forked into it)
        _limit_cgroup(cgroup, cfg)
        os.close(cgroup)
    out_w, err_w, result_w, program_fd = fds
    os.dup2(out_w, 1)  # init keeps what a restarted candidate needs: its output, the program
    os.dup2(err_w, 2)
    os.close(out_w)
    os.close(err_w)
    cfg["program_fd"] = program_fd
    emit = harness.ht.make_emitter(result_w, cfg["nonce"])
    harness.Supervisor(cfg, ctl, seccomp).serve(judge, emit, first=(candidate, None))


def _receive_job(sock: socket.socket, n_fds: int) -> tuple[dict, list[int]]:
    msg, fds, _, _ = socket.recv_fds(sock, 1 << 20, n_fds)
    if not msg or len(fds) != n_fds:
        os._exit(0)  # the trainer gave up this prepared run (or died): so does the namespace
    sock.close()
    return json.loads(msg), fds


def _waiting_judge(job: socket.socket, ctl: socket.socket, channel: socket.socket) -> None:
    import _harness_judge

    harness = sys.modules["__main__"]
    cfg, (result_fd, tests_fd, err_w) = _receive_job(job, 3)
    os.dup2(err_w, 2)
    os.close(err_w)
    cfg.update(result_fd=result_fd, tests_fd=tests_fd)
    os.set_inheritable(result_fd, False)
    emit = harness.ht.make_emitter(result_fd, cfg["nonce"])
    harness.forget_harness_path()
    _harness_judge.main(cfg, emit, ctl, harness.isolation_info(cfg), channel.detach())


def _waiting_candidate(job: socket.socket, channel: socket.socket, seccomp: object) -> None:
    import _harness_candidate

    harness = sys.modules["__main__"]
    cfg, (program_fd, out_w, err_w) = _receive_job(job, 3)
    os.dup2(out_w, 1)
    os.dup2(err_w, 2)
    os.close(out_w)
    os.close(err_w)
    cfg["program_fd"] = program_fd
    harness.forget_harness_path()
    _harness_candidate.main(cfg, channel.detach(), seccomp)
