"""The MAAC learning run of tests/slow/test_slow_actor_critic.py at another seed, with or without the decode's
weight loan (``lend_weights``), printing its reward gains.

    python benchmarks/maac_learning_seeds.py SEED 1   # with the loan (where it applies)
    python benchmarks/maac_learning_seeds.py SEED 0   # without

Run from the repository root with ../shared beside it. The suite pins ``COMLRL_BF16=0``, so the run is fp32, as in
CI. At commit d7b35eb the loan also took a frozen fp32 base; since bdaf387 it takes trained weights only, and the
two settings of this script decode alike for this LoRA team.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("COMLRL_BF16", "0")
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "slow")]

import test_slow_actor_critic as learning  # noqa: E402

import comlrl.rollout.generation as generation  # noqa: E402
from comlrl.trainers import MAACConfig  # noqa: E402


def main() -> None:
    seed, lend = int(sys.argv[1]), sys.argv[2] == "1"
    if not lend:
        fast_generate = generation.fast_generate
        generation.fast_generate = lambda *a, **k: fast_generate(*a, **{**k, "lend_weights": False})

    def config(**kw):
        return MAACConfig(**{**kw, "seed": seed})

    data = ROOT.parent / "shared" / "data"
    r = learning.run(learning.MAACTrainer, config, data, Path(tempfile.mkdtemp()), critic_learning_rate=1e-3)
    gains = {"train_gain": r["train_last4"] - r["train_first4"], "eval_gain": r["eval_after"] - r["eval_before"]}
    print(json.dumps({"seed": seed, "lend": lend, **r, **gains}))


if __name__ == "__main__":
    main()
