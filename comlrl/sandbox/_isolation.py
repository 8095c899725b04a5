"""Which isolation this machine supports: probed once per process, then cached."""

from __future__ import annotations

import logging
import os
import platform
import threading
from dataclasses import dataclass

from ._process import execute
from ._types import SandboxLimits
from .harness._harness_os import processes_of_uid

logger = logging.getLogger("comlrl.sandbox")

MODE_ENV = "COMLRL_SANDBOX_MODE"  # force one of MODES (debugging, tests)
MODES = ("ns-root", "ns-user", "uid", "plain")  # strongest first


@dataclass(frozen=True)
class Isolation:
    """The isolation mode in use and whether it can cut the network."""

    mode: str  # "ns-root" | "ns-user" | "uid" | "plain"
    netns: bool


_lock = threading.Lock()
_cached: Isolation | None = None
_warned_network = False


def _probe(mode: str, netns: bool) -> bool:
    limits = SandboxLimits(timeout=20.0)
    job = {"probe": True, "program": "", "tests": [], "kind": "asserts", "setup": ""}
    try:
        raw = execute(job, mode=mode, netns=netns, limits=limits, timeout=limits.timeout, nproc=None)
    except OSError as exc:
        logger.debug("sandbox probe %s (netns=%s) could not start: %s", mode, netns, exc)
        return False
    kinds = {r.get("type") for r in raw.records}
    ok = "hello" in kinds and "done" in kinds
    if not ok:
        failure = next(
            (r.get("message") for r in raw.records if r.get("type") == "setup_failed"),
            raw.stderr.decode(errors="replace")[-500:],
        )
        logger.debug("sandbox probe %s (netns=%s) failed: %s", mode, netns, failure)
    return ok


def _candidates() -> list[tuple[str, bool]]:
    forced = os.environ.get(MODE_ENV)
    if forced:
        if forced not in MODES:
            raise ValueError(f"{MODE_ENV}={forced!r} is not one of {MODES}")
        modes: tuple[str, ...] = (forced,)
    elif platform.system() != "Linux":
        modes = ("plain",)
    elif os.geteuid() == 0:
        # Not ns-user: since Linux 5.12 a process cannot map uid 0 into its own new user
        # namespace (that needs CAP_SETFCAP in the parent namespace).
        modes = ("ns-root", "uid", "plain")
    else:
        modes = ("ns-user", "plain")
    return [(m, net) for m in modes for net in ((True, False) if m.startswith("ns-") else (False,))]


def current_isolation() -> Isolation:
    """The strongest isolation that works here (probes on first call)."""
    global _cached
    with _lock:
        if _cached is None:
            candidates = _candidates()
            for mode, netns in candidates:
                if mode == "plain" or _probe(mode, netns):
                    _cached = Isolation(mode, netns)
                    break
            if _cached is None:
                raise RuntimeError(
                    f"sandbox: isolation mode {candidates[0][0]!r} ({MODE_ENV}) "
                    "does not work here; enable debug logging for the reason"
                )
            logger.info("sandbox isolation: mode=%s network namespace=%s", _cached.mode, _cached.netns)
            if _cached.mode in ("uid", "plain"):
                logger.warning(
                    "sandbox: Linux namespaces are unavailable (mode %r); programs run with "
                    "rlimits, a scrubbed environment and a temporary directory%s (see "
                    "docs/sandbox.md)",
                    _cached.mode,
                    " under a sandbox uid" if _cached.mode == "uid" else " only",
                )
        return _cached


def network_isolation_available() -> bool:
    """Whether sandboxed programs can be cut off from the network on this machine."""
    return current_isolation().netns


def warn_network_once() -> None:
    """Log (once per process) that network isolation was requested but is unavailable."""
    global _warned_network
    with _lock:
        if _warned_network:
            return
        _warned_network = True
    logger.warning(
        "sandbox: network isolation is unavailable here (no network namespace); "
        "sandboxed programs can open network connections"
    )


def nproc_limit(mode: str, max_processes: int) -> int | None:
    """RLIMIT_NPROC value that gives a run about ``max_processes`` tasks, or None.

    RLIMIT_NPROC counts every task of the real uid. Root modes give each run its own uid,
    and since Linux 5.14 a user namespace counts its own tasks, so the plain value works
    there; otherwise the user's existing tasks are added (approximate)."""
    if mode in ("ns-root", "uid"):
        return max_processes
    if os.geteuid() == 0:
        return None  # root ignores RLIMIT_NPROC anyway
    if mode == "ns-user" and _kernel_at_least(5, 14):
        return max_processes
    return len(processes_of_uid(os.getuid())) + max_processes


def _kernel_at_least(major: int, minor: int) -> bool:
    try:
        parts = platform.release().split(".")
        return (int(parts[0]), int(parts[1].split("-")[0])) >= (major, minor)
    except (IndexError, ValueError):
        return False
