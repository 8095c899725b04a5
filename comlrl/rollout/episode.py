"""One episode of team play: the multi-turn rollout tree, team rewards, and per-agent advantages.

Turn t has M_t nodes; at each node every agent samples G completions. Joint action g of a node is
the g-th sample of every agent (align) or every combination (cross, J = G^N joint actions).
Each joint action's reward comes from reward_func; through external_transition it gets a child node
at turn t+1 (unless the episode ends or early termination stops the branch). In cross mode a node thus has
G^N children: turn t holds (G^N)^t nodes per dataset row. ``rollout_expansion`` 'best' / 'top_k' continues only
each dataset row's best joint action / k best ones, so a later turn holds 1 / k nodes per row
(:func:`continued_branches`).
"""

from __future__ import annotations

import inspect
import itertools
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from ..algorithms.advantages import (
    ADVANTAGE_GROUPINGS,
    ROLLOUT_EXPANSIONS,
    agent_advantages,
    clip_rewards,
    compute_advantages,
    cross_credit,
    joint_mode_name,
    tree_returns,
)
from ..configs.fields import suggest
from ..engine.rewards import accepted_kwargs, compute_rewards
from ..errors import TransitionError
from .agent import Agent, apply_formatter
from .protocol import GenerationSettings
from .rollout import GenerationRequest, Samples, generate_concurrently
from .sampling import derive_seed


@dataclass(kw_only=True)
class Node:
    """A point in the tree: each agent's current prompt and its history."""

    row: dict
    row_id: int
    prompts: list[str]
    prompt_history: list[list[str]]
    response_history: list[list[str]]


@dataclass(kw_only=True)
class Turn:
    """Everything sampled and scored at one depth of the tree."""

    nodes: list[Node]
    samples: list[Samples]  # per agent, rows = node * G + g
    rewards: torch.Tensor  # (M, J), J = G (align) or G^N (cross)
    children: torch.Tensor  # (M, J) child node index of each joint action at the next turn, -1 if none
    levels: list[dict[str, float]] = field(default_factory=list)


@dataclass
class Episode:
    turns: list[Turn]
    timings: dict[str, float] = field(default_factory=dict)


def joint_indices(num_agents: int, g: int, mode: str) -> list[tuple[int, ...]]:
    """Sample index of each agent in each joint action of one node (``mode``: a name of
    :data:`comlrl.algorithms.advantages.JOINT_MODES`)."""
    if joint_mode_name(mode) == "align":
        return [(k,) * num_agents for k in range(g)]
    return list(itertools.product(range(g), repeat=num_agents))


def root_nodes(
    agents: list[Agent] | list[Callable], rows: list[dict], row_ids: list[int], columns: Any = None
) -> list[Node]:
    """Initial nodes: each agent's formatted prompt for each row (``agents``: the team, or every agent's formatter)."""
    formatters = [a.formatter if isinstance(a, Agent) else a for a in agents]
    nodes = []
    for row, rid in zip(rows, row_ids):
        prompts = [apply_formatter(f, row, agent=i, row_id=rid, columns=columns) for i, f in enumerate(formatters)]
        nodes.append(
            Node(
                row=row,
                row_id=rid,
                prompts=prompts,
                prompt_history=[[p] for p in prompts],
                response_history=[[] for _ in agents],
            )
        )
    return nodes


def run_episode(
    agents: list[Agent],
    nodes: list[Node],
    *,
    reward_func: Callable,
    num_generations: int,
    settings: GenerationSettings,
    joint_mode: str = "align",
    num_turns: int = 1,
    external_transition: Callable | None = None,
    termination_threshold: float | None = None,
    termination_scope: str = "branch",
    rollout_expansion: str = "tree",
    expansion_top_k: int = 2,
    reward_processor: Callable | None = None,
    autocast_dtype: torch.dtype | None = None,
    seed: int | None = None,
    generate_fn: Callable | None = None,
    run_once: Callable | None = None,
) -> Episode:
    """Roll out the tree for a batch of root nodes and score every joint action.

    ``seed``: sampling key of this episode; row k of agent i at turn t samples from its own stream keyed by
    (seed, t, i, k), so samples do not depend on batching or process placement (None: the global RNG).
    ``rollout_expansion``, ``expansion_top_k``: which joint actions get a next turn (:func:`continued_branches`).
    Distributed hooks (:mod:`comlrl.parallel.job`; None in one process): ``generate_fn`` replaces
    :func:`generate_team` and returns every agent's samples; ``run_once(fn, *args, **kwargs)`` runs the scoring (reward
    and transition, possibly a sandbox) once and gives every process its result or its exception.
    """
    g = num_generations
    check_expansion(rollout_expansion, expansion_top_k)
    generate_fn = generate_fn or generate_team
    run_once = run_once or (lambda fn, *args, **kwargs: fn(*args, **kwargs))
    turns: list[Turn] = []
    timings = {"generate": 0.0, "reward": 0.0, "transition": 0.0}
    for t in range(num_turns):
        start = time.perf_counter()
        samples = generate_fn(
            agents,
            nodes,
            g,
            settings=settings,
            autocast_dtype=autocast_dtype,
            seed=None if seed is None else derive_seed(seed, t),
        )
        timings["generate"] += time.perf_counter() - start
        rewards, levels, children, next_nodes, turn_timings = run_once(
            score_turn,
            nodes,
            samples,
            t,
            reward_func=reward_func,
            g=g,
            joint_mode=joint_mode,
            num_turns=num_turns,
            external_transition=external_transition,
            termination_threshold=termination_threshold,
            termination_scope=termination_scope,
            rollout_expansion=rollout_expansion,
            expansion_top_k=expansion_top_k,
            reward_processor=reward_processor,
        )
        for k, v in turn_timings.items():
            timings[k] += v
        turns.append(Turn(nodes=nodes, samples=samples, rewards=rewards, children=children, levels=levels))
        if not next_nodes:
            break
        nodes = next_nodes
    return Episode(turns, timings)


def score_turn(
    nodes: list[Node],
    samples: list[Samples],
    t: int,
    *,
    reward_func: Callable,
    g: int,
    joint_mode: str,
    num_turns: int,
    external_transition: Callable | None,
    termination_threshold: float | None,
    termination_scope: str,
    rollout_expansion: str = "tree",
    expansion_top_k: int = 2,
    reward_processor: Callable | None,
) -> tuple[torch.Tensor, list, torch.Tensor, list[Node], dict]:
    """Team rewards of turn t's joint actions and the child nodes: (rewards, levels, children, next nodes, timings)."""
    n = len(samples)  # agents
    combos = joint_indices(n, g, joint_mode)
    start = time.perf_counter()
    completions = [[samples[i].texts[m * g + c[i]] for m in range(len(nodes)) for c in combos] for i in range(n)]
    prompts = [[nd.prompts[i] for nd in nodes for _ in combos] for i in range(n)]
    items = [nd.row for nd in nodes for _ in combos]
    ids = [nd.row_id for nd in nodes for _ in combos]
    flat, levels = compute_rewards(
        reward_func,
        completions,
        prompts=prompts,
        batch_items=items,
        row_ids=ids,
        turn=t + 1,
        processor=reward_processor,
    )
    rewards = torch.tensor(flat, dtype=torch.float32).view(len(nodes), len(combos))
    timings = {"reward": time.perf_counter() - start, "transition": 0.0}
    children = torch.full((len(nodes), len(combos)), -1, dtype=torch.long)
    next_nodes: list[Node] = []
    if t + 1 < num_turns:
        start = time.perf_counter()
        kept = continued_branches(rewards, [nd.row_id for nd in nodes], rollout_expansion, expansion_top_k)
        for m, nd in enumerate(nodes):
            expand = expanded_branches(rewards[m], termination_threshold, termination_scope)
            for k, c in enumerate(combos):
                if not (expand[k] and kept[m, k]):
                    continue
                answers = [samples[i].texts[m * g + c[i]] for i in range(n)]
                children[m, k] = len(next_nodes)
                next_nodes.append(transition(external_transition, nd, answers, t + 1))
        timings["transition"] = time.perf_counter() - start
    return rewards, levels, children, next_nodes, timings


def expanded_branches(rewards: torch.Tensor, threshold: float | None, scope: str = "branch") -> list[bool]:
    """Which joint actions of one node get a next turn, from their rewards (J,): all when ``threshold`` is None;
    'branch': those whose reward is below it; 'node': all or none, none once their mean reward exceeds it."""
    if threshold is None:
        return [True] * len(rewards)
    if scope == "node":
        return [float(rewards.mean()) <= threshold] * len(rewards)
    return [float(r) < threshold for r in rewards]


def check_expansion(expansion: str, top_k: int) -> None:
    """ValueError unless ``expansion`` is one of :data:`ROLLOUT_EXPANSIONS` and ``top_k`` >= 1."""
    if expansion not in ROLLOUT_EXPANSIONS:
        raise ValueError(f"unknown rollout_expansion {expansion!r}; valid: {', '.join(ROLLOUT_EXPANSIONS)}")
    if top_k < 1:
        raise ValueError(f"expansion_top_k={top_k}: must be >= 1")


def continued_branches(
    rewards: torch.Tensor, row_ids: list[int], expansion: str = "tree", top_k: int = 2
) -> torch.Tensor:
    """(M, J) bool: which joint actions of a turn's M nodes, rewards (M, J), may get a next turn under ``expansion``:
    'tree' every one; 'best' the highest-reward one of each dataset row (``row_ids``: each node's row), over the row's
    nodes; 'top_k' the ``top_k`` highest of each row (all when the row has fewer). Ties go to the lowest (node, joint
    action) index. Early termination (:func:`expanded_branches`) applies on top: a kept branch that terminates ends
    there, and no other takes its place.

    A T-turn episode thus samples G per agent per row at turn 1 and, under 'best', at every later turn (G * T in all);
    under 'top_k', k G at every later turn (G + k G (T - 1); min(k, the row's joint actions) nodes at turn 2). A joint
    action not continued has no child, so its tree return is its own reward.
    """
    check_expansion(expansion, top_k)
    if expansion == "tree":
        return torch.ones(rewards.shape, dtype=torch.bool)
    k = 1 if expansion == "best" else top_k
    nodes_of_row: dict[int, list[int]] = {}
    for m, rid in enumerate(row_ids):
        nodes_of_row.setdefault(rid, []).append(m)
    kept = torch.zeros(rewards.shape, dtype=torch.bool)
    for nodes in nodes_of_row.values():
        ranked = sorted(((m, j) for m in nodes for j in range(rewards.shape[1])), key=lambda mj: -float(rewards[mj]))
        for m, j in ranked[:k]:  # sorted() is stable: equal rewards keep the lowest index first
            kept[m, j] = True
    return kept


def generate_team(
    agents: list[Agent],
    nodes: list[Node],
    g: int,
    *,
    settings: GenerationSettings,
    autocast_dtype: torch.dtype | None = None,
    seed: int | None = None,
    row_offset: int = 0,
) -> list[Samples]:
    """Each agent's samples for the nodes' prompts: one generate call per distinct model, the models decoding at
    once on CPU (:func:`comlrl.rollout.rollout.generate_concurrently`).

    Agents sharing a LoRA base are generated together, each row routed through its agent's adapter.
    ``seed``: per-row sampling key of this turn; row k (node k // g, sample k % g) of agent i samples from
    a stream keyed by (seed, i, row_offset + k), row_offset being the first row's index in the whole batch.
    """
    out: dict[int, Samples] = {}
    by_model: dict[int, list[Agent]] = {}
    for a in agents:
        by_model.setdefault(id(a.model), []).append(a)
    requests = []
    for group in by_model.values():
        prompts = [nd.prompts[a.index] for a in group for nd in nodes]
        chats = [a.chat for a in group for _ in nodes]
        adapters = [a.adapter for a in group for _ in nodes] if group[0].adapter is not None else None
        seeds = (
            None
            if seed is None
            else [derive_seed(seed, a.index, row_offset + k) for a in group for k in range(len(nodes) * g)]
        )
        requests.append(
            GenerationRequest(
                model=group[0].model,
                tokenizer=group[0].tokenizer,
                prompts=prompts,
                num_generations=g,
                settings=settings,
                chat=chats,
                autocast_dtype=autocast_dtype,
                adapter_names=adapters,
                row_seeds=seeds,
            )
        )
    for group, s in zip(by_model.values(), generate_concurrently(requests)):
        rows = len(nodes) * g
        for k, a in enumerate(group):
            out[a.index] = own_width(s.rows(k * rows, (k + 1) * rows)) if len(group) > 1 else s
    return [out[a.index] for a in agents]


def own_width(s: Samples) -> Samples:
    """Drop the padding columns an agent's rows got from sharing a generate call with other agents' longer rows:
    its samples are then what generating it alone returns (so they do not depend on which agents share its base)."""
    first = int((s.prompt_mask.sum(dim=0) > 0).float().argmax()) if s.prompt_mask.any() else s.prompt_mask.shape[1] - 1
    used = (s.completion_mask.sum(dim=0) > 0).nonzero()
    last = int(used.max()) + 1 if len(used) else 1
    return s.select(slice(None), slice(first, None), slice(None, last))


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


def transition(fn: Callable | None, node: Node, answers: list[str], turn: int) -> Node:
    """The child node after a joint action: each agent's next prompt from ``external_transition``.

    Contract of ``external_transition``: it is called with keyword arguments only, and only those it names (or all,
    if it takes ``**kwargs``); parameters with other names must have defaults (the trainer checks it at construction with
    :func:`check_transition`):

    - ``prompt`` (str): agent 0's prompt of the turn just played;
    - ``prompts`` (list[str]): every agent's prompt of that turn;
    - ``agent_completions`` (list[str]): every agent's completion in this joint action;
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
    if fn is None:
        raise TransitionError("num_turns > 1 needs external_transition= to build the next turn's prompts.")
    n = len(answers)
    resp_hist = [h + [a] for h, a in zip(node.response_history, answers)]
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
    return Node(
        row=node.row,
        row_id=node.row_id,
        prompts=list(out),
        prompt_history=[h + [p] for h, p in zip(node.prompt_history, out)],
        response_history=resp_hist,
    )


def episode_advantages(
    episode: Episode,
    num_agents: int,
    num_generations: int,
    *,
    joint_mode: str = "align",
    mode: str = "mean",
    scale: str = "none",
    discount: float = 1.0,
    reward_clip: float | None = None,
    credit: str = "mean",
    grouping: str = "team",
) -> list[list[torch.Tensor]]:
    """advantages[agent][turn]: (M_t * G,) advantage of each of the agent's samples, row order as in Samples.
    ``credit``: cross mode's credit of a sample from the joint actions with it (:func:`cross_credit`).

    ``grouping`` (one of :data:`ADVANTAGE_GROUPINGS`), over each agent's returns (in cross mode its credits):

    - 'team': per node, the baseline ``mode`` and ``scale`` over the node's tree returns;
    - 'agent' (Dr.MAS): the node's baseline, divided by the std of all the agent's returns in the episode
      (:func:`agent_advantages`; ``scale`` must be 'none'): scale='batch' when every agent shares every return of a
      single turn;
    - 'agent_turn' (AT-GRPO): per node, ``mode`` and ``scale`` over each joint action's own turn reward, no later
      turn (tree returns with discount 0), the natural pairing of rollout_expansion 'best' / 'top_k', under which
      the joint actions not continued have no future anyway.
    """
    if grouping not in ADVANTAGE_GROUPINGS:
        raise ValueError(f"unknown advantage grouping {grouping!r}; valid: {', '.join(ADVANTAGE_GROUPINGS)}")
    if grouping == "agent" and scale != "none":
        raise ValueError(
            f"advantage grouping 'agent' divides by each agent's std itself; scale={scale!r} must be 'none'"
        )
    rewards = clip_rewards([t.rewards for t in episode.turns], reward_clip)
    if grouping == "agent_turn":  # a turn's own reward: no return flows back from later turns
        discount = 0.0
    returns = tree_returns(rewards, [t.children for t in episode.turns], discount)  # (M_t, J) per turn
    if joint_mode_name(joint_mode) == "cross":  # a sample's credit: from the returns of the joint actions with it
        joint = [r.view(r.shape[0], *([num_generations] * num_agents)) for r in returns]  # (M_t, G, ..., G)
        credits = [[cross_credit(j, i, credit) for j in joint] for i in range(num_agents)]
        if grouping == "agent":
            return [[a.reshape(-1) for a in agent_advantages(c, mode)] for c in credits]
        return [[compute_advantages(c, mode, scale).reshape(-1) for c in per_turn] for per_turn in credits]
    if grouping == "agent":  # every agent's returns are the joint ones: one normalization for all
        per_turn = [a.reshape(-1) for a in agent_advantages(returns, mode)]
    else:
        per_turn = [compute_advantages(r, mode, scale).reshape(-1) for r in returns]
    return [per_turn for _ in range(num_agents)]
