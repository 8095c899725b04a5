"""Builds the sandbox's file-system view in the zygote's mount namespace (inside; stdlib only).

The steps come from ``comlrl.sandbox._view.plan`` (the trainer decides what is shown). Each bind
mount is made read-only as soon as it exists, so a mistake in a later step cannot write to the
host; at the end every mount below the new root is read-only and the root is pivoted into it,
which drops the rest of the host's tree from this namespace altogether.
"""

from __future__ import annotations

import os
import stat

import _harness_os as hos

# statvfs flags -> mount flags that a read-only remount has to repeat (they may be locked).
_STATVFS_FLAGS = {2: hos.MS_NOSUID, 4: hos.MS_NODEV, 8: hos.MS_NOEXEC, 1024: hos.MS_NOATIME, 2048: hos.MS_NODIRATIME}
_STATVFS_FLAGS[4096] = hos.MS_RELATIME


def _readonly(target: str) -> None:
    flags = os.statvfs(target).f_flag
    extra = 0
    for bit, ms in _STATVFS_FLAGS.items():
        if flags & bit:
            extra |= ms
    hos.mount(None, target, None, hos.MS_REMOUNT | hos.MS_BIND | hos.MS_RDONLY | extra)


def _bind(source: str, target: str, root: str) -> None:
    if not os.path.lexists(target):
        _make_parents(target, root)
        if stat.S_ISDIR(os.stat(source).st_mode):
            os.mkdir(target)
        else:
            open(target, "w").close()
    hos.mount(source, target, None, hos.MS_BIND | hos.MS_REC)
    _readonly(target)


def _make_parents(path: str, root: str) -> None:
    parent = os.path.dirname(path)
    if not parent.startswith(root):
        raise OSError(f"view: {path} is outside the new root")
    os.makedirs(parent, mode=0o755, exist_ok=True)


def build(steps: list, root: str) -> None:
    """Populate a fresh tmpfs at ``root`` from ``steps`` and make it this namespace's root."""
    hos.mount(None, "/", None, hos.MS_REC | hos.MS_PRIVATE)  # nothing may propagate to the host
    hos.tmpfs(root, 16, "0755")
    root = root.rstrip("/")
    for step in steps:
        kind, path = step[0], step[1]
        target = root + path
        if kind == "dir":
            os.makedirs(target, mode=0o755, exist_ok=True)
        elif kind == "symlink":
            if not os.path.lexists(target):
                _make_parents(target, root)
                os.symlink(step[2], target)
        elif kind in ("bind", "dev"):
            _bind(path, target, root)
        elif kind == "cover":
            if not os.path.isdir(target):
                continue  # not inside anything bound
            hos.tmpfs(target, 1, "0755")
            for name in step[2]:
                _bind(os.path.join(path, name), os.path.join(target, name), root)
            _readonly(target)
        else:
            raise ValueError(f"view: unknown step {kind!r}")
    hos.remount_readonly(root)
    hos.pivot_root(root)
