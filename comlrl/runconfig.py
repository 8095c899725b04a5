"""Run configs for the ``comlrl`` command line: one YAML file says what to train, on what, and how.

Loading is pure (no models, no data): read the YAML, apply ``--set a.b=value`` overrides, resolve
relative paths against the config file's directory, check every key (an unknown key fails with the
nearest valid name), and build the algorithm's trainer config so invalid settings fail before any
model is loaded. Schema (every key optional except ``env.name``)::

    name: quickstart              # run name; the run directory is runs/<name>-<timestamp> unless output_dir is set
    algorithm: magrpo             # a key of ALGORITHMS: magrpo, mareinforce, marloo, maremax, iac, maac,
                                  # centralized_magrpo (the centralized baseline), madpo, marlhf
    output_dir: null              # run directory (relative to the working directory)
    resume: false                 # true / auto: continue from the newest complete checkpoint
    env:
      name: tldr                  # comlrl.envs.list_envs()
      options: {}                 # keyword options of comlrl.envs.make(name, ...)
      format: team                # team, or single: one model writes every part (the equal-budget control)
    data:
      source: null                # local JSON/JSONL/parquet (relative to this file) or a hub id; null = env default
      split: null                 # split of source (null = the environment's default)
      limit: null                 # training rows (null = all that are not held out)
      eval_source: null           # null = source
      eval_split: holdout         # holdout: the eval_limit rows after the training rows; else a split name
      eval_limit: 8               # evaluation rows (0 = no evaluation)
    model: embedded               # one source copied into every agent: 'embedded', a local dir, .gguf or hub id
    agents: null                  # or one source per agent (a heterogeneous team); excludes model
    num_agents: 2                 # team size with model (default 2, or len(agents); 1 with env.format single)
    tokenizer: null               # one tokenizer source or one per agent (default: each model's own)
    lora: null                    # peft.LoraConfig fields, e.g. {r: 8, lora_alpha: 16, target_modules: [q_proj, v_proj]}
    training: {}                  # fields of the algorithm's config class (comlrl.configs), e.g. learning_rate
    evaluation: {before: true, after: true, num_samples: 3, compare: []}  # compare: baselines set beside the
                                  # trained and the untrained team at the end (compare/, report.md)
    report: true                  # write plots and a summary (comlrl report) at the end

Precedence of training settings: the config class defaults < the environment's ``defaults`` < ``training``.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .configs.base import TrainConfig
from .configs.fields import help_field, suggest
from .errors import ConfigError

# --- algorithms -----------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Algorithm:
    """A trainer the command line can run: import paths 'module:Name' of its class and its config class."""

    name: str
    trainer: str
    config: str
    description: str = ""

    def config_class(self) -> type[TrainConfig]:
        return _import(self.config)

    def trainer_class(self) -> type:
        return _import(self.trainer)


ALGORITHMS: dict[str, Algorithm] = {}


def register_algorithm(name: str, trainer: str, config: str, description: str = "") -> Algorithm:
    """Make ``algorithm: name`` available in run configs (import paths are resolved when used)."""
    if name in ALGORITHMS:
        raise ConfigError(f"algorithm '{name}' is already registered ({ALGORITHMS[name].trainer}).")
    ALGORITHMS[name] = Algorithm(name=name, trainer=trainer, config=config, description=description)
    return ALGORITHMS[name]


register_algorithm(
    "magrpo",
    "comlrl.trainers.magrpo:MAGRPOTrainer",
    "comlrl.configs:MAGRPOConfig",
    "multi-agent GRPO: group-mean baseline",
)
register_algorithm(
    "mareinforce",
    "comlrl.trainers.magrpo:MAREINFORCETrainer",
    "comlrl.configs:MAREINFORCEConfig",
    "multi-agent REINFORCE: no baseline",
)
register_algorithm(
    "marloo",
    "comlrl.trainers.magrpo:MARLOOTrainer",
    "comlrl.configs:MARLOOConfig",
    "multi-agent RLOO: leave-one-out baseline",
)
register_algorithm(
    "maremax",
    "comlrl.trainers.magrpo:MAReMaxTrainer",
    "comlrl.configs:MAReMaxConfig",
    "multi-agent ReMax: group-max baseline",
)
register_algorithm(
    "iac",
    "comlrl.trainers.actor_critic:IACTrainer",
    "comlrl.configs:IACConfig",
    "independent actor-critic: a value critic per agent",
)
register_algorithm(
    "maac",
    "comlrl.trainers.actor_critic:MAACTrainer",
    "comlrl.configs:MAACConfig",
    "multi-agent actor-critic: one centralized critic",
)
register_algorithm(
    "centralized_magrpo",
    "comlrl.trainers.centralized:CentralizedMAGRPOTrainer",
    "comlrl.configs:CentralizedMAGRPOConfig",
    "centralized baseline: one model writes every role's answer in <agent_i> tags (MAGRPO on the joint answer)",
)
register_algorithm(
    "madpo",
    "comlrl.trainers.madpo:MADPOTrainer",
    "comlrl.configs:MADPOConfig",
    "multi-agent DPO: online rounds of team candidates -> preference pairs -> per-agent DPO",
)
register_algorithm(
    "marlhf",
    "comlrl.trainers.marlhf:MARLHFTrainer",
    "comlrl.configs:MARLHFConfig",
    "multi-agent RLHF: preference pairs -> joint reward model -> RL against it",
)


def _import(path: str) -> Any:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def get_algorithm(name: str) -> Algorithm:
    if name not in ALGORITHMS:
        raise ConfigError(
            f"algorithm: unknown '{name}'.{suggest(str(name), list(ALGORITHMS))} Available: {', '.join(ALGORITHMS)}."
        )
    return ALGORITHMS[name]


# --- sections ---------------------------------------------------------------------------------------


@dataclass(kw_only=True)
class EnvSection:
    name: str = help_field("", "Environment name (`comlrl envs` lists them).")
    options: dict = help_field({}, "Keyword options of comlrl.envs.make(name, ...), e.g. {transition: passed}.")
    format: str = help_field(
        "team",
        "team: one model per agent; single: one model writes every part from the env's single-agent prompt, the "
        "team reward scoring its split parts (num_agents 1, single-turn; the equal-budget control of a team).",
    )


@dataclass(kw_only=True)
class DataSection:
    source: str | None = help_field(
        None,
        "Training data: a local JSON/JSONL/parquet file (relative to the config file) or a "
        "hub id; null = the environment's default (package data or its hub id).",
    )
    split: str | None = help_field(None, "Split of source (null = the environment's default split).")
    limit: int | None = help_field(None, "Use at most this many training rows (null = all that are not held out).")
    eval_source: str | None = help_field(None, "Evaluation data (null = source).")
    eval_split: str = help_field(
        "holdout",
        "'holdout': the eval_limit rows of source right after the training rows (the "
        "last rows when limit is null), never trained on; otherwise a split of eval_source.",
    )
    eval_limit: int = help_field(8, "Evaluation rows (0 = no evaluation).")


@dataclass(kw_only=True)
class EvaluationSection:
    before: bool = help_field(True, "Evaluate the team on the evaluation rows before training.")
    after: bool = help_field(True, "Evaluate again after training and print the before/after summary.")
    num_samples: int = help_field(3, "Sample completions shown in the summary and the report.")
    compare: list = help_field(
        [],
        "Baselines (single, parallel, sequential, discussion, centralized, with the untrained models) to compare "
        "with at the end of the run: compare/ and a section of report.md hold the trained team, the untrained team "
        "and these on the evaluation rows, with paired 95% bootstrap intervals (needs before and after).",
    )


@dataclass(kw_only=True)
class RunConfig:
    """A whole run: algorithm, environment, data, team, LoRA, trainer settings, evaluation, report."""

    name: str = help_field("run", "Run name; the run directory is runs/<name>-<timestamp> unless output_dir is set.")
    algorithm: str = help_field(
        "magrpo",
        "One of ALGORITHMS (magrpo, mareinforce, marloo, maremax, iac, maac, centralized_magrpo, madpo, marlhf).",
    )
    output_dir: str | None = help_field(None, "Run directory (relative to the working directory).")
    resume: bool = help_field(False, "Continue from the newest complete checkpoint in the run directory (true / auto).")
    env: EnvSection = help_field(None, "The environment.")
    data: DataSection = help_field(None, "Training and evaluation data.")
    model: str | None = help_field(
        None, "One model source for every agent: 'embedded', a local dir / .gguf, or a hub id."
    )
    agents: list | None = help_field(None, "One model source per agent (heterogeneous team); excludes model.")
    num_agents: int | None = help_field(
        None, "Team size when model is given (default 2, or len(agents); 1 with env.format: single)."
    )
    tokenizer: Any = help_field(None, "One tokenizer source, or one per agent (default: each model's own).")
    lora: dict | None = help_field(None, "peft.LoraConfig fields; each agent gets its own adapter on a frozen base.")
    training: dict = help_field({}, "Fields of the algorithm's config class (learning_rate, num_generations, ...).")
    evaluation: EvaluationSection = help_field(None, "Evaluation before and after training.")
    report: bool = help_field(True, "Write plots and a Markdown summary at the end of training.")
    #: Where the config came from (not a YAML key).
    source_path: str | None = field(default=None, metadata={"internal": True})

    def __post_init__(self) -> None:
        self.env = self.env or EnvSection()
        self.data = self.data or DataSection()
        self.evaluation = self.evaluation or EvaluationSection()

    # --- derived ------------------------------------------------------------------------------
    @property
    def algo(self) -> Algorithm:
        return get_algorithm(self.algorithm)

    @property
    def team_size(self) -> int:
        if self.agents is not None:
            return len(self.agents)
        return self.num_agents or (1 if self.env.format == "single" else 2)

    def trainer_kwargs(self, env_defaults: dict | None = None) -> dict[str, Any]:
        """The trainer config's fields: env defaults under the ``training`` section."""
        names = {f.name for f in dataclasses.fields(self.algo.config_class())}
        values = {k: v for k, v in (env_defaults or {}).items() if k in names}
        values.update(self.training)
        return values

    def trainer_config(self, env_defaults: dict | None = None, **overrides: Any) -> TrainConfig:
        """Build (and so validate) the algorithm's config; errors name ``training.<field>``."""
        cls = self.algo.config_class()
        kwargs = _coerce_floats(cls, {**self.trainer_kwargs(env_defaults), **overrides})
        try:
            return cls(**kwargs)
        except ConfigError as exc:
            raise ConfigError(f"training: {exc}") from exc

    def lora_config(self) -> Any:
        """A ``peft.LoraConfig`` (task CAUSAL_LM) from the ``lora`` section, or None."""
        if self.lora is None:
            return None
        from peft import LoraConfig

        values = dict(self.lora)
        values.setdefault("task_type", "CAUSAL_LM")
        try:
            return LoraConfig(**values)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"lora: {exc}") from exc

    def to_dict(self) -> dict[str, Any]:
        """The YAML-able config (without internal fields)."""
        out = dataclasses.asdict(self)
        out.pop("source_path")
        return out


def _coerce_floats(cls: type, values: dict[str, Any]) -> dict[str, Any]:
    """'1e-5' -> 1e-05 for float fields: YAML 1.1 (PyYAML) reads exponents without a dot as strings."""
    types = {f.name: str(f.type) for f in dataclasses.fields(cls)}
    out = dict(values)
    for key, value in values.items():
        if isinstance(value, str) and "float" in types.get(key, ""):
            try:
                out[key] = float(value)
            except ValueError:
                pass
    return out


SECTIONS = {"env": EnvSection, "data": DataSection, "evaluation": EvaluationSection}


def _field_names(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls) if not f.metadata.get("internal")]


def _check_keys(mapping: Any, cls_or_names: Any, where: str) -> None:
    names = cls_or_names if isinstance(cls_or_names, list) else _field_names(cls_or_names)
    if mapping is None:
        return
    if not isinstance(mapping, dict):
        raise ConfigError(f"{where or 'config'}: expected a mapping, got {type(mapping).__name__} ({mapping!r}).")
    for key in mapping:
        if key not in names:
            path = f"{where}.{key}" if where else str(key)
            hint = suggest(str(key), names)
            hint = hint.replace("'", f"'{where}.", 1) if where and hint else hint
            listing = f" Valid keys{' of ' + where if where else ''}: {', '.join(names)}." if len(names) <= 16 else ""
            raise ConfigError(f"unknown key '{path}'.{hint}{listing}")


# --- loading ----------------------------------------------------------------------------------------


def parse_override(text: str) -> tuple[list[str], Any]:
    """'a.b=value' -> (['a', 'b'], yaml.safe_load('value'))."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--set {text!r}: expected KEY=VALUE, e.g. training.learning_rate=1e-5.")
    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError as exc:
        raise ConfigError(f"--set {text!r}: the value is not valid YAML: {exc}") from exc
    return key.strip().split("."), value


def apply_override(tree: dict, path: list[str], value: Any) -> None:
    """Set ``tree[path[0]][path[1]]... = value``, creating mappings on the way (list items by index)."""
    node: Any = tree
    for i, key in enumerate(path[:-1]):
        where = ".".join(path[: i + 1])
        if isinstance(node, list):
            node = node[_index(key, node, where)]
            continue
        if node.get(key) is None:
            node[key] = {}
        node = node[key]
        if not isinstance(node, (dict, list)):
            raise ConfigError(f"--set {'.'.join(path)}: '{where}' is {node!r}, not a mapping.")
    last = path[-1]
    if isinstance(node, list):
        node[_index(last, node, ".".join(path))] = value
    else:
        node[last] = value


def _index(key: str, items: list, where: str) -> int:
    if not key.isdigit() or int(key) >= len(items):
        raise ConfigError(f"--set {where}: '{key}' is not an index of a list of {len(items)} items.")
    return int(key)


_LOCAL_SUFFIXES = (".json", ".jsonl", ".parquet", ".gguf", ".csv", ".arrow")


def resolve_path(value: Any, base: Path) -> Any:
    """A relative local path -> absolute against ``base``; hub ids, 'embedded' and non-strings unchanged."""
    if not isinstance(value, str) or value == "embedded" or os.path.isabs(value):
        return value
    if value.startswith("~"):
        return os.path.expanduser(value)
    candidate = base / value
    if value.startswith(("./", "../")) or value.endswith(_LOCAL_SUFFIXES) or candidate.exists():
        return str(candidate.resolve())
    return value


def _resolve_paths(tree: dict, base: Path) -> None:
    """Resolve the path-valued keys of a raw config tree in place."""
    data = tree.get("data")
    if isinstance(data, dict):
        for key in ("source", "eval_source"):
            if key in data:
                data[key] = resolve_path(data[key], base)
    for key in ("model", "tokenizer"):
        if key in tree:
            value = tree[key]
            tree[key] = [resolve_path(v, base) for v in value] if isinstance(value, list) else resolve_path(value, base)
    if isinstance(tree.get("agents"), list):
        tree["agents"] = [resolve_path(v, base) for v in tree["agents"]]


def load_config(path: str | os.PathLike, overrides: list[str] | tuple[str, ...] = ()) -> RunConfig:
    """Read a YAML run config, apply ``--set`` overrides and validate it (no models or data are loaded).

    Paths in the file are resolved against the file's directory; paths in overrides against the
    working directory.
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist.")
    try:
        tree = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    if not isinstance(tree, dict):
        raise ConfigError(f"{path}: the top level must be a mapping, got {type(tree).__name__}.")
    _resolve_paths(tree, path.resolve().parent)
    for text in overrides:
        keys, value = parse_override(text)
        single = {}
        apply_override(single, keys, value)
        _resolve_paths(single, Path.cwd())
        apply_override(tree, keys, _get(single, keys))
    cfg = from_dict(tree)
    cfg.source_path = str(path.resolve())
    return cfg


def _get(tree: Any, keys: list[str]) -> Any:
    for k in keys:
        tree = tree[int(k)] if isinstance(tree, list) else tree[k]
    return tree


def from_dict(tree: dict) -> RunConfig:
    """Build and validate a :class:`RunConfig` from a plain (already path-resolved) mapping."""
    tree = copy.deepcopy(tree)
    _check_keys(tree, RunConfig, "")
    sections = {}
    for name, cls in SECTIONS.items():
        value = tree.pop(name, None)
        _check_keys(value, cls, name)
        sections[name] = cls(**(value or {}))
    resume = tree.get("resume", False)
    if resume not in (True, False, "auto", None):
        raise ConfigError(f"resume: expected true, false or auto, got {resume!r}.")
    tree["resume"] = bool(resume)
    cfg = RunConfig(**tree, **sections)
    validate(cfg)
    return cfg


def validate(cfg: RunConfig) -> None:
    """Check everything that can be checked without loading models or data."""
    algo = cfg.algo
    if not cfg.env.name:
        raise ConfigError("env.name is required (`comlrl envs` lists the environments).")
    _validate_env(cfg)
    if cfg.model is not None and cfg.agents is not None:
        raise ConfigError("set either model (copied into every agent) or agents (one per agent), not both.")
    if cfg.model is None and cfg.agents is None:
        raise ConfigError("no model: set model: embedded (or a local dir / hub id) or agents: [...].")
    if cfg.agents is not None:
        if not isinstance(cfg.agents, list) or not cfg.agents:
            raise ConfigError(f"agents: expected a non-empty list of model sources, got {cfg.agents!r}.")
        if cfg.num_agents not in (None, len(cfg.agents)):
            raise ConfigError(f"num_agents={cfg.num_agents} but agents lists {len(cfg.agents)} models.")
    if isinstance(cfg.tokenizer, list) and len(cfg.tokenizer) != cfg.team_size:
        raise ConfigError(f"tokenizer: {len(cfg.tokenizer)} entries for a team of {cfg.team_size}.")
    if not isinstance(cfg.training, dict):
        raise ConfigError(f"training: expected a mapping of trainer settings, got {cfg.training!r}.")
    config_cls = algo.config_class()
    _check_keys(cfg.training, _field_names(config_cls), "training")
    if "output_dir" in cfg.training:
        raise ConfigError("training.output_dir: set the top-level output_dir instead (the run directory).")
    args = cfg.trainer_config(env_defaults=_env_defaults(cfg.env))
    fixed = getattr(algo.trainer_class(), "fixed_advantage_mode", None)
    if fixed is not None and getattr(args, "advantage_mode", fixed) != fixed:
        raise ConfigError(
            f"training.advantage_mode={args.advantage_mode!r}: algorithm '{algo.name}' fixes it to "
            f"'{fixed}'; remove it or use algorithm: magrpo."
        )
    from .tracking import SINKS

    for sink in args.report_to:
        if sink not in SINKS + ("none", "jsonl"):
            raise ConfigError(
                f"training.report_to: unknown sink '{sink}'.{suggest(str(sink), list(SINKS))} "
                f"Available: {', '.join(SINKS)} (metrics.jsonl is always written)."
            )
    if cfg.data.eval_limit < 0 or (cfg.data.limit is not None and cfg.data.limit < 1):
        raise ConfigError("data.limit must be >= 1 (or null) and data.eval_limit >= 0.")
    if cfg.lora is not None:
        _validate_lora(cfg)
    if cfg.env.format == "single":
        _validate_single(cfg, args)
    if cfg.evaluation.compare:
        _validate_compare(cfg)


def _validate_compare(cfg: RunConfig) -> None:
    """evaluation.compare: known baselines, once each; the before and after evaluations it reuses."""
    from .envs.core.baselines import MODES

    modes = cfg.evaluation.compare
    if not isinstance(modes, list):
        raise ConfigError(f"evaluation.compare: expected a list of baselines (e.g. [single]), got {modes!r}.")
    for mode in modes:
        if mode not in MODES:
            raise ConfigError(
                f"evaluation.compare: unknown baseline {mode!r}.{suggest(str(mode), list(MODES))} "
                f"Available: {', '.join(MODES)}."
            )
        if modes.count(mode) > 1:
            raise ConfigError(f"evaluation.compare: {mode!r} is listed twice.")
    missing = [k for k in ("before", "after") if not getattr(cfg.evaluation, k)]
    if missing:
        raise ConfigError(
            f"evaluation.compare needs evaluation.{' and evaluation.'.join(missing)}: true (the comparison reuses the "
            "untrained and the trained team's evaluations), or remove evaluation.compare."
        )
    if not cfg.data.eval_limit:
        raise ConfigError("evaluation.compare needs evaluation rows: set data.eval_limit > 0.")


def _validate_env(cfg: RunConfig) -> None:
    from .envs import env_options, list_envs
    from .envs.core.single import FORMATS

    names = list_envs()
    if cfg.env.name not in names:
        raise ConfigError(
            f"env.name: unknown environment '{cfg.env.name}'.{suggest(cfg.env.name, names)} "
            f"Available: {', '.join(names)}."
        )
    valid = list(env_options(cfg.env.name))
    if not isinstance(cfg.env.options, dict):
        raise ConfigError(f"env.options: expected a mapping, got {cfg.env.options!r}.")
    _check_keys(cfg.env.options, valid, "env.options")
    if cfg.env.format not in FORMATS:
        raise ConfigError(
            f"env.format: unknown '{cfg.env.format}'.{suggest(str(cfg.env.format), list(FORMATS))} "
            f"Available: {', '.join(FORMATS)}."
        )


def _validate_single(cfg: RunConfig, args: TrainConfig) -> None:
    """env.format single: one decentralized agent, one turn."""
    if cfg.team_size != 1:
        field = f"agents lists {len(cfg.agents)} models" if cfg.agents is not None else f"num_agents={cfg.num_agents}"
        raise ConfigError(
            f"{field} with env.format: single: one model writes every part; set num_agents: 1 (or leave it out)."
        )
    if cfg.algo.name == "centralized_magrpo":
        raise ConfigError(
            "algorithm: centralized_magrpo with env.format: single: both make one model write every part; use "
            "env.format: team with centralized_magrpo, or algorithm: magrpo with env.format: single."
        )
    if getattr(args, "num_turns", 1) > 1:
        raise ConfigError(
            f"training.num_turns={args.num_turns} with env.format: single: the single-agent form is single-turn "
            "(a team's transition writes one prompt per agent); set training.num_turns: 1."
        )


def _env_defaults(env: EnvSection) -> dict:
    """The environment's suggested settings, as ``envs.make`` builds them for ``env.format``."""
    from .envs import ENVS
    from .envs.core.single import default_team_size, single_defaults

    cls = ENVS[env.name]
    defaults = dict(getattr(cls, "defaults", {}) or {})
    return single_defaults(defaults, default_team_size(cls)) if env.format == "single" else defaults


def _validate_lora(cfg: RunConfig) -> None:
    from peft import LoraConfig

    _check_keys(cfg.lora, [f.name for f in dataclasses.fields(LoraConfig)], "lora")
    cfg.lora_config()


def resolved(cfg: RunConfig, output_dir: str | None = None) -> dict[str, Any]:
    """The config as it will run: every section filled in, training with env defaults and all fields."""
    out = cfg.to_dict()
    if output_dir is not None:
        out["output_dir"] = output_dir
    args = cfg.trainer_config(env_defaults=_env_defaults(cfg.env))
    training = args.to_dict()
    training.pop("output_dir", None)
    out["training"] = training
    return out


def dump(tree: dict) -> str:
    """YAML text of a config tree (keys in schema order)."""
    return yaml.safe_dump(tree, sort_keys=False, default_flow_style=False, width=110)


def schema() -> dict[str, dict[str, str]]:
    """Section -> key -> help text, for ``comlrl train --help`` and the docs."""
    out = {
        "": {
            f.name: f.metadata.get("help", "") for f in dataclasses.fields(RunConfig) if not f.metadata.get("internal")
        }
    }
    for name, cls in SECTIONS.items():
        out[name] = {f.name: f.metadata.get("help", "") for f in dataclasses.fields(cls)}
    return out
