"""The multi-turn transition: how a joint action's child node at the next turn gets each agent's prompt from the
user's ``external_transition`` (its contract, :func:`transition`), checked at construction (:func:`check_transition`)
and optionally passed through the agents' formatters (:func:`formatted_transition`). Under a topology the transition
writes each agent's base prompt of the next turn, to which :mod:`.topology` adds the answers the agent sees."""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Callable

from ..engine.rewards import accepted_kwargs
from ..errors import TransitionError, suggest

TRANSITION_KWARGS = (
    "prompt",
    "prompts",
    "agent_completions",
    "num_agents",
    "prompt_history_per_agent",
    "response_history_per_agent",
    "batch_item",
    "turn",
)
TRANSITION_EXAMPLE = (
    "def external_transition(prompts, agent_completions, **kwargs):\n"
    "    return [f'{p}\\n\\nYour previous answer:\\n{c}\\n\\nImprove it.' for p, c in zip(prompts, agent_completions)]"
)


def check_transition(fn: Callable) -> None:
    """Fail unless ``fn`` can be called the way :func:`transition` calls it: every parameter without a default is
    one of :data:`TRANSITION_KWARGS` and can be passed by keyword. The error lists the valid names and an example."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # some builtins and C callables: nothing to check
        return
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    missing = [
        p
        for p in signature.parameters.values()
        if p.default is p.empty and (p.kind is p.POSITIONAL_ONLY or p.kind in named and p.name not in TRANSITION_KWARGS)
    ]
    if missing:
        hints = "".join(suggest(p.name, list(TRANSITION_KWARGS)) for p in missing if p.kind is not p.POSITIONAL_ONLY)
        raise TransitionError(
            f"external_transition{signature} requires {', '.join(repr(p.name) for p in missing)}, which comlrl does "
            f"not pass.{hints} It is called with keyword arguments only, each one it names among: "
            f"{', '.join(TRANSITION_KWARGS)} (all of them if it takes **kwargs); it must return the next prompt of "
            f"each agent, a list of num_agents strings. For example:\n{TRANSITION_EXAMPLE}"
        )


def formatted_transition(fn: Callable, formatters: list[Callable]) -> Callable:
    """``fn`` as an external_transition whose next prompts each go through their agent's formatter, put in the
    episode's dataset row as its 'prompt' column (``format_transition_prompts``)."""

    def next_prompts(**candidates: Any) -> Any:
        out = fn(**accepted_kwargs(fn, candidates))
        if isinstance(out, str) or not isinstance(out, (list, tuple)) or len(out) != len(formatters):
            return out  # transition() names what is wrong with it
        row = dict(candidates.get("batch_item") or {})
        prompts = []
        for i, (f, p) in enumerate(zip(formatters, out)):
            try:
                prompts.append(f({**row, "prompt": p}))
            except Exception as exc:  # transition() adds the turn and the row
                raise TransitionError(f"the formatter of agent {i}, formatting its next prompt: {exc!r}") from exc
        return prompts

    return next_prompts


def transition(
    fn: Callable | None,
    node: Any,
    answers: list[str],
    turn: int,
    *,
    acted: list[int] | None = None,
    keep_prompts: bool = False,
) -> Any:
    """The child node (a :class:`comlrl.rollout.episode.Node`) after a joint action: each agent's next prompt from
    ``external_transition``.

    ``answers``: every agent's latest answer in the joint action; ``acted``: the agents that answered in this turn
    (None: every agent), whose answers join their response history and the next turn's ``previous`` answers.
    ``keep_prompts``: without ``fn``, the next turn's base prompts are the agents' turn-1 prompts (a topology that
    shows the next turn answers of this one); else ``fn`` is required.

    Contract of ``external_transition``: it is called with keyword arguments only, and only those it names (or all,
    if it takes ``**kwargs``); parameters with other names must have defaults (the trainer checks it at construction with
    :func:`check_transition`):

    - ``prompt`` (str): agent 0's prompt of the turn just played;
    - ``prompts`` (list[str]): every agent's prompt of that turn;
    - ``agent_completions`` (list[str]): every agent's completion in this joint action (its latest one, for an
      agent that did not act in this turn under a topology);
    - ``num_agents`` (int);
    - ``prompt_history_per_agent`` (list[list[str]]): each agent's prompts so far, oldest first;
    - ``response_history_per_agent`` (list[list[str]]): each agent's completions so far, this one last;
    - ``batch_item`` (dict): the dataset row of the episode;
    - ``turn`` (int): the 1-based number of the turn just played (the next prompts are for turn + 1).

    It returns the next prompt of each agent: a list of ``num_agents`` strings, in agent order. Example::

        def external_transition(prompts, agent_completions, **kwargs):
            return [f"{p}\\n\\nYour previous answer:\\n{c}\\n\\nImprove it."
                    for p, c in zip(prompts, agent_completions)]
    """
    n = len(answers)
    did = [acted is None or i in acted for i in range(n)]
    resp_hist = [h + [a] if d else list(h) for h, a, d in zip(node.response_history, answers, did)]
    if fn is None:
        if not keep_prompts:
            raise TransitionError("num_turns > 1 needs external_transition= to build the next turn's prompts.")
        out = [h[0] for h in node.prompt_history]
    else:
        out = _next_prompts(fn, node, answers, resp_hist, turn)
    return dataclasses.replace(
        node,
        prompts=list(out),
        prompt_history=[h + [p] for h, p in zip(node.prompt_history, out)],
        response_history=resp_hist,
        base=list(out),
        answers=[],
        previous=[a if d else None for a, d in zip(answers, did)],
    )


def _next_prompts(fn: Callable, node: Any, answers: list[str], resp_hist: list[list[str]], turn: int) -> list[str]:
    """``fn``'s next prompts for the agents, checked (a TransitionError naming the turn and the row otherwise)."""
    n = len(answers)
    candidates = {
        "prompt": node.prompts[0],
        "prompts": list(node.prompts),
        "agent_completions": list(answers),
        "num_agents": n,
        "prompt_history_per_agent": [list(h) for h in node.prompt_history],
        "response_history_per_agent": [list(h) for h in resp_hist],
        "batch_item": node.row,
        "turn": turn,
    }
    try:
        out = fn(**accepted_kwargs(fn, candidates))
    except Exception as exc:
        raise TransitionError(
            f"external_transition raised {type(exc).__name__} at turn {turn}, dataset row {node.row_id}: {exc}"
        ) from exc
    if (
        isinstance(out, str)
        or not isinstance(out, (list, tuple))
        or len(out) != n
        or not all(isinstance(p, str) for p in out)
    ):
        raise TransitionError(
            f"external_transition must return {n} prompt strings (one per agent); got {out!r:.200} at turn {turn}, "
            f"dataset row {node.row_id}."
        )
    return list(out)
