"""Sandbox entry point: runs inside the sandbox, never imported by the trainer (stdlib only).

Started either once per run as ``python -I -S _harness.py run CFG_FD`` (the "spawn" launcher) or
once per trainer as ``... _harness.py zygote CTL_FD``, a warm process that forks one run per
request (``_harness_zygote``). Either way a run gets its configuration (limits, mode, nonce, the
descriptors below) as a dict and then isolates itself before any untrusted code runs:

* ``result_fd``: nonce-tagged JSON records to the trainer; only trusted processes hold it.
* ``program_fd``: the program (marshal); read by the candidate (or the single worker) only.
* ``tests_fd``: tests and setup (marshal); read by the judge (or the single worker) only, so the
  candidate's memory never held them, not even as a forked copy.

Process layout of a run in the namespace modes (``verdict="split"``)::

    relay (outside the new pid namespace: the launcher's child)
      └─ init (pid 1: scratch mounts, supervisor; spawns and reaps)
           ├─ judge (uid J: runs the tests, reports)
           └─ candidate (uid C: the program; restarted by init when it dies)

With ``verdict="shared"`` init has one worker that loads program and tests in one interpreter.
When init exits the kernel kills everything left in the namespace. Without namespaces the relay
itself is init. A prepared run of an ns-root zygote has no relay: the zygote forks its init
straight into the new pid namespace (``_harness_zygote``).
"""

from __future__ import annotations

import marshal
import os
import signal
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)  # the sibling _harness_* modules; removed again before untrusted code runs

import _harness_os as hos  # noqa: E402
import _harness_tests as ht  # noqa: E402


def forget_harness_path() -> None:
    """Untrusted code must not import from the project tree."""
    sys.path[:] = [p for p in sys.path if p != HERE]


# --------------------------------------------------------------------------- isolation


def _relay(child: int) -> None:
    """Outside the pid namespace: wait for init and exit with its status."""
    _, status = os.waitpid(child, 0)
    os._exit(hos.exit_code(status))


def _init_wait(worker: int, emit) -> None:  # noqa: ANN001
    """Pid 1 (shared mode): reap everything; when the worker ends, report how and exit."""
    while True:
        pid, status, usage = os.wait4(-1, 0)
        if pid == worker:
            emit("exit", code=os.waitstatus_to_exitcode(status), cpu=usage.ru_utime + usage.ru_stime)
            os._exit(hos.exit_code(status))


def isolation_info(cfg: dict) -> dict:
    """How a run is isolated, for its "hello" record."""
    mode, uid = cfg["mode"], cfg["uid"]
    return {
        "mode": mode,
        "netns": bool(cfg["netns"]),
        "pidns": mode.startswith("ns-"),
        "uid": uid if uid is not None else os.getuid(),
        "view": cfg["view"],
        "verdict": cfg["verdict"],
        "seccomp": cfg.get("seccomp", "off"),
        "cgroup": cfg.get("cgroup", "off"),
        "launcher": cfg["launcher"],
    }


def enter_pid_namespace(net: bool = False, user: bool = False) -> None:
    """New mount, pid, IPC and UTS namespaces; returns in pid 1 (this process becomes the relay)."""
    flags = hos.CLONE_NEWNS | hos.CLONE_NEWPID | hos.CLONE_NEWIPC | hos.CLONE_NEWUTS
    flags |= (hos.CLONE_NEWNET if net else 0) | (hos.CLONE_NEWUSER if user else 0)
    real_uid, real_gid = os.getuid(), os.getgid()  # read before unsharing: unmapped ids read as 65534
    hos.check(hos.libc.unshare(flags), "unshare")
    if user:
        hos.write_id_maps(real_uid, real_gid)
    child = os.fork()
    if child:
        _relay(child)
    # If the relay is killed (wall-clock timeout), pid 1 dies and takes the namespace with it.
    hos.die_with_parent()


def isolate(cfg: dict) -> dict:
    """Enter the run's namespaces and mounts; returns (in init, or in the relay without
    namespaces) a description of the isolation for the "hello" record."""
    info = isolation_info(cfg)
    if not info["pidns"]:
        return info
    enter_pid_namespace(net=cfg["unshare_net"], user=cfg["unshare_user"])
    if cfg["view"] == "minimal":
        hos.setup_scratch_mounts(cfg)
    else:
        hos.setup_full_mounts(cfg)
    return info


# --------------------------------------------------------------------------- shared mode


def run_shared(cfg: dict, emit, info: dict) -> None:  # noqa: ANN001
    """Program and tests in one interpreter (one worker process)."""
    if info["pidns"]:
        worker = os.fork()
        if worker:
            _init_wait(worker, emit)
    hos.become(cfg["uid"])
    os.chdir(cfg["workdir"])
    hos.apply_limits(cfg)
    info["uid"] = os.getuid()
    emit("hello", isolation=info)
    if cfg.get("probe"):
        probe(emit)
    else:
        job = marshal.loads(hos.read_all(cfg["tests_fd"]))
        job["program"] = marshal.loads(hos.pread_all(cfg["program_fd"]))
        os.close(cfg["program_fd"])
        job["workdir"] = cfg["workdir"]
        forget_harness_path()
        ht.run_job(job, emit)
    hos.flush_and_exit()


def probe(emit) -> None:  # noqa: ANN001
    """Check that the isolated worker can still import and write (used to pick a mode)."""
    import fractions  # noqa: F401  (a stdlib module nothing has imported yet)

    with open("probe.txt", "w") as fh:
        fh.write("ok")
    emit("done")


# --------------------------------------------------------------------------- split mode


class Supervisor:
    """Init of a split run: forks the judge, then candidates on the judge's request."""

    def __init__(self, cfg: dict, ctl, seccomp: object) -> None:  # noqa: ANN001
        self.cfg, self.ctl, self.seccomp = cfg, ctl, seccomp
        self.candidate: int | None = None
        self.last: dict = {}
        self.cpu = 0.0  # of every candidate so far

    def serve(self, judge: int, emit, first: tuple[int, object] | None = None) -> None:  # noqa: ANN001
        """Serve the judge until it is done. ``first``: a candidate already started (pid, its
        channel end for the judge); else the first one starts now, alongside the judge's setup."""
        import json
        import socket

        if first is None:
            self.spawn(socket)
        else:
            self.candidate, channel = first
            if channel is not None:  # else the judge has its end already
                socket.send_fds(self.ctl, [b"ok"], [channel.fileno()])  # type: ignore[attr-defined]
                channel.close()  # type: ignore[attr-defined]
        while True:
            try:
                request = self.ctl.recv(64)
            except InterruptedError:
                continue
            except OSError:
                request = b""
            if request == b"spawn":
                self.spawn(socket)
            elif request == b"reap":
                self.ctl.send(json.dumps(self.stop_candidate(grace=0.2)).encode())
            else:  # the judge is done (or gone)
                break
        self.stop_candidate(grace=0.0, sweep=not self.cfg["mode"].startswith("ns-"))
        _, status, usage = os.wait4(judge, 0)
        emit("exit", code=os.waitstatus_to_exitcode(status), cpu=usage.ru_utime + usage.ru_stime + self.cpu)
        os._exit(hos.exit_code(status))  # in a pid namespace this kills whatever is left

    def spawn(self, socket) -> None:  # noqa: ANN001
        import _harness_candidate

        self.stop_candidate(grace=0.0)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        pid = os.fork()
        if pid == 0:
            self.ctl.close()
            ours.close()
            forget_harness_path()
            _harness_candidate.main(self.cfg, theirs.detach(), self.seccomp)
        theirs.close()
        self.candidate = pid
        socket.send_fds(self.ctl, [b"ok"], [ours.fileno()])
        ours.close()

    def stop_candidate(self, grace: float, sweep: bool = True) -> dict:
        """Kill the candidate (and, with ``sweep``, all it started) and report how it ended.

        ``grace``: how long a candidate that hung up may take to finish dying on its own, so that
        its real exit status (not our SIGKILL) is reported."""
        import time

        pid, self.candidate = self.candidate, None
        if pid is None:
            return self.last
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
            time.sleep(0.002)
        uid = self.cfg["uid"]
        if sweep and uid is not None and os.geteuid() == 0:
            hos.kill_uid(uid)
        for kill in (os.killpg, os.kill):
            try:
                kill(pid, signal.SIGKILL)
            except OSError:
                pass
        _, status, usage = os.wait4(pid, 0)
        code = os.waitstatus_to_exitcode(status)
        cpu = usage.ru_utime + usage.ru_stime
        self.cpu += cpu
        name = None
        if code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
        self.last = {"code": code if code >= 0 else None, "signal": name, "cpu": cpu}
        return self.last


def run_split(cfg: dict, emit, info: dict, seccomp: object) -> None:  # noqa: ANN001
    """Judge and candidate in two processes; this process supervises both."""
    import socket

    import _harness_candidate  # noqa: F401 - imported before any fork, so forks need no files
    import _harness_judge

    ctl, judge_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    judge = os.fork()
    if judge == 0:
        ctl.close()
        forget_harness_path()
        _harness_judge.main(cfg, emit, judge_end, info)
    judge_end.close()
    os.close(cfg["tests_fd"])  # only the judge reads the tests
    Supervisor(cfg, ctl, seccomp).serve(judge, emit)


# --------------------------------------------------------------------------- entry points


def start_run(cfg: dict, seccomp: object = None) -> None:
    """One run, in the launcher's child (the relay). Never returns."""
    result_fd = cfg["result_fd"]
    os.set_inheritable(result_fd, False)  # programs the code execs do not get the channel
    emit = ht.make_emitter(result_fd, cfg["nonce"])
    # If the launcher dies, so do we (and with us, in namespace mode, everything we started).
    hos.die_with_parent()
    if os.getppid() != cfg["parent_pid"]:
        os._exit(4)  # the launcher died before the line above
    try:
        info = isolate(cfg)
    except Exception as exc:  # noqa: BLE001 - reported, then the run counts as crashed
        emit("setup_failed", message=ht.describe(exc))
        os._exit(3)
    if cfg["verdict"] == "split":
        run_split(cfg, emit, info, seccomp)
    else:
        run_shared(cfg, emit, info)
    os._exit(0)


def install_site_builtins() -> None:
    """exit() and quit(), which ``site`` would have added (programs do call them)."""
    import _sitebuiltins
    import builtins

    builtins.exit = _sitebuiltins.Quitter("exit", "Ctrl-D (i.e. EOF)")
    builtins.quit = _sitebuiltins.Quitter("quit", "Ctrl-D (i.e. EOF)")


def prepare(site_paths: list[str]) -> None:
    # Started with -S (site's .pth processing costs ~25 ms); the trainer sends the paths.
    sys.path.extend(p for p in site_paths if p not in sys.path)
    install_site_builtins()


def main() -> None:
    role, fd = sys.argv[1], int(sys.argv[2])
    if role == "zygote":
        import _harness_zygote

        _harness_zygote.serve(fd)
        return
    cfg = marshal.loads(hos.read_all(fd))
    prepare(cfg["site_paths"])
    seccomp = None
    if cfg["verdict"] == "split" and cfg.get("seccomp") == "on":
        import _harness_seccomp

        seccomp, _ = _harness_seccomp.build()
    start_run(cfg, seccomp)


if __name__ == "__main__":
    main()
