"""Linux primitives of the sandbox: namespaces, mounts, identities, limits (inside; stdlib only)."""

from __future__ import annotations

import ctypes
import os
import signal
import stat
import sys

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
MNT_DETACH = 2
PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
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
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}

libc = ctypes.CDLL(None, use_errno=True)
for _name in ("capset", "mount", "prctl", "setfsuid", "setns", "syscall", "umount2", "unshare"):
    getattr(libc, _name, None)  # looked up once here (in the zygote), not in every process of a run


def check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    def enc(s: str | None) -> bytes | None:
        return None if s is None else s.encode()

    check(libc.mount(enc(source), enc(target), enc(fstype), flags, enc(data)), f"mount {fstype or source} on {target}")


def tmpfs(target: str, size_mb: int, mode: str, uid: int | None = None, gid: int | None = None) -> None:
    owner = "" if uid is None else f",uid={uid},gid={uid if gid is None else gid}"
    mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV, f"size={size_mb}m,mode={mode}{owner}")


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


def mountinfo() -> list[tuple[str, int]]:
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


def remount_readonly(under: str = "/") -> None:
    """Every mount at or below ``under`` read-only. Locked flags (nosuid, nodev, ...) are repeated,
    or a remount inside a user namespace fails."""
    prefix = under.rstrip("/") + "/"
    for point, flags in mountinfo():
        if point == under or point.startswith(prefix) or under == "/":
            try:
                mount(None, point, None, MS_REMOUNT | MS_BIND | MS_RDONLY | flags)
            except OSError:
                pass  # e.g. a mount hidden below another one; it stays as it was


def pivot_root(new_root: str) -> None:
    """Make ``new_root`` (a mount point) the root of this mount namespace and drop the old root."""
    import platform

    number = SYS_PIVOT_ROOT.get(platform.machine())
    if number is None:
        raise OSError(f"pivot_root: unknown syscall number on {platform.machine()}")
    os.chdir(new_root)
    check(libc.syscall(number, b".", b"."), "pivot_root")  # old root is now stacked below "."
    check(libc.umount2(b".", MNT_DETACH), "umount old root")
    os.chdir("/")


# --------------------------------------------------------------------------- the full mount layout (no view)


def _blocked_ancestor(paths: list[str]) -> str | None:
    """First directory on the way to ``paths`` that other users cannot traverse."""
    for path in paths:
        parts = path.strip("/").split("/")
        for depth in range(len(parts)):
            anc = "/" + "/".join(parts[:depth])
            if not os.stat(anc).st_mode & stat.S_IXOTH:
                return anc
    return None


def cover(
    directory: str, keep: list[str], size_mb: int, mode: str, uid: int | None = None, readonly: bool = False
) -> None:
    """Mount a fresh tmpfs over ``directory``, with read-only bind mounts of the entries that
    lead to the ``keep`` paths below it (so the interpreter stays reachable)."""
    prefix = directory.rstrip("/") + "/"
    children = {p[len(prefix) :].split("/")[0] for p in keep if p.startswith(prefix)}
    fds = {c: os.open(prefix + c, os.O_PATH) for c in sorted(children)}  # before they vanish
    tmpfs(directory, size_mb, mode, uid)
    for child, fd in fds.items():
        target = prefix + child
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            os.mkdir(target)
        else:
            open(target, "w").close()
        mount(f"/proc/self/fd/{fd}", target, None, MS_BIND | MS_REC)
        mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY)
        os.close(fd)
    if readonly:
        mount(None, directory, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)


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
        cover(anc, paths, 1, "0755", readonly=True)
    raise OSError(f"could not expose interpreter paths {paths}")


def _interpreter_paths() -> list[str]:
    """Everything the worker's Python needs to reach: import path and executable."""
    paths = [p for p in sys.path if p and os.path.exists(p)] + [sys.executable]
    return sorted({q for p in paths for q in (os.path.abspath(p), os.path.realpath(p))})


def setup_full_mounts(cfg: dict) -> None:
    """The whole file system read-only, with fresh tmpfs scratch space (no task-data hiding)."""
    mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing below may propagate to the host
    remount_readonly("/")
    size, uid, workdir = cfg["disk_mb"], cfg["uid"], cfg["workdir"]
    needed = _interpreter_paths()
    for scratch in ("/tmp", "/var/tmp", "/dev/shm"):
        if os.path.isdir(scratch) and not os.path.islink(scratch):
            cover(scratch, needed, size, "1777")  # e.g. a virtualenv in /tmp stays visible
    os.makedirs(workdir, exist_ok=True)
    tmpfs(workdir, size, "2770" if uid is not None else "0700", uid)
    if uid is not None:
        _expose_interpreter(needed + [workdir])
    mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, _proc_options(cfg))


def view_paths() -> list[str]:
    """The interpreter's paths as the view holds them (the same for every run of a zygote)."""
    return [p for p in _interpreter_paths() if os.path.exists(p)]


def setup_scratch_mounts(cfg: dict) -> None:
    """Inside the prepared view (the zygote built it): fresh scratch space and /proc for one run.

    The work directory is open to every uid: only this run's processes can see it (its own mount
    namespace), and judge and candidate must both write there (ClassEval's tests write files the
    class reads, and the reverse)."""
    size = cfg["disk_mb"]
    mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, _proc_options(cfg))  # cover binds via it
    needed = cfg.get("view_paths") or view_paths()
    for scratch in ("/tmp", "/var/tmp", "/dev/shm"):
        cover(scratch, needed, size, "1777")  # a virtualenv in /tmp (the view's part of it) stays visible
    tmpfs(cfg["workdir"], size, "0777")


def _proc_options(cfg: dict) -> str | None:
    # Processes of other uids (the judge, for the candidate) are invisible, not only unreadable.
    return "hidepid=2" if cfg["mode"] in ("ns-root", "uid") else None


# --------------------------------------------------------------------------- identities and limits


def write_id_maps(uid: int, gid: int) -> None:
    """Map our own uid/gid into the new user namespace (unmapped ids cannot create files)."""
    with open("/proc/self/setgroups", "w") as fh:
        fh.write("deny")
    with open("/proc/self/uid_map", "w") as fh:
        fh.write(f"{uid} {uid} 1")
    with open("/proc/self/gid_map", "w") as fh:
        fh.write(f"{gid} {gid} 1")


def exit_code(status: int) -> int:
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


def die_with_parent() -> None:
    prctl = getattr(libc, "prctl", None)  # Linux only
    if prctl is not None:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def drop_capabilities() -> None:
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this thread
    data = (ctypes.c_uint32 * 6)()
    check(libc.capset(header, data), "capset")


def become(uid: int | None, files_as: int | None = None, dumpable: bool = True) -> None:
    """Drop to ``uid`` (or, without a sandbox uid, drop every capability) for good.

    ``files_as`` (the judge): access files as this uid (the candidate's; its group too), so that
    what the tests and the program write in the work directory stays usable by both, while
    signals, ptrace and /proc still see two different users. ``dumpable=False`` (the judge)
    also makes /proc/<pid>/mem, fd/ and ptrace unavailable to processes of the same uid."""
    if uid is not None:
        group = uid if files_as is None else files_as
        os.setgroups([])
        os.setresgid(group, group, group)
        # The saved uid lets setfsuid() pick it; a uid change also clears every capability.
        os.setresuid(uid, uid, uid if files_as is None else files_as)
        if files_as is not None:
            libc.setfsuid(files_as)
            if libc.setfsuid(-1) != files_as:  # setfsuid reports the previous value
                raise OSError("setfsuid failed")
    elif os.geteuid() == 0 or _has_capabilities():
        drop_capabilities()
    check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(NO_NEW_PRIVS)")
    if not dumpable:
        check(libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0), "prctl(DUMPABLE)")
    die_with_parent()  # a uid change cleared the earlier setting


def _has_capabilities() -> bool:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("CapEff:"):
                    return int(line.split()[1], 16) != 0
    except OSError:
        pass
    return True


# The share of the CPU limit a process killed by a signal must have used for its death to count as the limit's. On
# a loaded VM the kernel kills at the limit while the usage reported back to its parent reads 0.91-0.93 of it.
CPU_KILL_SHARE = 0.8


def apply_limits(cfg: dict, cpu_seconds: float | None = None) -> None:
    import resource

    mb = 1024 * 1024
    cpu = int(cfg["cpu_seconds"] if cpu_seconds is None else cpu_seconds)
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


def keep_only_fds(keep: set[int]) -> None:
    """Close every descriptor not in ``keep`` (what a forked process must not inherit)."""
    lo = 0
    for fd in sorted(fd for fd in keep if fd >= 0) + [0x7FFFFFFF]:
        if fd > lo:
            os.closerange(lo, fd)
        lo = fd + 1


def processes_of_uid(uid: int) -> list[int]:
    """Live (non-zombie) processes of this pid namespace whose real uid is ``uid``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as fh:
                text = fh.read()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
        if int(fields.get("Uid", "-1").split()[0]) == uid and fields.get("State", "").split()[:1] not in (["Z"], ["X"]):
            found.append(int(entry))
    return found


def kill_uid(uid: int) -> None:
    """SIGKILL every process of ``uid``, repeating while new ones appear (a fork bomb)."""
    import time

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


# --- descriptors and exit --------------------------------------------------------------------------------


def read_all(fd: int) -> bytes:
    """Everything up to EOF of ``fd``, which is then closed."""
    chunks = []
    while True:
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(fd)
    return b"".join(chunks)


def pread_all(fd: int) -> bytes:
    """The whole of an anonymous file, without moving its offset (it is read again on restarts)."""
    chunks, offset = [], 0
    while True:
        chunk = os.pread(fd, 1 << 20, offset)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        offset += len(chunk)


def flush_and_exit() -> None:
    """Flush stdout and stderr and exit 0 at once: no atexit handlers, no waiting for threads a program left."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:  # noqa: BLE001 - the program may have closed or replaced it
            pass
    os._exit(0)
