"""Class completion by a team: ``classeval``.

Input: a class skeleton (imports, class docstring, constructor, method signatures + docstrings). The
methods to implement are split between the agents by a strategy (``make("classeval", split=...)``):

* ``params`` (default with 2 agents): methods with exactly one parameter besides ``self`` go to
  agent 1, the others to agent 2 (when one side would be empty, ``alternate`` is used instead);
* ``alternate`` (default with N != 2 agents; alias ``round_robin``): method i goes to agent i mod N;
* ``contiguous``: the methods in order, cut into N nearly equal blocks.

Each agent implements only its methods (it sees the whole skeleton). Its answer is parsed into method
definitions (inside a ``class`` block or bare, fences and prose removed). The team program is the
skeleton's imports + the agents' module-level imports/helpers + the class with the skeleton's
constructor and, for every method, the owner's valid implementation (else another agent's valid one,
else a stub that raises ``NotImplementedError``); it runs with the class's unit tests in the sandbox.

Team reward (maximum 6.0; 0 when the merged class does not compile)::

    2 x (fraction of methods with a syntactically valid implementation)
  + 4 x (fraction of unit tests passed)
  - (fraction of methods implemented by more than one agent)

Score keys: ``level/parse`` (the merged class compiles), ``level/methods_valid``, ``level/tests``,
``level/overlap`` (the penalised fraction); ``metric/pass`` (all tests pass), ``metric/n_methods``,
``metric/suspect`` and ``metric/verdict_shared`` (as for the code environments: signs of reward hacking
the sandbox's judge saw; tests that had to run in the program's own interpreter).
Tests are not run when no method has a valid implementation (an empty answer scores 0).
"""

from __future__ import annotations

import ast
import collections
import re
import textwrap
import threading
from dataclasses import dataclass, field
from typing import Any

import datasets

from ...errors import ComlrlError
from ...pyast import parse_quiet
from ..core.base import Env, Formatter, TeamReward, summarize_scores
from ..core.feedback import MAX_FAILURES, TRANSITION_MODES, revision_prompt
from ..core.loaders import load_rows
from ..core.packaged import PACKAGED
from ..core.registry import register
from .clean import clean_code, compiles, is_stub, normalize_text, split_chunks, strip_fences
from .functions import run_sandboxed, sandbox_metrics
from .tasks import check_solution_field

SPLITS = ("params", "alternate", "round_robin", "contiguous")
CLASS_LEVELS = ("level/parse", "level/methods_valid", "level/tests", "level/overlap")
_METHOD_DEF = re.compile(
    r"^(?:@[\w.]+(?:\(.*\))?\s*\n\s*)*(?:async\s+)?def\s+(\w+)\s*\(.*?\)\s*(?:->\s*[^:\n]+)?:", re.S
)


@dataclass(frozen=True, kw_only=True)
class Method:
    """A method to implement: name, signature line(s) (with decorators) and docstring text."""

    name: str
    signature: str
    description: str
    params: int  # parameters besides self / cls


@dataclass(frozen=True, kw_only=True)
class ClassTask:
    """One ClassEval problem, ready to merge and test a team's methods."""

    task_id: str
    skeleton: str
    class_name: str
    imports: str
    constructor: str  # the __init__ method source, dedented ('' when none)
    methods: tuple[Method, ...]
    test: str
    canonical_solution: str  # the whole class (ClassEval's ``solution_code``)


def count_params(signature: str) -> int:
    """Parameters of a ``def`` line besides a leading ``self``/``cls`` (``*args``/``**kw`` not counted)."""
    tree = parse_quiet(textwrap.dedent(signature).strip() + "\n    pass")
    if tree is None or not tree.body or not isinstance(tree.body[0], (ast.FunctionDef, ast.AsyncFunctionDef)):
        inner = signature[signature.find("(") + 1 : signature.rfind(")")]
        names = [p.strip() for p in inner.split(",") if p.strip() and not p.strip().startswith("*")]
        return len(names) - (1 if names and names[0].split(":")[0] in ("self", "cls") else 0)
    args = tree.body[0].args
    names = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs]
    return len(names) - (1 if names and names[0] in ("self", "cls") else 0)


def _method_from_description(name: str, description: str) -> Method:
    match = _METHOD_DEF.search(description.lstrip())
    raw = match.group(0) if match else f"def {name}(self, *args, **kwargs):"
    signature = "\n".join(line.strip() for line in raw.split("\n"))  # decorators and def at column 0
    return Method(name=name, signature=signature, description=description, params=count_params(signature))


def _methods_from_skeleton(skeleton: str) -> list[dict]:
    """``methods_info``-like entries read from the skeleton text (which may not parse)."""
    out = []
    for match in re.finditer(
        r"^    ((?:@\w+\s*\n    )*def\s+(\w+)\s*\(.*?\)\s*(?:->\s*[^:\n]+)?:)", skeleton, re.M | re.S
    ):
        if match.group(2) != "__init__":
            out.append({"method_name": match.group(2), "method_description": match.group(1)})
    return out


def _constructor(row: dict) -> str:
    text = str(row.get("class_constructor") or "")
    if not text.strip():
        match = re.search(r"^(    def __init__\(.*?)(?=^    (?:@|def )|\Z)", str(row["skeleton"]), re.M | re.S)
        text = "class X:\n" + (match.group(1) if match else "")
    body = text.split("\n", 1)[1] if "\n" in text else ""
    return textwrap.dedent(body).strip("\n")


def normalize_classeval_row(row: dict, index: int) -> dict:
    """A ClassEval row (``skeleton``, ``test``, optional ``methods_info``, ``class_name``, ...) normalised."""
    check_solution_field(row, "classeval", index)
    skeleton = str(row["skeleton"])
    class_name = str(row.get("class_name") or (re.search(r"^class\s+(\w+)", skeleton, re.M) or [None, ""])[1])
    if not class_name:
        raise ValueError("no class_name and no 'class' line in the skeleton")
    info = row.get("methods_info") or _methods_from_skeleton(skeleton)
    methods = [_method_from_description(str(m["method_name"]), str(m.get("method_description") or "")) for m in info]
    if not methods:
        raise ValueError("no methods to implement (methods_info is empty and the skeleton has no methods)")
    imports = row.get("import_statement") or []
    return {
        "task_id": str(row.get("task_id", index)),
        "skeleton": skeleton,
        "class_name": class_name,
        "imports": "\n".join(imports) if isinstance(imports, list) else str(imports),
        "constructor": _constructor(row),
        "methods": [{"name": m.name, "signature": m.signature, "params": m.params} for m in methods],
        "test": str(row["test"]),
        "canonical_solution": str(row.get("solution_code") or row.get("canonical_solution") or ""),
    }


def task_from_row(row: dict) -> ClassTask:
    """The :class:`ClassTask` of a raw or normalised ClassEval row."""
    check_solution_field(row, "classeval")
    try:
        norm = row if "constructor" in row and "methods" in row else normalize_classeval_row(row, 0)
    except KeyError as exc:
        raise ComlrlError(
            f"classeval row {row.get('task_id', '?')!r} is missing the field {exc} (needs skeleton and test); "
            "load rows with env.load_dataset()."
        ) from exc
    methods = tuple(
        Method(name=m["name"], signature=m["signature"], description="", params=int(m["params"]))
        for m in norm["methods"]
    )
    return ClassTask(
        task_id=norm["task_id"],
        skeleton=norm["skeleton"],
        class_name=norm["class_name"],
        imports=norm["imports"],
        constructor=norm["constructor"],
        methods=methods,
        test=norm["test"],
        canonical_solution=norm["canonical_solution"],
    )


def assign_methods(methods: tuple[Method, ...], num_agents: int, strategy: str) -> list[list[str]]:
    """Method names owned by each agent under ``strategy`` (see the module docstring)."""
    names = [m.name for m in methods]
    if num_agents == 1:
        return [names]
    if strategy == "params":
        if num_agents != 2:
            raise ValueError(f"classeval: split='params' is defined for 2 agents, got {num_agents}; use 'alternate'.")
        groups = [[m.name for m in methods if m.params == 1], [m.name for m in methods if m.params != 1]]
        if all(groups):
            return groups
        strategy = "alternate"
    if strategy in ("alternate", "round_robin"):
        return [names[i::num_agents] for i in range(num_agents)]
    if strategy == "contiguous":
        size, extra = divmod(len(names), num_agents)
        out, start = [], 0
        for i in range(num_agents):
            end = start + size + (1 if i < extra else 0)
            out.append(names[start:end])
            start = end
        return out
    raise ValueError(f"classeval: unknown split '{strategy}'; choose one of {', '.join(SPLITS)}.")


# --- parsing an agent's answer ------------------------------------------------------------------------


@dataclass
class ParsedAnswer:
    """Method definitions and module-level code found in one agent's answer."""

    methods: dict[str, tuple[str, bool]] = field(default_factory=dict)  # name -> (dedented source, valid)
    module: str = ""  # imports, helper functions, constants outside the class


def _split_class(text: str) -> tuple[str, str]:
    """(class body dedented, module-level text) for the first ``class`` block, or ('', text) without one."""
    lines = text.split("\n")
    start = next((i for i, ln in enumerate(lines) if re.match(r"^class\s+\w+", ln)), None)
    if start is None:
        return "", text
    end = next((i for i in range(start + 1, len(lines)) if lines[i].strip() and not lines[i][0].isspace()), len(lines))
    body = textwrap.dedent("\n".join(lines[start + 1 : end]))
    return body, "\n".join(lines[:start] + lines[end:])


def _dedent_methods(code: str) -> str:
    """Remove the indentation of bare methods written as if inside a class; prose lines stay as they are."""
    indents = [len(ln) - len(ln.lstrip()) for ln in code.split("\n") if re.match(r"^\s*(@|def\s|async\s+def\s)", ln)]
    cut = min(indents) if indents else 0
    if cut == 0:
        return code
    return "\n".join(ln[cut:] if ln[:cut].isspace() else ln for ln in code.split("\n"))


def parse_answer(text: str) -> ParsedAnswer:
    """Methods (bare or inside a ``class`` block) and module-level code of one answer."""
    code, _ = strip_fences(normalize_text(text))
    body, module = _split_class(code)
    if not body:  # no class block: methods written bare (possibly indented as in a class)
        body, module = _dedent_methods(code), ""
    out = ParsedAnswer()
    for chunk in split_chunks(body):
        match = _METHOD_DEF.match(chunk.lstrip())
        if match is None:
            continue
        tree = parse_quiet(chunk)
        node = tree.body[0] if tree is not None and len(tree.body) == 1 else None
        valid = isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not is_stub(node)
        if tree is not None and node is not None and is_stub(node):
            continue  # the skeleton's stub echoed back: not an implementation
        out.methods[match.group(1)] = (chunk, valid)
    if module.strip():
        cleaned = clean_code(module)
        keep = [c for c in cleaned.chunks if not re.match(r"^\s*(@|def\s+\w+\s*\(\s*self\b)", c)]
        out.module = "\n\n".join(keep)
    return out


# --- merging and scoring -------------------------------------------------------------------------------


@dataclass(kw_only=True)
class ClassJudgement:
    """One joint answer: which methods are valid and shared, the merged program, the sandbox result."""

    task: ClassTask
    owners: list[list[str]]
    program: str = ""
    valid: dict[str, bool] = field(default_factory=dict)
    implementers: dict[str, list[int]] = field(default_factory=dict)
    syntax_error: str | None = None
    result: Any = None
    answers: list[ParsedAnswer] = field(default_factory=list)

    def scores(self) -> dict[str, float]:
        n = len(self.task.methods)
        valid = sum(self.valid.values()) / n
        overlap = sum(len(v) > 1 for v in self.implementers.values()) / n
        tests = self.result.fraction_passed if self.result is not None else 0.0
        parse = float(self.syntax_error is None and bool(self.program))
        reward = parse * (2.0 * valid + 4.0 * tests - overlap)
        return {
            "reward": reward,
            "level/parse": parse,
            "level/methods_valid": valid * parse,
            "level/tests": tests * parse,
            "level/overlap": overlap * parse,
            "metric/pass": float(bool(parse and self.result is not None and self.result.all_passed)),
            "metric/n_methods": float(n),
            **sandbox_metrics(self.result),
        }


def _stub(method: Method) -> str:
    return f"{method.signature}\n    raise NotImplementedError"


def merge_class(task: ClassTask, owners: list[list[str]], answers: list[ParsedAnswer]) -> ClassJudgement:
    """The team program: skeleton imports + agents' module code + the class with the chosen methods."""
    j = ClassJudgement(task=task, owners=owners, answers=answers)
    owner_of = {name: i for i, names in enumerate(owners) for name in names}
    methods_src = []
    for method in task.methods:
        j.implementers[method.name] = [i for i, a in enumerate(answers) if method.name in a.methods]
        order = [owner_of.get(method.name, 0)] + [i for i in range(len(answers)) if i != owner_of.get(method.name, 0)]
        chosen = next(
            (answers[i].methods[method.name][0] for i in order if answers[i].methods.get(method.name, ("", False))[1]),
            None,
        )
        j.valid[method.name] = chosen is not None
        methods_src.append(chosen if chosen is not None else _stub(method))
    # Extra helper methods (first valid definition of each name wins); ``__init__`` only when the skeleton has none.
    known = {m.name for m in task.methods} | ({"__init__"} if task.constructor.strip() else set())
    for answer in answers:
        for name, (src, ok) in answer.methods.items():
            if name not in known and ok:
                methods_src.append(src)
                known.add(name)
    module = list(dict.fromkeys(a.module for a in answers if a.module.strip()))
    body = [task.constructor] if task.constructor.strip() else []
    body += methods_src
    class_src = f"class {task.class_name}:\n" + "\n\n".join(textwrap.indent(b.strip("\n"), "    ") for b in body)
    j.program = "\n\n".join(p for p in [task.imports, *module, class_src] if p.strip()) + "\n"
    j.syntax_error = compiles(j.program)
    return j


class ClassEvalReward(TeamReward):
    """ClassEval team reward (module docstring); runs a batch's merged classes in parallel."""

    level_names = CLASS_LEVELS
    max_reward = 6.0

    def __init__(self, num_agents: int, name: str, *, split: str, test_timeout: float, max_workers: int | None) -> None:
        super().__init__(num_agents, name)
        self.split, self.test_timeout, self.max_workers = split, test_timeout, max_workers
        self._cache: collections.OrderedDict[tuple, ClassJudgement] = collections.OrderedDict()
        self._lock = threading.Lock()

    def judge(self, agent_completions: list[list[str]], rows: list[dict]) -> list[ClassJudgement]:
        """Merge each joint answer, then run every merged class that needs testing at once."""
        judgements, pending = [], {}
        for idx, row in enumerate(rows):
            task = task_from_row(row)
            answers = tuple(c[idx] for c in agent_completions)
            with self._lock:
                cached = self._cache.get((task, answers))
            if cached is None:
                cached = merge_class(
                    task, assign_methods(task.methods, self.num_agents, self.split), [parse_answer(a) for a in answers]
                )
                if cached.syntax_error is None and any(cached.valid.values()):
                    pending.setdefault((task, cached.program), []).append(idx)
            judgements.append(cached)
        jobs = [{"program": p, "tests": t.test, "kind": "unittest", "limits": self._limits(t)} for t, p in pending]
        for indices, result in zip(pending.values(), run_sandboxed(jobs, self.max_workers)):
            for idx in indices:
                judgements[idx].result = result
        with self._lock:
            for idx, j in enumerate(judgements):
                self._cache[(j.task, tuple(c[idx] for c in agent_completions))] = j
            while len(self._cache) > 2048:
                self._cache.popitem(last=False)
        return judgements

    def _limits(self, task: ClassTask) -> Any:
        from ...sandbox import SandboxLimits

        # Whole-run budget: generous for correct classes, bounded for ones that loop in every test.
        wall = max(30.0, 3.0 * self.test_timeout)
        return SandboxLimits(per_test_timeout=self.test_timeout, timeout=wall, cpu_seconds=int(wall))

    def score_batch(self, agent_completions: list[list[str]], rows: list[dict]) -> list[dict[str, float]]:
        return [j.scores() for j in self.judge(agent_completions, rows)]


def class_feedback(j: ClassJudgement, mode: str) -> str:
    """Feedback text on a merged class (same modes as the code tasks)."""
    if mode == "plain":
        return ""
    passed = j.result is not None and j.result.all_passed
    if mode == "passed":
        return "All tests passed." if passed else "The merged class does not pass all tests yet."
    detailed = mode == "level_feedback"
    lines = [
        "- Merged class compiles: "
        + ("yes" if j.syntax_error is None else f"NO {j.syntax_error if detailed else ''}".rstrip())
    ]
    missing = [m for m, ok in j.valid.items() if not ok]
    lines.append(
        f"- Methods implemented validly: {sum(j.valid.values())}/{len(j.valid)}"
        + (f" (missing or invalid: {', '.join(missing)})" if detailed and missing else "")
    )
    shared = [m for m, who in j.implementers.items() if len(who) > 1]
    if shared:
        lines.append(f"- Implemented by more than one agent: {', '.join(shared)}")
    if j.result is not None:
        lines.append(f"- Tests: {j.result.n_passed}/{j.result.n_total} passed")
        if detailed:
            failures = [t for t in j.result.tests if t.status != "passed"]
            lines += [f"  - {t.status.upper()}: {t.name} -> {t.message.strip()[:300]}" for t in failures[:MAX_FAILURES]]
            if j.result.status != "ok" and not j.result.tests:
                lines.append(
                    f"  - the class failed to load ({j.result.status}): {(j.result.message or j.result.stderr)[:300]}"
                )
    return "\n".join(lines)


@register("classeval")
class ClassEvalEnv(Env):
    """ClassEval: complete a class skeleton, its methods split between the agents."""

    name = "classeval"
    description = "class skeleton; methods split between agents"
    defaults = {"max_new_tokens": 1024, "num_turns": 1}
    hub_id = "FudanSELab/ClassEval"
    default_data = f"{PACKAGED['classeval'].describe()}; online: source={hub_id}"

    def __init__(
        self,
        num_agents: int = 2,
        *,
        split: str | None = None,
        transition: str = "level_feedback",
        test_timeout: float = 10.0,
        max_workers: int | None = None,
    ) -> None:
        super().__init__(num_agents)
        split = split or ("params" if num_agents == 2 else "alternate")
        if split not in SPLITS:
            raise ValueError(f"classeval: unknown split '{split}'; choose one of {', '.join(SPLITS)}.")
        if split == "params" and num_agents not in (1, 2):
            raise ValueError(
                f"classeval: split='params' is defined for 2 agents, got num_agents={num_agents}; use 'alternate'."
            )
        if transition not in TRANSITION_MODES:
            raise ValueError(
                f"classeval: unknown transition '{transition}'; choose one of {', '.join(TRANSITION_MODES)}."
            )
        self.split, self.transition = split, transition
        self.reward_func = ClassEvalReward(
            num_agents, self.name, split=split, test_timeout=test_timeout, max_workers=max_workers
        )
        self.external_transition = self._transition

    def owners(self, row: dict) -> list[list[str]]:
        """Method names each agent implements for this row."""
        return assign_methods(task_from_row(row).methods, self.num_agents, self.split)

    def roles(self) -> list[str]:
        return [f"agent {i + 1}'s share of the methods" for i in range(self.num_agents)]

    def _agent_prompt(self, row: dict, agent: int) -> str:
        task, owners = task_from_row(row), self.owners(row)
        mine = ", ".join(f"`{m}`" for m in owners[agent]) or "(none)"
        others = [m for i, names in enumerate(owners) if i != agent for m in names]
        team = (
            f" Teammates implement the other methods ({', '.join(f'`{m}`' for m in others)}); you may call them."
            if others
            else ""
        )
        return (
            f"You are completing the Python class `{task.class_name}` with a team. "
            f"Implement ONLY these methods: {mine}."
            f"{team}\n\nClass skeleton:\n```python\n{task.skeleton.strip()}\n```\n\n"
            "Reply with only the Python code of your methods (each `def` with its full body), no explanation."
        )

    def formatters(self) -> list[Formatter]:
        def make_formatter(agent: int) -> Formatter:
            return lambda row: self._agent_prompt(row, agent)

        return [make_formatter(i) for i in range(self.num_agents)]

    def single_formatter(self) -> Formatter:
        def format_prompt(row: dict) -> str:
            task = task_from_row(row)
            return (
                f"Complete the Python class `{task.class_name}`: implement every method.\n\nClass skeleton:\n"
                f"```python\n{task.skeleton.strip()}\n```\n\nReply with only the Python code of the completed class."
            )

        return format_prompt

    def split_single(self, answer: str, row: dict) -> list[str]:
        """The whole class goes to the last agent (the merge takes each method from whoever wrote it)."""
        return [""] * (self.num_agents - 1) + [answer]

    def _transition(self, *, batch_item: dict, agent_completions: list[str], turn: int = 1, **kwargs: Any) -> list[str]:
        """Next prompts: each agent's prompt, its previous answer and feedback on the merged class."""
        [j] = self.reward_func.judge([[c] for c in agent_completions], [batch_item])
        feedback = class_feedback(j, self.transition)
        return [
            revision_prompt(
                fmt(batch_item),
                agent_completions[i],
                feedback,
                "Revise your methods and reply with only their Python code.",
            )
            for i, fmt in enumerate(self.formatters())
        ]

    def evaluate(self, agent_completions: list[list[str]], batch_items: list[dict]) -> dict[str, float]:
        """``summarize_scores`` plus ``pass@1`` (every unit test passes)."""
        out = summarize_scores(self.reward_func.score(*agent_completions, batch_items=batch_items))
        out["pass@1"] = out.get("metric/pass", 0.0)
        return out

    def load_dataset(self, source: Any = None, split: str = "test", limit: int | None = None) -> datasets.Dataset:
        """ClassEval rows (``skeleton``, ``test``; ``methods_info``, ``class_name``, ``class_constructor``,
        ``import_statement``, ``solution_code`` optional) from a local JSON file or a hub id
        (``FudanSELab/ClassEval``). None reads the 100 classes shipped with the package (split ``test``,
        :mod:`.packaged`), never the network; the source used is logged at INFO."""
        return load_rows(
            source,
            split=split,
            limit=limit,
            required=["skeleton", "test"],
            normalize=normalize_classeval_row,
            default=PACKAGED[self.name].rows,
            default_label=PACKAGED[self.name].label,
            env_name=self.name,
        )
