"""Feedback text for multi-turn code tasks: what the next prompt says about the team's program.

Modes (``make("humaneval", transition=...)``):

* ``level_feedback`` (default): each reward level, the syntax error, each failing test with its
  message (the first ``MAX_FAILURES``), and how the entry point uses the helpers;
* ``level_passed``: which levels passed, without messages;
* ``passed``: only whether all tests passed;
* ``plain``: no feedback, just the request to revise.

The next prompt (:func:`revision_prompt`) repeats the agent's original prompt, shows its previous
answer and the feedback, and asks for a revision.
"""

from __future__ import annotations

from typing import Any

TRANSITION_MODES = ("level_feedback", "level_passed", "passed", "plain")
MAX_FAILURES = 5
MAX_MESSAGE = 300
MAX_PREVIOUS = 4000


def _clip(text: str, limit: int = MAX_MESSAGE) -> str:
    text = " ".join(text.split()) if "\n" not in text.strip() else text.strip()
    return text if len(text) <= limit else text[:limit] + "..."


def _test_lines(judgement: Any) -> list[str]:
    result, tests = judgement.result, judgement.task.tests
    if result is None:
        return []
    lines = [f"- Tests: {result.n_passed}/{result.n_total} passed"]
    if result.status not in ("ok",) and not result.tests:
        lines.append(
            f"  - the program failed before any test ran ({result.status}): {_clip(result.message or result.stderr)}"
        )
    failures = [t for t in result.tests if t.status != "passed"]
    for outcome in failures[:MAX_FAILURES]:
        index = _test_index(outcome.name)
        source = tests[index] if index is not None and index < len(tests) else outcome.name
        lines.append(f"  - {outcome.status.upper()}: {_clip(source, 200)} -> {_outcome_text(outcome, source)}")
    if len(failures) > MAX_FAILURES:
        lines.append(f"  - ... and {len(failures) - MAX_FAILURES} more failing test(s)")
    missing = result.n_total - len(result.tests)
    if missing > 0:
        lines.append(f"  - {missing} test(s) did not run (the run stopped: {result.status})")
    return lines


def _outcome_text(outcome: Any, source: str) -> str:
    """The failure message, or 'assertion failed' when the message only repeats the test's source."""
    message = (outcome.message or "").strip()
    echoed = message.split(": ", 1)[-1].strip() if message.startswith("line ") else message
    if not message or (outcome.status == "failed" and echoed and echoed in source):
        return "assertion failed" if outcome.status == "failed" else outcome.status
    return _clip(message)


def _test_index(name: str) -> int | None:
    parts = name.split()
    return int(parts[-1]) if len(parts) == 2 and parts[0] == "assert" and parts[-1].isdigit() else None


def _usage_line(judgement: Any, helpers: list[str]) -> str:
    names = ", ".join(helpers) or "aux"
    if not judgement.used:
        return f"- Helper use: the main function does not call {names}"
    if judgement.ignored:
        return f"- Helper use: a helper is called but its result is ignored: {_clip('; '.join(judgement.ignored), 120)}"
    if judgement.wrapper:
        return "- Helper use: the main function only returns the helper's result (a thin wrapper); add its own logic"
    return f"- Helper use: the main function calls {', '.join(sorted(judgement.used))} and uses the result"


def _level_lines(judgement: Any, helpers: list[str], detailed: bool) -> list[str]:
    entry = judgement.task.entry_point
    lines = []
    for name, ok in judgement.helpers_ok.items():
        lines.append(f"- Helper `{name}`: {'defined' if ok else 'missing or returns nothing'}")
    if judgement.redefined:
        lines.append(
            f"- The main answer redefined {', '.join(judgement.redefined)} (removed: helpers come from teammates)"
        )
    lines.append(f"- Main function `{entry}`: {'defined' if judgement.main_found else 'NOT defined'}")
    if not judgement.main_found:
        return lines
    if judgement.syntax_error is not None:
        lines.append(f"- Syntax: ERROR {_clip(judgement.syntax_error) if detailed else ''}".rstrip())
        return lines
    lines.append("- Syntax: OK")
    if detailed:
        lines += _test_lines(judgement)
    elif judgement.result is not None:
        lines.append(f"- Tests: {'all passed' if judgement.result.all_passed else 'some failed'}")
    if helpers:
        lines.append(
            _usage_line(judgement, helpers) if detailed else f"- Helper use: {'yes' if judgement.used else 'no'}"
        )
    return lines


def code_feedback(judgement: Any, mode: str, helpers: list[str]) -> str:
    """Feedback text on a judged team program for ``mode`` ('' for ``plain``)."""
    if mode == "plain":
        return ""
    if mode == "passed":
        ok = judgement.result is not None and judgement.result.all_passed
        return "All tests passed." if ok else "The team's program does not pass all tests yet."
    return "\n".join(_level_lines(judgement, helpers, detailed=mode == "level_feedback"))


def revision_prompt(original: str, previous: str, feedback: str, instruction: str) -> str:
    """The original prompt + the agent's previous answer + feedback + what to do now."""
    previous = previous.strip() or "(empty)"
    if len(previous) > MAX_PREVIOUS:
        previous = previous[:MAX_PREVIOUS] + "\n..."
    parts = [original.rstrip(), f"Your previous answer:\n```python\n{previous}\n```"]
    if feedback:
        parts.append(f"Feedback on the team's combined program:\n{feedback}")
    parts.append(instruction)
    return "\n\n".join(parts)
