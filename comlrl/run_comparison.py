"""The comparison at the end of a training run: ``evaluation.compare: [MODE, ...]`` in a run config.

``comlrl train`` evaluates the team on the evaluation rows before and after training. With ``evaluation.compare``
it also sets the trained team beside the untrained team and the named baselines (:mod:`comlrl.envs.core.baselines`)
on those rows, and writes :mod:`comlrl.compare`'s outputs into ``RUN_DIR/compare/`` (results.md, results.csv,
compare.png, samples.jsonl, summary.json); the run report shows its table. The control of the paired differences
(the condition the others are compared to) is the untrained team.

Only the baselines are evaluated for it. The untrained team's per-row results are those of the 'before' evaluation
and the trained team's those of the 'after' evaluation: both are ``trainer.evaluate()`` on the trainer's
``eval_dataset`` with the evaluation's decoding (``generation_settings(train=False)``: greedy unless
``eval_do_sample``) and ``eval_num_generations`` joint answers per row, so they answer the same rows alike (the rows'
content keys are checked to match when the comparison is written). The baselines run right after the 'before'
evaluation, while the agents are the untrained models the 'before' evaluation used (a LoRA adapter starts as a zero
update: the base model), with the same decoding, ``eval_num_generations`` answers per row when it samples, one
when greedy. Each condition's per-row results are saved in ``compare/conditions/`` as they are made; a resumed run
reuses them (on resume the agents are untrained again until training loads the checkpoint).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from .algorithms.bootstrap import LEVEL, NUM_RESAMPLES
from .errors import ComlrlError

FOLDER = "compare"
UNTRAINED, TRAINED = "untrained", "trained"
#: the evaluation tag whose per-row results are each team condition's
TAGS = {"before": UNTRAINED, "after": TRAINED}
#: baselines that answer with agent 0 alone; the others need one agent per role
SOLO_MODES = ("single", "centralized")


class RunComparison:
    """The comparison of one run: per-row results collected while the run goes, written by :meth:`write`."""

    def __init__(self, cfg: Any, run_dir: str | Path, env: Any, trainer: Any) -> None:
        trainer.dist.require_one_process(
            "evaluation.compare: under torchrun each process holds only some agents; remove evaluation.compare "
            "and compare the run afterwards in one process (comlrl compare RUN_DIR untrained:CONFIG ...)."
        )
        self.modes = list(cfg.evaluation.compare)
        self.run_dir = Path(run_dir)
        self.folder = self.run_dir / FOLDER
        self.config = str(cfg.source_path or self.run_dir / "config.yaml")
        # an env's single-agent form (env.format: single) holds its team, whose reward scores every condition
        self.env = getattr(env, "team", None) or env
        core = _core(trainer)
        self.dataset = core.eval_dataset
        args = core.args
        self.seed = int(args.seed)
        self.sampled = bool(args.eval_do_sample)
        self.temperature = float(args.eval_temperature) if self.sampled else 0.0
        self.baseline_samples = int(args.eval_num_generations) if self.sampled else 1
        agents = len(core.agents)
        for mode in self.modes:
            needs = 1 if mode in SOLO_MODES else self.env.num_agents
            if agents < needs:
                raise ComlrlError(
                    f"evaluation.compare: baseline {mode!r} answers with one agent per role ({needs}), this team has "
                    f"{agents}; compare with {' or '.join(SOLO_MODES)}."
                )

    # --- collecting ---------------------------------------------------------------------------------------------

    def path(self, name: str) -> Path:
        """Where condition ``name``'s per-row results are saved."""
        return self.folder / "conditions" / f"{name}.json"

    def has(self, tag: str) -> bool:
        """Whether the evaluation ``tag`` (before / after) has saved its per-row results."""
        return self.path(TAGS[tag]).is_file()

    def add_team(self, tag: str, trainer: Any, seconds: float) -> None:
        """Keep the per-row results of the evaluation ``tag`` the trainer has just run (``seconds``: its time)."""
        from .compare import episode_records

        core = _core(trainer)
        episodes = getattr(core, "last_eval_episodes", None)
        if episodes is None:
            raise ComlrlError(
                f"evaluation.compare: {type(core).__name__}.evaluate() keeps no per-row results "
                "(last_eval_episodes); remove evaluation.compare for this algorithm."
            )
        kind = "run" if tag == "after" else "untrained"
        self._save(TAGS[tag], kind=kind, records=episode_records(episodes), seconds=seconds, extra={})

    def run_baselines(self, trainer: Any) -> None:
        """Run each baseline not yet saved with the trainer's agents, which must be untrained (before training)."""
        from .compare import baseline_records
        from .envs.core.baselines import baseline_rows
        from .rollout.sampling import derive_seed
        from .runs import make_generate

        rows = [dict(self.dataset[i]) for i in self._row_ids() for _ in range(self.baseline_samples)]
        for mode in self.modes:
            if self.path(mode).is_file():
                continue
            calls: list[list[int]] = []
            generate = make_generate(
                _core(trainer), seed=derive_seed(self.seed, "compare-baseline", mode), tokens=calls
            )
            start = time.perf_counter()
            try:
                result = baseline_rows(self.env, mode, generate=generate, rows=rows, reward_func=self.env.reward_func)
            except NotImplementedError as exc:
                raise ComlrlError(
                    f"evaluation.compare: environment {self.env.name!r} has no {mode!r} baseline (its single-agent "
                    f"prompt or split is not defined); remove {mode!r} from evaluation.compare."
                ) from exc
            seconds = time.perf_counter() - start
            records = baseline_records(result, calls, self.baseline_samples)
            ids = self._row_ids()
            for r in records:
                r["row"] = ids[r["row"]]
            self._save(mode, kind="baseline", records=records, seconds=seconds, extra=dict(result.metrics))

    def _row_ids(self) -> list[int]:
        """The rows the untrained team answered (the evaluation's, up to ``eval_max_rows``)."""
        saved = self._load(UNTRAINED)
        return sorted({r["row"] for r in saved["records"]})

    def _save(self, name: str, *, kind: str, records: list[dict], seconds: float, extra: dict) -> None:
        from .compare import row_key

        for r in records:
            r["key"] = row_key(self.dataset[r["row"]])
        path = self.path(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        data = {"condition": name, "kind": kind, "seconds": seconds, "extra": extra, "records": records}
        path.write_text(json.dumps(data, default=str))

    def _load(self, name: str) -> dict:
        path = self.path(name)
        if not path.is_file():
            what = f"the {name} team's evaluation" if name in TAGS.values() else f"baseline {name!r}"
            raise ComlrlError(f"evaluation.compare: {path} is missing: {what} did not run in this run.")
        return json.loads(path.read_text())

    # --- writing ------------------------------------------------------------------------------------------------

    def write(self) -> Any:
        """The :class:`~comlrl.compare_output.Comparison` of the trained team, the untrained team and the baselines, with
        its outputs written into ``RUN_DIR/compare/``."""
        from .compare import summarize
        from .compare_output import Comparison, Condition

        names = [TRAINED, UNTRAINED, *self.modes]
        saved = {name: self._load(name) for name in names}
        keys = {r["row"]: r["key"] for r in saved[UNTRAINED]["records"]}
        for name, data in saved.items():
            got = {r["row"]: r["key"] for r in data["records"]}
            if got != keys:
                raise ComlrlError(
                    f"evaluation.compare: {name} answered other rows than the untrained team "
                    f"({sorted(got)} against {sorted(keys)}); every condition scores the same rows."
                )
        row_ids = sorted(keys)
        per_row = sum(r["row"] == row_ids[0] for r in saved[UNTRAINED]["records"])
        records = [{"condition": name, **r} for name in names for r in saved[name]["records"]]
        summary = summarize(
            records,
            names=names,
            control=UNTRAINED,
            row_ids=row_ids,
            samples=per_row,
            seconds={name: saved[name]["seconds"] for name in names},
            extras={name: saved[name]["extra"] for name in names},
            num_resamples=NUM_RESAMPLES,
            seed=self.seed,
        )
        descriptions = {
            TRAINED: f"the team after training ({self.run_dir / 'final'}): the 'after' evaluation's answers",
            UNTRAINED: "the team before training: the 'before' evaluation's answers",
            **{m: f"baseline '{m}' with the untrained models, run before training" for m in self.modes},
        }
        conditions = [
            Condition(name=TRAINED, kind="run", target=str(self.run_dir)),
            Condition(name=UNTRAINED, kind="untrained", target=self.config),
            *(Condition(name=m, kind="baseline", target=self.config, step=None, mode=m) for m in self.modes),
        ]
        for cond in conditions:
            summary[cond.name]["kind"] = cond.kind
            summary[cond.name]["description"] = descriptions[cond.name]
        settings = {
            "env": self.env.name,
            "scoring_config": str(self.run_dir / "config.yaml"),
            "rows": len(row_ids),
            "samples": per_row,
            "decoding": "greedy" if not self.sampled else f"sampling at temperature {self.temperature:g}",
            "temperature": self.temperature,
            "seed": self.seed,
            "level": LEVEL,
            "num_resamples": NUM_RESAMPLES,
        }
        rows = [{"row": i, "key": keys[i]} for i in row_ids]
        result = Comparison(
            conditions=conditions,
            control=UNTRAINED,
            rows=rows,
            records=records,
            summary=summary,
            settings=settings,
            descriptions=descriptions,
        )
        result.write(self.folder)
        return result


def _core(trainer: Any) -> Any:
    """The trainer that evaluates (a MARLHF trainer's stage-3 trainer, else the trainer itself)."""
    return getattr(trainer, "rl", trainer)
