"""Cross-play: a team whose agents come from different sources, evaluated as a condition of ``comlrl compare``.

A mix names one source per agent, in agent order: agent i of a run (its final models, or a checkpoint's), agent J of
a run (``#J``: how a swap of two trained agents is written), or an untrained model. Agents trained together may
agree on conventions no other partner shares; pairing them with untrained partners or with agents of a team trained
from another seed shows how much of the team reward rests on such conventions.

Source syntax (``mix:SOURCE,SOURCE,...``)::

    run:DIR | DIR          agent i (the source's position) of the run's final models; DIR@STEP: its checkpoint-STEP
    untrained              agent i's model of the scoring config, untrained
    untrained:CONFIG       agent i's model of CONFIG, untrained (a bare file: the same)
    SOURCE#J               agent J of the run (or config) instead of agent i

The mix is built as ``comlrl eval`` builds a run's own team (:func:`comlrl.runs.build_trainer` with
``agents=[...]``, one model source per agent: the base model its run names), then each trained agent's saved
weights or LoRA adapter are loaded into it; so a mix of a run's own agents answers exactly as the run does. A fully
fine-tuned agent in a mix with LoRA agents is loaded from its saved folder (a fresh adapter on it changes nothing).
Prompts, algorithm and generation settings are those of the first run among the sources (else of the first config).
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from .errors import ComlrlError

AGENT_KINDS = ("run", "untrained")


@dataclass(frozen=True, kw_only=True)
class AgentSource:
    """Where one agent of a mix comes from: a run's trained agent or a config's untrained model.

    ``target``: the run directory or config (None for ``untrained``: the scoring config); ``step``: a checkpoint of
    the run (None: its final models); ``index``: the source team's agent to take (None: the mix's own position).
    """

    kind: str
    target: str | None = None
    step: int | None = None
    index: int | None = None

    @property
    def key(self) -> str:
        """The source with its path resolved: two mixes with the same keys load the same models."""
        where = str(Path(self.target).resolve()) if self.target else ""
        return f"{self.kind}:{where}@{self.step}#{self.index}"

    def label(self) -> str:
        """A short name: the run directory's (or config's) name, with its step and agent index where given."""
        if self.kind == "run":
            text = Path(str(self.target)).name + (f"@{self.step}" if self.step is not None else "")
        else:
            text = Path(self.target).stem if self.target else "untrained"
        return text + (f"#{self.index}" if self.index is not None else "")


def parse_agents(text: str, condition: str) -> tuple[AgentSource, ...]:
    """The sources of ``mix:TEXT``, one per agent in agent order (``condition``: the whole condition, for errors)."""
    if not text.strip():
        raise ComlrlError(
            f"condition {condition!r}: a mix takes one source per agent, in agent order, e.g. "
            "mix:runs/a,untrained (agent 0 of run a, an untrained agent 1) or mix:runs/a#1,runs/a#0 (a swap)."
        )
    return tuple(parse_agent(part, i, condition) for i, part in enumerate(text.split(",")))


def parse_agent(text: str, position: int, condition: str) -> AgentSource:
    """One source of a mix (see the module docstring), for the agent at ``position``."""
    from .runs import strip_step

    spec, index = text.strip(), None
    m = re.match(r"^(.*)#(\d+)$", spec)
    if m:
        spec, index = m.group(1).strip(), int(m.group(2))
    where = f"condition {condition!r}: agent {position}"
    if not spec:
        raise ComlrlError(f"{where}: empty source; give run:DIR, DIR, untrained or untrained:CONFIG.")
    if spec == "untrained":
        return AgentSource(kind="untrained", index=index)
    kind, sep, rest = spec.partition(":")
    if not sep or kind not in AGENT_KINDS:
        if Path(strip_step(spec)[0]).is_dir():
            kind, rest = "run", spec
        elif Path(spec).is_file():
            kind, rest = "untrained", spec
        else:
            raise ComlrlError(
                f"{where}: {spec} is neither a run directory nor a config; give run:DIR, DIR, untrained or "
                "untrained:CONFIG."
            )
    if kind == "run":
        target, step = strip_step(rest)
        if not Path(target).is_dir():
            raise ComlrlError(f"{where}: {target} is not a run directory (written by comlrl train).")
        return AgentSource(kind="run", target=target, step=step, index=index)
    if not Path(rest).is_file():
        raise ComlrlError(f"{where}: {rest} is not a file; untrained:CONFIG takes a YAML run config.")
    return AgentSource(kind="untrained", target=rest, index=index)


def mix_target(agents: Sequence[AgentSource]) -> str:
    """The mix's home: the first run among its sources, else the first config; '' when every source is the bare
    ``untrained`` (the scoring config then has to be named)."""
    runs = [a.target for a in agents if a.kind == "run"]
    configs = [a.target for a in agents if a.target]
    return str((runs or configs or [""])[0])


# --- building the team --------------------------------------------------------------------------------------------


@dataclass(kw_only=True)
class Slot:
    """One agent of a mix, resolved: the model source and tokenizer it is built from, the weights loaded into it."""

    source: Any
    tokenizer: Any
    cfg: Any
    run_dir: Path | None = None
    saved: Path | None = None  # the run's saved folder of the agent (full weights, or a LoRA adapter)
    description: str = ""
    weights: Path | None = None  # what is loaded into the built agent (set by plan_mix)


@dataclass(kw_only=True)
class MixPlan:
    """A mix checked against the scoring env, ready to load: its slots and the config it is built from."""

    name: str
    slots: list[Slot]
    cfg: Any
    output_dir: str


def plan_mix(condition: Any, scoring: str | Path, env: Any, overrides: Sequence[str] = ()) -> MixPlan:
    """Resolve ``condition``'s sources (reading configs only) and check them against the scoring ``env`` (of the
    config ``scoring``): one source per agent of its team, every source a team of that env and size, every index
    in range, the LoRA runs among them of one LoRA shape."""
    name, agents = condition.name, condition.agents
    if len(agents) != env.num_agents:
        raise ComlrlError(
            f"condition {name!r}: the mix lists {len(agents)} agent{'s' if len(agents) != 1 else ''}; the scoring env "
            f"{env.name} has a team of {env.num_agents} (one source per agent, in agent order)."
        )
    slots = [_slot(name, i, a=a, scoring=Path(scoring), env=env, overrides=overrides) for i, a in enumerate(agents)]
    loras = {i: s.cfg.lora for i, s in enumerate(slots) if s.saved is not None and s.cfg.lora is not None}
    shapes = {json.dumps(v, sort_keys=True, default=str) for v in loras.values()}
    if len(shapes) > 1:
        shown = "; ".join(f"agent {i}: {slots[i].run_dir}: {v}" for i, v in loras.items())
        raise ComlrlError(
            f"condition {name!r}: its LoRA agents come from runs with different lora sections ({shown}); the "
            "adapters of one mix share one LoRA shape."
        )
    home = next((s for s in slots if s.run_dir is not None), slots[0])
    lora = next(iter(loras.values()), None)
    folded = [i for i, s in enumerate(slots) if s.saved is not None and s.cfg.lora is None and lora is not None]
    for i, s in enumerate(slots):
        if i in folded:  # full weights under a LoRA team's fresh (identity) adapter: built from the saved folder
            s.source = str(s.saved)
        elif s.saved is not None:
            s.weights = s.saved
    if folded and home.cfg.training.get("eval_contributions"):
        raise ComlrlError(
            f"condition {name!r}: eval_contributions replaces each agent by its untrained model, which a fully "
            f"fine-tuned agent (agent {folded[0]}) in a team of LoRA agents does not keep; set "
            "training.eval_contributions=false for this comparison, or pair agents trained alike."
        )
    tokenizers = [s.tokenizer for s in slots]
    cfg = dataclasses.replace(
        home.cfg, model=None, agents=[s.source for s in slots], num_agents=None, tokenizer=tokenizers, lora=lora
    )
    output_dir = str(home.run_dir) if home.run_dir is not None else home.cfg.output_dir or "output"
    return MixPlan(name=name, slots=slots, cfg=cfg, output_dir=output_dir)


def _slot(name: str, i: int, *, a: AgentSource, scoring: Path, env: Any, overrides: Sequence[str]) -> Slot:
    from . import runconfig
    from .runs import run_config_file, trained_models

    where = f"condition {name!r}: agent {i}"
    path = Path(a.target) if a.target else scoring
    cfg = runconfig.load_config(run_config_file(path) if a.kind == "run" else path, list(overrides))
    origin = f"run {path}" if a.kind == "run" else str(path)
    if cfg.env.name != env.name:
        raise ComlrlError(
            f"{where} comes from {origin}, a {cfg.env.name} team; the comparison scores {env.name}: a mix pairs "
            "agents of one env."
        )
    if cfg.team_size != env.num_agents:
        raise ComlrlError(
            f"{where} comes from {origin}, a team of {cfg.team_size}; the mix has {env.num_agents} agents: "
            "cross-play pairs agents of teams of one size."
        )
    j = i if a.index is None else a.index
    if not 0 <= j < cfg.team_size:
        raise ComlrlError(f"{where} takes agent {j} of {origin}, whose team has agents 0 to {cfg.team_size - 1}.")
    base = cfg.agents[j] if cfg.agents is not None else cfg.model
    tokenizer = cfg.tokenizer[j] if isinstance(cfg.tokenizer, list) else cfg.tokenizer or base
    if a.kind == "untrained":
        return Slot(
            source=base, tokenizer=tokenizer, cfg=cfg, description=f"agent {j}'s model of {path} ({base}), untrained"
        )
    num_models = getattr(cfg.algo.trainer_class(), "num_models", None) or cfg.team_size
    if num_models != cfg.team_size:
        raise ComlrlError(
            f"{where} comes from run {path}, whose {cfg.algorithm} trainer saves {num_models} model(s) for its "
            f"{cfg.team_size} roles; a mix takes agents of teams with one model per agent."
        )
    folder = trained_models(path, a.step, num_models)
    what = "final models" if folder.name == "final" else folder.name
    lora = f", a LoRA adapter on {base}" if cfg.lora is not None else ""
    return Slot(
        source=base,
        tokenizer=tokenizer,
        cfg=cfg,
        run_dir=path,
        saved=folder / f"agent_{j}",
        description=f"agent {j} of run {path} ({what}){lora}",
    )


def open_mix(plan: MixPlan) -> tuple[Any, Any, dict[str, Any]]:
    """(trainer, env, models) of a planned mix, every agent's weights loaded."""
    from .parallel.checkpoint import load_weights
    from .runs import build_trainer, make_env

    env = make_env(plan.cfg)
    trainer = build_trainer(plan.cfg, env, train=None, evaluation=None, output_dir=plan.output_dir)
    for agent, slot in zip(trainer.agents, plan.slots):  # full weights, or the adapter on the base the run names
        if slot.weights is not None:
            load_weights(agent.model, slot.weights, agent.adapter)
    parts = ", ".join(f"agent {i} = {s.description}" for i, s in enumerate(plan.slots))
    return trainer, env, {"models": "cross-play", "description": f"cross-play: {parts}"}


def open_team(condition: Any, scoring: str | Path, overrides: Sequence[str] = ()) -> tuple[Any, Any, dict[str, Any]]:
    """(trainer, env, models) of a mix condition, checked against the env of the config (or run directory)
    ``scoring``."""
    from . import runconfig
    from .runs import make_env, run_config_file

    scoring = Path(scoring)
    cfg_path = run_config_file(scoring) if scoring.is_dir() else scoring
    env = make_env(runconfig.load_config(cfg_path, list(overrides)))
    return open_mix(plan_mix(condition, cfg_path, getattr(env, "team", None) or env, overrides))
