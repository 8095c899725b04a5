"""Kernel-side hardening of a run, where the OS allows it (inside; optional dependencies).

* seccomp (via ``pyseccomp``, a binding to libseccomp): the candidate may not trace or read other
  processes, mount, enter or create namespaces, load BPF or kernel modules, use perf events or
  keyrings, or open sockets (it has its channel already). Forbidden calls kill the candidate
  (SIGSYS, reported as a suspect); ``socket``/``socketpair`` fail with EPERM instead, so a program
  that merely probes the network keeps running.
* cgroup v2 (when /sys/fs/cgroup is a writable v2 hierarchy): one cgroup per run with a memory and
  a process-count limit covering judge, candidate and everything they start.

Both are detected once, in the zygote (or the spawned harness), and reported in the run's
isolation info ("on" or why not).
"""

from __future__ import annotations

import errno
import os

KILLED = (
    "ptrace process_vm_readv process_vm_writev mount umount2 pivot_root chroot unshare setns bpf "
    "perf_event_open keyctl add_key request_key kexec_load kexec_file_load init_module finit_module "
    "delete_module reboot swapon swapoff open_by_handle_at name_to_handle_at userfaultfd io_uring_setup "
    "io_uring_enter io_uring_register fanotify_init quotactl acct iopl ioperm move_mount open_tree "
    "fsopen fsmount fspick mount_setattr pidfd_getfd kcmp lookup_dcookie settimeofday clock_settime "
    "clock_adjtime adjtimex syslog vhangup"
).split()
REFUSED = ("socket", "socketpair")  # EPERM
JUDGE_PID = 2  # in the run's pid namespace: init is 1 and forks the judge first
# Signals to the judge (and to "every process") fail with EPERM: a program that kills or stops
# the judge only loses its own remaining tests, but their verdicts are worth keeping.
SIGNALLING = {"kill": (JUDGE_PID, -1), "tkill": (JUDGE_PID,), "tgkill": (JUDGE_PID,), "rt_sigqueueinfo": (JUDGE_PID,)}
SIGNALLING |= {"rt_tgsigqueueinfo": (JUDGE_PID,), "pidfd_open": (JUDGE_PID,)}
NAMESPACE_FLAGS = (0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000)


def build() -> tuple[object, str]:
    """(filter to ``load()`` in each candidate, or None; "on" or the reason it is off)."""
    try:
        import pyseccomp as sc
    except Exception as exc:  # noqa: BLE001 - not installed, or no libseccomp on this machine
        return None, f"unavailable ({type(exc).__name__}: {exc})"
    try:
        filt = sc.SyscallFilter(sc.ALLOW)
        for name in KILLED:
            _rule(filt, sc.KILL_PROCESS, name)
        for name in REFUSED:
            _rule(filt, sc.ERRNO(errno.EPERM), name)
        for flag in NAMESPACE_FLAGS:  # clone() creating a namespace; clone3 cannot be inspected
            filt.add_rule(sc.KILL_PROCESS, "clone", sc.Arg(0, sc.MASKED_EQ, flag, flag))
        _rule(filt, sc.ERRNO(errno.ENOSYS), "clone3")  # glibc then falls back to clone()
        for name, pids in SIGNALLING.items():
            for pid in pids:
                _rule(filt, sc.ERRNO(errno.EPERM), name, sc.Arg(0, sc.MASKED_EQ, 0xFFFFFFFF, pid & 0xFFFFFFFF))
    except Exception as exc:  # noqa: BLE001
        return None, f"unavailable ({type(exc).__name__}: {exc})"
    return filt, "on"


PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2


class Compiled:
    """The filter as the BPF program libseccomp generates, installed with prctl (what
    ``seccomp_load`` does), without libseccomp or its binding in the process. Everything is
    prepared in the zygote; a candidate only makes the two calls."""

    def __init__(self, bpf: bytes) -> None:
        import ctypes

        class SockFprog(ctypes.Structure):
            _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

        self.bpf = ctypes.create_string_buffer(bpf, len(bpf))
        self.prog = SockFprog(len(bpf) // 8, ctypes.addressof(self.bpf))
        self.args = (ctypes.c_ulong(SECCOMP_MODE_FILTER), ctypes.byref(self.prog), ctypes.c_ulong(0), ctypes.c_ulong(0))
        self.nnp = (ctypes.c_ulong(1), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0))

    def load(self) -> None:
        import _harness_os as hos

        hos.check(hos.libc.prctl(hos.PR_SET_NO_NEW_PRIVS, *self.nnp), "prctl(NO_NEW_PRIVS)")
        hos.check(hos.libc.prctl(PR_SET_SECCOMP, *self.args), "prctl(SET_SECCOMP)")


def build_compiled() -> tuple[Compiled | None, str]:
    """``build``, run in a short-lived child that exports the filter as BPF: the zygote never imports
    the binding, which brings ctypes.util, subprocess, threading and shutil with their extension
    modules (memory every fork copies, after-fork hooks every process of every run runs)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        try:
            os.close(r)
            filt, status = build()
            if filt is None:
                os.write(w, b"E" + status.encode())
            else:
                os.write(w, b"P")
                filt.export_bpf(_Descriptor(w))  # type: ignore[attr-defined]
        except BaseException as exc:  # noqa: BLE001 - reported as the reason seccomp is off
            os.write(w, f"Eunavailable ({type(exc).__name__}: {exc})".encode())
        finally:
            os._exit(0)
    os.close(w)
    chunks = []
    while chunk := os.read(r, 1 << 16):
        chunks.append(chunk)
    os.close(r)
    os.waitpid(pid, 0)
    data = b"".join(chunks)
    if data[:1] == b"P" and len(data) > 1 and (len(data) - 1) % 8 == 0:
        return Compiled(data[1:]), "on"
    if data[:1] == b"E":
        return None, data[1:].decode(errors="replace")
    return None, "unavailable (the filter could not be exported)"


class _Descriptor:
    def __init__(self, fd: int) -> None:
        self.fd = fd

    def fileno(self) -> int:
        return self.fd


def _rule(filt: object, action: int, name: str, *args: object) -> None:
    try:
        filt.add_rule(action, name, *args)  # type: ignore[attr-defined]
    except (ValueError, OSError, RuntimeError):
        pass  # a system call this architecture does not have


CGROUP_ROOT = "/sys/fs/cgroup"


def cgroup_base() -> tuple[int | None, str]:
    """A descriptor of a cgroup v2 directory below which each run gets its own (opened before the
    zygote leaves the host's file system for its view), or None and the reason."""
    if not os.path.isfile(os.path.join(CGROUP_ROOT, "cgroup.controllers")):
        return None, "unavailable (no cgroup v2 hierarchy at /sys/fs/cgroup)"
    try:
        with open("/proc/self/cgroup") as fh:
            rel = next(line.split("::", 1)[1].strip() for line in fh if line.startswith("0::"))
        own = os.path.join(CGROUP_ROOT, rel.lstrip("/"))
        # Processes may only live in leaves once controllers are enabled: move ourselves down.
        leaf = os.path.join(own, "comlrl-zygote")
        os.makedirs(leaf, exist_ok=True)
        _write(os.path.join(leaf, "cgroup.procs"), str(os.getpid()))
        _write(os.path.join(own, "cgroup.subtree_control"), "+memory +pids")
        runs = os.path.join(own, "comlrl-runs")
        os.makedirs(runs, exist_ok=True)
        _write(os.path.join(runs, "cgroup.subtree_control"), "+memory +pids")
        fd = os.open(runs, os.O_RDONLY | os.O_DIRECTORY)
    except (OSError, StopIteration) as exc:
        return None, f"unavailable (cgroup v2 not writable here: {exc})"
    return fd, "on"


def enter_run_cgroup(base_fd: int, name: str) -> int:
    """Create the run's cgroup, move the calling process into it; a descriptor of its directory."""
    os.mkdir(name, dir_fd=base_fd)
    fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=base_fd)
    _write_at(fd, "cgroup.procs", "0")
    return fd


def limit_run_cgroup(run_fd: int, memory_mb: int, max_pids: int) -> None:
    """The whole run's memory (judge and candidate: twice the per-process limit) and processes."""
    _write_at(run_fd, "memory.max", str(2 * memory_mb * 1024 * 1024))
    _write_at(run_fd, "pids.max", str(max_pids))
    try:
        _write_at(run_fd, "memory.swap.max", "0")
    except FileNotFoundError:
        pass


def remove_run_cgroup(base_fd: int, name: str) -> None:
    try:
        os.rmdir(name, dir_fd=base_fd)
    except OSError:
        pass


def _write(path: str, text: str) -> None:
    with open(path, "w") as fh:
        fh.write(text)


def _write_at(dir_fd: int, name: str, text: str) -> None:
    fd = os.open(name, os.O_WRONLY, dir_fd=dir_fd)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)
