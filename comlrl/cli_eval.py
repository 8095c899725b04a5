"""The evaluation side of the ``comlrl`` command line: ``comlrl eval`` and ``comlrl compare``.

What they load and generate with (a run's trained models or a config's untrained ones, the baselines' ``generate``)
is in :mod:`comlrl.runs`; the argparse wiring is in :mod:`comlrl.cli`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from .runs import make_generate, open_evaluation

# --- eval ------------------------------------------------------------------------------------------


def cmd_evaluate(ns: argparse.Namespace) -> int:
    trainer, env, rows, models = open_evaluation(ns.target, ns.checkpoint, ns.set)
    print(f"models: {models['description']}")
    results: dict[str, Any] = {}
    if not ns.baseline:
        results["team"] = trainer.evaluate()
        print(json.dumps(results["team"], indent=2))
    else:
        from .envs.core.baselines import format_table, run_baseline

        generate = make_generate(trainer)
        for mode in ns.baseline:
            results[mode] = run_baseline(env, mode, generate=generate, rows=rows)
        print(format_table(results))
    text = json.dumps({"models": models, **results}, indent=2, default=str)
    outputs = [Path(ns.output)] if ns.output else []
    if "run_dir" in models:  # a trained run's evaluation stays with the run
        outputs.append(Path(models["run_dir"]) / f"eval_{models['models']}.json")
    for path in outputs:
        path.write_text(text)
        print(f"results: {path}")
    return 0


# --- compare ---------------------------------------------------------------------------------------


def cmd_compare(ns: argparse.Namespace) -> int:
    from .compare import compare

    result = compare(
        ns.conditions,
        rows=ns.rows,
        samples=ns.samples,
        control=ns.control,
        temperature=ns.temperature,
        seed=ns.seed,
        out=ns.out,
        config=ns.config,
        overrides=ns.set,
        num_resamples=ns.resamples,
    )
    print(result.table())
    print(f"results: {Path(ns.out) / 'results.md'}")
    return 0
