"""Peak resident memory of each rollout and of each update (loss, backward, optimizer) of a bench_train variant.

The kernel's high-water mark of the process (VmHWM) is reset at each rollout's start and end (Linux
``/proc/self/clear_refs``), so each printed peak is that phase's own: what a change to the rollout or to the update
costs in memory, which the whole run's peak (``bench_train.py``'s column) cannot tell apart. Linux only.

    python benchmarks/bench_phase_memory.py full2 4     # variant, steps
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_train  # noqa: E402

import comlrl.rollout.episode as episode  # noqa: E402


def _status_gb(field: str) -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field)) / 1024**2


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def main() -> None:
    variant, steps = sys.argv[1], int(sys.argv[2])
    generate = episode.generate_concurrently

    def measured(requests):
        update_peak = _status_gb("VmHWM")  # since the last rollout ended: its update (before the first: the loading)
        _reset_peak()
        before = _status_gb("VmRSS")
        out = generate(requests)
        print(
            f"peak since the last rollout {update_peak:.2f} GB | rollout: before {before:.2f}, peak {_status_gb('VmHWM'):.2f}, "
            f"after {_status_gb('VmRSS'):.2f} GB",
            flush=True,
        )
        _reset_peak()
        return out

    episode.generate_concurrently = measured
    bench_train.run_variant(variant, steps)
    print(f"last update peak {_status_gb('VmHWM'):.2f} GB", flush=True)


if __name__ == "__main__":
    main()
