"""codetest's team reward: every program of a reward call in the sandbox, each assert classified by behaviour,
the levels (module docstring of :mod:`comlrl.envs.coding.codetest`)."""

from __future__ import annotations

import ast
import collections
import threading
from dataclasses import dataclass, field
from typing import Any

from ...errors import ComlrlError
from ...pyast import parse_quiet
from ..core.base import TeamReward
from .clean import clean_code, compiles
from .codetest_asserts import (
    AssertSet,
    Foil,
    classify_mutant,
    extract_asserts,
    hidden_assert_indices,
    make_foils,
    messages,
    self_compared,
    shared_reasons,
    statuses,
)
from .functions import run_sandboxed
from .mutants import Mutant, make_mutants
from .tasks import CodeTask, task_from_row

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


@dataclass(frozen=True, kw_only=True)
class MutantSet:
    """A problem's wrong functions: mutants and foils, after filtering on its hidden asserts."""

    mutants: tuple[Mutant, ...]
    candidates: int = 0
    equivalent: int = 0  # passed every hidden assert
    trivial: int = 0  # raised on every hidden assert
    dropped: int = 0  # timed out or failed to load
    hidden_ok: tuple[str, ...] = ()  # the hidden asserts that pass on the canonical solution (the filter)
    foils: tuple[Foil, ...] = ()  # every foil (they decide which asserts depend on the function)
    kept_foils: tuple[Foil, ...] = ()  # the foils that fail a hidden assert: wrong functions
    hidden_verdict: str = "strict"  # agent 1's hidden tests' verdict ('split' only if the canonical solution needs it)

    @property
    def judges(self) -> tuple[Mutant | Foil, ...]:
        """The wrong functions that a sharp assert must catch: the mutants, else the kept foils."""
        return self.mutants or self.kept_foils


# --- judgement ------------------------------------------------------------------------------------------


@dataclass(kw_only=True)
class CodeTestJudgement:
    """Everything known about one (function, tests) answer."""

    task: CodeTask
    code: str = ""  # agent 1's cleaned code
    program: str = ""  # context + agent 1's code ('' when the entry point is missing)
    main_found: bool = False
    syntax_error: str | None = None
    asserts: AssertSet = field(default_factory=lambda: AssertSet(tests=()))
    mutants: MutantSet | None = None
    hidden: list[str] = field(default_factory=list)  # status of each hidden test on agent 1's function
    hidden_shared: bool = False  # agent 1's hidden tests ran in one interpreter (the problem needs it)
    own: list[str] = field(default_factory=list)  # status of each parsed assert on agent 1's function
    on_canonical: list[str] = field(default_factory=list)  # status of each parsed assert on the canonical solution
    interpreter: list[bool] = field(default_factory=list)  # the assert passed the function non-data
    on_judges: list[list[str]] = field(default_factory=list)  # [judge][assert] statuses (mutants or foils)
    on_foils: list[list[str]] = field(default_factory=list)  # [foil][assert] (asserts not yet decided only)
    kind: list[str] = field(default_factory=list)  # each parsed assert: sharp/weak/invalid/uninformative/...
    invalid_messages: list[str] = field(default_factory=list)
    killed: list[bool] = field(default_factory=list)  # each judge, by the sharp asserts
    levels: dict[str, float] = field(default_factory=lambda: {k: 0.0 for k in CODETEST_LEVELS})
    run_status: str = ""  # agent 1's sandbox run status
    suspect: bool = False  # the sandbox saw signs of reward hacking in agent 1's run (SandboxResult.suspect)

    @property
    def reward(self) -> float:
        return sum(WEIGHTS[k] * v for k, v in self.levels.items())

    def tests_of(self, kind: str) -> list[str]:
        return [t for t, k in zip(self.asserts.tests, self.kind) if k == kind]

    @property
    def valid_tests(self) -> list[str]:
        """The sharp asserts: pass on the canonical solution and catch a wrong function (what agent 1 is held to)."""
        return self.tests_of("sharp")

    @property
    def valid(self) -> list[bool]:
        return [k in ("sharp", "weak") for k in self.kind]

    def classify(self) -> None:
        """Each parsed assert's kind (module docstring), then duplicates by behaviour."""
        judges = self.mutants.judges if self.mutants else ()
        seen: set[tuple] = set()
        self.kind = []
        for i, test in enumerate(self.asserts.tests):
            canonical = self.on_canonical[i] if i < len(self.on_canonical) else "missing"
            on_judges = [row[i] for row in self.on_judges]
            on_foils = [row[i] for row in self.on_foils if row[i] != "skipped"]
            if self.interpreter[i]:
                kind = "interpreter"
            elif canonical == "missing":
                kind = "invalid"
            elif self_compared(test):
                kind = "uninformative"
            elif canonical == "passed" and "failed" not in [*on_judges, *on_foils]:
                # no wrong function made its condition false: it only ever passed or raised (f(x)[0] == f(x)[:1]
                # raises on a function returning None), so it checks nothing about what the function returns
                kind = "uninformative"
            elif canonical != "passed":
                kind = "invalid"
            elif judges and _catches(on_judges, self.mutants):
                kind = "sharp"
            else:
                kind = "weak"
            key = (_calls_of(test, self.task.entry_point), canonical, tuple(on_judges))
            if kind in ("sharp", "weak", "invalid") and key in seen:
                kind = "repeated"  # the same calls with the same verdicts: one test, respelled
            seen.add(key)
            self.kind.append(kind)
        sharp = [i for i, k in enumerate(self.kind) if k == "sharp"]
        self.killed = [any(row[i] != "passed" for i in sharp) for row in self.on_judges]

    def finish(self) -> None:
        """The levels from what was run (module docstring)."""
        lv = self.levels
        lv["level/defined"] = float(self.main_found)
        lv["level/syntax"] = float(self.main_found and self.syntax_error is None)
        if lv["level/syntax"] and self.hidden:
            lv["level/hidden_tests"] = sum(s == "passed" for s in self.hidden) / len(self.hidden)
        counts = collections.Counter(self.kind)
        lv["level/tests_written"] = float(counts["sharp"] + counts["weak"] + counts["invalid"] > 0)
        judged = counts["sharp"] + counts["invalid"]
        if not lv["level/tests_written"] or not judged:
            return
        lv["level/tests_valid"] = counts["sharp"] / judged
        if not counts["sharp"]:
            return
        lv["level/mutants_killed"] = sum(self.killed) / len(self.killed)
        if lv["level/syntax"]:
            lv["level/agreement"] = self.agreement

    @property
    def agreement(self) -> float:
        """Fraction of the sharp asserts agent 1's function passes (0 when there is none or no program)."""
        mine = [s for s, k in zip(self.own, self.kind) if k == "sharp"]
        return sum(s == "passed" for s in mine) / len(mine) if mine else 0.0

    def scores(self) -> dict[str, float]:
        counts = collections.Counter(self.kind)
        counted = counts["sharp"] + counts["weak"] + counts["invalid"]
        n_valid = counts["sharp"] + counts["weak"]
        n_mutants = len(self.mutants.mutants) if self.mutants else 0
        judges = len(self.mutants.judges) if self.mutants else 0
        return {
            "reward": self.reward,
            **self.levels,
            "metric/pass": float(bool(self.hidden) and all(s == "passed" for s in self.hidden)),
            "metric/n_tests": float(counted),
            "metric/n_valid": float(n_valid),
            "metric/n_sharp": float(counts["sharp"]),
            "metric/valid_fraction": n_valid / counted if counted else 0.0,
            "metric/kill_fraction": sum(self.killed) / judges if judges and counts["sharp"] else 0.0,
            "metric/n_mutants": float(n_mutants),
            "metric/n_foils": float(len(self.mutants.kept_foils) if self.mutants else 0),
            "metric/foil_judged": float(bool(self.mutants and not n_mutants and self.mutants.kept_foils)),
            "metric/unjudged": float(bool(self.mutants) and not self.mutants.judges),
            "metric/n_equivalent": float(self.mutants.equivalent if self.mutants else 0),
            "metric/duplicates": float(self.asserts.duplicates + counts["repeated"]),
            "metric/not_calling": float(self.asserts.not_calling),
            "metric/uninformative": float(counts["uninformative"]),
            "metric/needs_interpreter": float(self.asserts.interpreter + counts["interpreter"]),
            "metric/agreement": self.agreement,
            "metric/suspect": float(self.suspect),
            "metric/verdict_shared": float(self.hidden_shared),
        }


def _catches(statuses_on_judges: list[str], mutants: MutantSet) -> bool:
    """A valid assert is sharp when it fails on a mutant; where foils judge, on a changed-result foil (one that
    returns a value of the right type: a check such as ``is not None`` that only the constant foils fail is weak)."""
    if mutants.mutants:
        return any(s != "passed" for s in statuses_on_judges)
    return any(s != "passed" for s, foil in zip(statuses_on_judges, mutants.judges) if foil.changed)


def _undecided(j: CodeTestJudgement) -> tuple[str, ...]:
    """The asserts that passed on the canonical solution and whose condition no judge made false: the other foils decide
    whether they test anything."""
    return tuple(
        t
        for i, t in enumerate(j.asserts.tests)
        if j.on_canonical[i] == "passed" and not j.interpreter[i] and all(row[i] != "failed" for row in j.on_judges)
    )


def _calls_of(test: str, entry_point: str) -> tuple[str, ...]:
    """The distinct calls of the entry point in an assert (their argument trees), sorted."""
    tree = parse_quiet(test)
    if tree is None:
        return (test,)
    calls = {
        ast.dump(ast.Call(func=ast.Name(entry_point), args=n.args, keywords=n.keywords))
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == entry_point
    }
    return tuple(sorted(calls))


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
    def _job(self, program: str, tests: list[str] | tuple[str, ...], task: CodeTask, verdict: str = "split") -> dict:
        from ...sandbox import SandboxLimits

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
            "verdict": verdict,
        }

    def _run(self, jobs: dict[tuple, dict]) -> dict[tuple, Any]:
        keys = list(jobs)
        return dict(zip(keys, run_sandboxed([jobs[k] for k in keys], self.max_workers)))

    @staticmethod
    def _mutant_key(task: CodeTask) -> tuple:
        return (task.canonical_solution, task.tests, task.setup, task.entry_point)

    def mutants_for(self, tasks: list[CodeTask]) -> dict[tuple, MutantSet]:
        """Each problem's filtered mutants and foils (computed in the sandbox once per problem, then cached)."""
        todo = {}
        with self._lock:
            for task in tasks:
                key = self._mutant_key(task)
                if key not in self._mutants:
                    todo[key] = task
        if todo:
            # 1. the canonical solution against every hidden test (which pass; whether they need one interpreter);
            # 2. every candidate mutant and foil against the hidden asserts that pass on the canonical solution.
            picked = {key: hidden_assert_indices(task, self.max_tests) for key, task in todo.items()}
            canonical_results = self._run(
                {key: self._job(task.canonical_solution, task.tests, task, "split") for key, task in todo.items()}
            )
            filters: dict[tuple, tuple[str, ...]] = {}
            verdicts: dict[tuple, str] = {}
            candidates: dict[tuple, list[Mutant]] = {}
            foils = {key: make_foils(task.entry_point, task.canonical_solution) for key, task in todo.items()}
            jobs = {}
            for key, task in todo.items():
                result = canonical_results[key]
                status = statuses(result, len(task.tests))
                filters[key] = tuple(task.tests[i].strip() for i in picked[key] if status[i] == "passed")
                verdicts[key] = "split" if result is not None and result.info.get("verdict") == "shared" else "strict"
                candidates[key] = (
                    make_mutants(task.canonical_solution, limit=3 * self.max_mutants) if filters[key] else []
                )
                for i, mutant in enumerate(candidates[key]):
                    jobs[(key, i)] = self._job(mutant.source, filters[key], task)
                for foil in foils[key] if filters[key] else ():
                    jobs[(key, foil.name)] = self._job(foil.source, filters[key], task)
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
                kept_foils = tuple(
                    f
                    for f in foils[key]
                    if (key, f.name) in results
                    and classify_mutant(results[(key, f.name)], len(filters[key])) in ("kept", "trivial")
                )
                computed[key] = MutantSet(
                    mutants=tuple(kept),
                    candidates=len(candidates[key]),
                    equivalent=counts["equivalent"],
                    trivial=counts["trivial"],
                    dropped=counts["dropped"],
                    hidden_ok=filters[key],
                    foils=foils[key],
                    kept_foils=kept_foils,
                    hidden_verdict=verdicts[key],
                )
            with self._lock:
                self._mutants.update(computed)
        with self._lock:
            return {self._mutant_key(t): self._mutants[self._mutant_key(t)] for t in tasks}

    # --- judging -------------------------------------------------------------------------------------
    def _static(self, task: CodeTask, code_answer: str, test_answer: str) -> CodeTestJudgement:
        j = CodeTestJudgement(task=task)
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
        """Judge L joint answers; two parallel sandbox rounds: (agent 1, canonical solution) and then the mutants."""
        n = len(rows)
        tasks = [task_from_row(r) for r in rows]
        for task in tasks:
            if not task.canonical_solution.strip():
                raise ComlrlError(
                    f"codetest: problem {task.task_id!r} has no canonical solution (MBPP 'code' or HumanEval "
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
        """Round 1: agent 1 on the hidden tests (its own job) and on the asserts, the canonical solution and each wrong
        function on the asserts (all model-written tests in the strict verdict). Round 2: the other foils on the
        asserts that nothing failed yet (do they depend on the function at all?)."""
        mutant_sets = self.mutants_for([j.task for j in js])
        jobs: dict[tuple, dict] = {}
        for j in js:
            ms = j.mutants = mutant_sets[self._mutant_key(j.task)]
            tests, task = j.asserts.tests, j.task
            if j.main_found and j.syntax_error is None:
                jobs[("hidden", j.program, task)] = self._job(j.program, task.tests, task, ms.hidden_verdict)
                if tests:
                    jobs[("own", j.program, tests, task)] = self._job(j.program, tests, task, "strict")
            if tests:
                for source in (task.canonical_solution, *(w.source for w in ms.judges)):
                    jobs[("on", source, tests, task)] = self._job(source, tests, task, "strict")
        results = self._run(jobs)
        foil_jobs: dict[tuple, dict] = {}
        for j in js:
            tests, task, n = j.asserts.tests, j.task, len(j.asserts.tests)
            hidden = results.get(("hidden", j.program, task))
            if hidden is not None:
                j.hidden, j.run_status = statuses(hidden, len(task.tests)), hidden.status
                j.suspect = bool(getattr(hidden, "suspect", None))
                j.hidden_shared = hidden.info.get("verdict") == "shared"
            elif j.main_found and j.syntax_error is None:
                j.hidden = ["missing"] * len(task.tests)
            if not tests:
                j.classify()
                continue
            own = results.get(("own", j.program, tests, task))
            j.own = statuses(own, n) if own is not None else ["missing"] * n
            canonical = results[("on", task.canonical_solution, tests, task)]
            j.on_canonical = statuses(canonical, n)
            j.invalid_messages = messages(canonical, n)
            on_judges = [results[("on", w.source, tests, task)] for w in j.mutants.judges]
            j.on_judges = [statuses(r, n) for r in on_judges]
            # an assert that passed the canonical solution or a wrong function non-data needs an interpreter: uncounted
            j.interpreter = [any(r) for r in zip(*(shared_reasons(r, n) for r in (canonical, *on_judges)))]
            undecided = _undecided(j)
            if undecided:
                for foil in j.mutants.foils:
                    if foil not in j.mutants.judges:
                        foil_jobs[("foil", foil.source, undecided, task)] = self._job(
                            foil.source, undecided, task, "strict"
                        )
        foil_results = self._run(foil_jobs)
        for j in js:
            if not j.asserts.tests:
                j.finish()
                continue
            undecided = _undecided(j)
            j.on_foils = []
            for foil in j.mutants.foils:
                key = ("foil", foil.source, undecided, j.task)
                if key in foil_results:
                    got = dict(zip(undecided, statuses(foil_results[key], len(undecided))))
                    j.on_foils.append([got.get(t, "skipped") for t in j.asserts.tests])
            j.classify()
            j.invalid_messages = [m for m, k in zip(j.invalid_messages, j.kind) if k == "invalid"]
            j.finish()

    def score_batch(self, agent_completions: list[list[str]], rows: list[dict]) -> list[dict[str, float]]:
        return [j.scores() for j in self.judge(agent_completions, rows)]
