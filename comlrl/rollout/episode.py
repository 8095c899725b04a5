"""One episode of team play: the multi-turn rollout tree, team rewards, and per-agent advantages.

Turn t has M_t nodes; at each node every agent samples G completions. Joint action g of a node is
the g-th sample of every agent (align) or every combination (cross, J = G^N joint actions).
Each joint action's reward comes from reward_func; through external_transition it gets a child node
at turn t+1 (unless the episode ends or early termination stops the branch). In cross mode a node thus has
G^N children: turn t holds (G^N)^t nodes per dataset row. ``rollout_expansion`` 'best' / 'top_k' continues only
each dataset row's best joint action / k best ones, so a later turn holds 1 / k nodes per row
(:func:`continued_branches`).

Under a topology (:mod:`.topology`) a turn is played in stages: at each stage the acting agents of every node sample
G each (their joint actions over the acting agents only), and each joint action of a stage that is not the turn's
last gets a child node of the same turn carrying its answers; the turn's last stage is scored and continues as above.
The episode's ``turns`` are these stages (one per turn under 'parallel').
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

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
from ..engine.rewards import compute_rewards
from ..errors import TransitionError
from .agent import Agent, apply_formatter
from .protocol import GenerationSettings
from .rollout import GenerationRequest, Samples, generate_concurrently
from .sampling import derive_seed
from .topology import Topology, TopologyPrompt, TurnGraph, compose_prompt, resolve_topology, visible_answers

# the transition contract lives in .transition; its names are read from here too
from .transition import (  # noqa: F401
    TRANSITION_EXAMPLE,
    TRANSITION_KWARGS,
    check_transition,
    formatted_transition,
    transition,
)


@dataclass(kw_only=True)
class Node:
    """A point in the tree: each agent's current prompt and its history.

    Under a topology also: ``base``, each agent's prompt of this turn before the answers it sees are added;
    ``answers``, the answers given at earlier stages of this turn (None: none yet); ``previous``, each agent's answer
    of the previous turn (None: it did not act). Empty lists read as no answers and ``base`` = ``prompts``.
    """

    row: dict
    row_id: int
    prompts: list[str]
    prompt_history: list[list[str]]
    response_history: list[list[str]]
    base: list[str] = field(default_factory=list)
    answers: list[str | None] = field(default_factory=list)
    previous: list[str | None] = field(default_factory=list)


@dataclass(kw_only=True)
class Turn:
    """Everything sampled and scored at one stage of the tree (one turn under the 'parallel' topology).

    ``turn``: the 0-based turn the stage belongs to; ``acting``: the agents that sampled (None: every agent; the
    others' ``samples`` have 0 rows); ``scored``: whether it is its turn's last stage, whose joint actions the reward
    function scored (the others' rewards are 0 and every joint action has a child at the next stage).
    """

    nodes: list[Node]
    samples: list[Samples]  # per agent, rows = node * G + g
    rewards: torch.Tensor  # (M, J), J = G (align) or G^A (cross, A acting agents)
    children: torch.Tensor  # (M, J) child node index of each joint action at the next stage, -1 if none
    levels: list[dict[str, float]] = field(default_factory=list)
    turn: int = 0
    acting: list[int] | None = None
    scored: bool = True

    def acts(self, agent: int) -> bool:
        """Whether ``agent`` sampled at this stage."""
        return self.acting is None or agent in self.acting

    def agents(self, num_agents: int) -> list[int]:
        """The agents that sampled at this stage, in index order."""
        return list(range(num_agents)) if self.acting is None else list(self.acting)


@dataclass
class Episode:
    turns: list[Turn]
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def scored(self) -> list[Turn]:
        """The stages the reward function scored: one per turn played (every stage under 'parallel')."""
        return [t for t in self.turns if t.scored]


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
                base=list(prompts),
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
    topology: Topology | Any = "parallel",
    topology_prompt: TopologyPrompt | None = None,
) -> Episode:
    """Roll out the tree for a batch of root nodes and score every joint action.

    ``seed``: sampling key of this episode; row k of agent i at turn t samples from its own stream keyed by
    (seed, t, i, k), so samples do not depend on batching or process placement (None: the global RNG).
    ``rollout_expansion``, ``expansion_top_k``: which joint actions get a next turn (:func:`continued_branches`).
    ``topology``: who acts at each stage of a turn and whose answers each sees (a :class:`.topology.Topology` or a
    config value, see :func:`.topology.resolve_topology`); ``topology_prompt``: composes an acting agent's prompt
    from its base prompt and the answers it sees (default :func:`.topology.compose_prompt`).
    Distributed hooks (:mod:`comlrl.parallel.job`; None in one process): ``generate_fn`` replaces
    :func:`generate_team` and returns the acting agents' samples (``acting=``: their indices, given when not every
    agent acts); ``run_once(fn, *args, **kwargs)`` runs the scoring (reward and transition, possibly a sandbox) once
    and gives every process its result or its exception.
    """
    g = num_generations
    check_expansion(rollout_expansion, expansion_top_k)
    n = len(nodes[0].prompts) if nodes else len(agents)
    if not isinstance(topology, Topology):
        topology = resolve_topology(topology, n)
    generate_fn = generate_fn or generate_team
    run_once = run_once or (lambda fn, *args, **kwargs: fn(*args, **kwargs))
    turns: list[Turn] = []
    timings = {"generate": 0.0, "reward": 0.0, "transition": 0.0}
    for t, graph, acting, final in stage_plan(topology, num_turns):
        nodes = stage_nodes(nodes, graph, acting, t, topology_prompt)
        subset = acting if len(acting) < n else None  # None: every agent acts (the one stage of a parallel turn)
        start = time.perf_counter()
        samples = stage_samples(
            generate_fn,
            agents,
            nodes,
            g,
            acting=subset,
            num_agents=n,
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
            acting=subset,
            final=final,
            shows_previous=bool(topology.turn(t + 1).previous_turn),
        )
        for k, v in turn_timings.items():
            timings[k] += v
        turns.append(
            Turn(
                nodes=nodes,
                samples=samples,
                rewards=rewards,
                children=children,
                levels=levels,
                turn=t,
                acting=subset,
                scored=final,
            )
        )
        if not next_nodes:
            break
        nodes = next_nodes
    return Episode(turns, timings)


def stage_plan(topology: Topology, num_turns: int) -> Iterator[tuple[int, TurnGraph, list[int], bool]]:
    """(0-based turn, its graph, the stage's acting agents, whether it is the turn's last stage) of every stage."""
    for t in range(num_turns):
        graph = topology.turn(t)
        stages = graph.stages()
        for s, acting in enumerate(stages):
            yield t, graph, acting, s == len(stages) - 1


def stage_nodes(
    nodes: list[Node], graph: TurnGraph, acting: list[int], t: int, topology_prompt: TopologyPrompt | None
) -> list[Node]:
    """The nodes with each acting agent's prompt composed from its base prompt and the answers it sees at turn
    ``t`` (0-based); the nodes as they are when nothing is shown and the default composition applies."""
    if topology_prompt is None and not graph.same_turn and not graph.previous_turn:
        return nodes
    compose = topology_prompt or compose_prompt
    out = []
    for nd in nodes:
        n = len(nd.prompts)
        base = nd.base or nd.prompts
        this_turn = nd.answers or [None] * n
        prompts = list(nd.prompts)
        for k in acting:
            visible = visible_answers(graph, k, this_turn, nd.previous, t + 1)
            try:
                prompts[k] = compose(base[k], visible, k, t + 1, nd.row)
            except Exception as exc:
                raise TransitionError(
                    f"topology_prompt raised {type(exc).__name__} at turn {t + 1}, agent {k}, dataset row "
                    f"{nd.row_id}: {exc}"
                ) from exc
            if not isinstance(prompts[k], str):
                raise TransitionError(
                    f"topology_prompt must return the agent's prompt, a str; got {prompts[k]!r:.200} at turn "
                    f"{t + 1}, agent {k}, dataset row {nd.row_id}."
                )
        out.append(dataclasses.replace(nd, prompts=prompts, base=list(base)))
    return out


def stage_samples(
    generate_fn: Callable,
    agents: list[Agent],
    nodes: list[Node],
    g: int,
    *,
    acting: list[int] | None,
    num_agents: int,
    **kwargs: Any,
) -> list[Samples]:
    """Every agent's samples of one stage: ``generate_fn``'s for the acting agents (``acting``; None: every agent),
    0 rows (:func:`no_samples`) for the others."""
    if acting is None:
        return generate_fn(agents, nodes, g, **kwargs)
    out = generate_fn(agents, nodes, g, acting=list(acting), **kwargs)
    samples = [no_samples() for _ in range(num_agents)]
    for i, s in zip(acting, out):
        samples[i] = s
    return samples


def no_samples() -> Samples:
    """The samples of an agent that does not act at a stage: 0 rows."""
    ids = torch.zeros(0, 0, dtype=torch.long)
    return Samples(
        prompt_ids=ids,
        prompt_mask=ids.clone(),
        completion_ids=ids.clone(),
        completion_mask=ids.clone(),
        texts=[],
        truncated=torch.zeros(0, dtype=torch.bool),
    )


def latest_answer(node: Node, agent: int) -> str:
    """``agent``'s latest answer at ``node`` before its stage: this turn's, else its last one, else ''."""
    if node.answers and node.answers[agent] is not None:
        return node.answers[agent]
    history = node.response_history[agent]
    return history[-1] if history else ""


def joint_answers(node: Node, samples: list[Samples], acting: list[int], first_row: int, combo: tuple) -> list[str]:
    """Every agent's latest answer in one joint action: the acting agents' samples ``first_row + combo[p]`` (p: the
    agent's position in ``acting``), the others' :func:`latest_answer`."""
    out = [latest_answer(node, i) for i in range(len(samples))]
    for p, i in enumerate(acting):
        out[i] = samples[i].texts[first_row + combo[p]]
    return out


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
    acting: list[int] | None = None,
    final: bool = True,
    shows_previous: bool = False,
) -> tuple[torch.Tensor, list, torch.Tensor, list[Node], dict]:
    """Team rewards of a stage's joint actions at turn t and the child nodes: (rewards, levels, children, next nodes,
    timings). ``acting``: the agents that sampled (None: every agent); a stage that is not its turn's last
    (``final`` False) scores 0 and gives every joint action a child carrying its answers; ``shows_previous``: the next
    turn shows answers of this one, so that without an external_transition its base prompts are turn 1's."""
    n = len(samples)  # agents
    acting = list(range(n)) if acting is None else list(acting)
    combos = joint_indices(len(acting), g, joint_mode)
    if not final:
        children = torch.arange(len(nodes) * len(combos), dtype=torch.long).view(len(nodes), len(combos))
        next_nodes = [carried(nd, samples, acting, m * g, c) for m, nd in enumerate(nodes) for c in combos]
        return torch.zeros(len(nodes), len(combos)), [], children, next_nodes, {"reward": 0.0, "transition": 0.0}
    start = time.perf_counter()
    answers = [joint_answers(nd, samples, acting, m * g, c) for m, nd in enumerate(nodes) for c in combos]
    completions = [[a[i] for a in answers] for i in range(n)]
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
            acted = [i for i in range(n) if i in acting or (nd.answers and nd.answers[i] is not None)]
            for k in range(len(combos)):
                if not (expand[k] and kept[m, k]):
                    continue
                children[m, k] = len(next_nodes)
                joint = answers[m * len(combos) + k]
                next_nodes.append(
                    transition(
                        external_transition,
                        nd,
                        joint,
                        t + 1,
                        acted=None if len(acted) == n else acted,
                        keep_prompts=shows_previous,
                    )
                )
        timings["transition"] = time.perf_counter() - start
    return rewards, levels, children, next_nodes, timings


def carried(node: Node, samples: list[Samples], acting: list[int], first_row: int, combo: tuple) -> Node:
    """The child of a joint action at a stage that is not its turn's last: the node with the acting agents' answers
    of this joint action added to this turn's."""
    answers = list(node.answers) if node.answers else [None] * len(samples)
    for p, i in enumerate(acting):
        answers[i] = samples[i].texts[first_row + combo[p]]
    return dataclasses.replace(node, answers=answers)


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
    acting: list[int] | None = None,
) -> list[Samples]:
    """Each agent's samples for the nodes' prompts: one generate call per distinct model, the models decoding at
    once on CPU (:func:`comlrl.rollout.rollout.generate_concurrently`). ``acting``: only these agents' (their indices;
    None: every agent given), in agent order.

    Agents sharing a LoRA base are generated together, each row routed through its agent's adapter.
    ``seed``: per-row sampling key of this turn; row k (node k // g, sample k % g) of agent i samples from
    a stream keyed by (seed, i, row_offset + k), row_offset being the first row's index in the whole batch.
    """
    if acting is not None:
        agents = [a for a in agents if a.index in acting]
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
    """advantages[agent][stage]: (M_s * G,) advantage of each of the agent's samples, row order as in Samples; an
    empty tensor at a stage where the agent did not act. ``credit``: cross mode's credit of a sample from the joint
    actions with it (:func:`cross_credit`). Returns flow back with discount 1 from a stage to the next stage of its
    turn and ``discount`` from a turn's scored stage to the next turn.

    ``grouping`` (one of :data:`ADVANTAGE_GROUPINGS`), over each agent's returns (in cross mode its credits):

    - 'team': per node, the baseline ``mode`` and ``scale`` over the node's tree returns;
    - 'agent' (Dr.MAS): the node's baseline, divided by the std of all the agent's returns in the episode
      (:func:`agent_advantages`; ``scale`` must be 'none'): scale='batch' when every agent shares every return of a
      single turn;
    - 'agent_turn' (AT-GRPO): per node, ``mode`` and ``scale`` over each joint action's own turn reward, no later
      turn (tree returns with discount 0 between turns), the natural pairing of rollout_expansion 'best' / 'top_k',
      under which the joint actions not continued have no future anyway.

    Under a topology whose turns have several stages a node holds the samples of one state (the answers before it),
    so an agent's group is its G samples per state: the AT-GRPO grouping.
    """
    if grouping not in ADVANTAGE_GROUPINGS:
        raise ValueError(f"unknown advantage grouping {grouping!r}; valid: {', '.join(ADVANTAGE_GROUPINGS)}")
    if grouping == "agent" and scale != "none":
        raise ValueError(
            f"advantage grouping 'agent' divides by each agent's std itself; scale={scale!r} must be 'none'"
        )
    rewards = clip_rewards([t.rewards for t in episode.turns], reward_clip)
    between = 0.0 if grouping == "agent_turn" else discount  # agent_turn: no return flows back from later turns
    discounts = [between if t.scored else 1.0 for t in episode.turns]
    returns = tree_returns(rewards, [t.children for t in episode.turns], discounts)  # (M_s, J) per stage
    cross = joint_mode_name(joint_mode) == "cross"
    out = []
    for i in range(num_agents):
        own = [s for s, t in enumerate(episode.turns) if t.acts(i)]
        values = []
        for s in own:
            acting = episode.turns[s].agents(num_agents)
            r = returns[s]
            if cross:  # a sample's credit: from the returns of the joint actions with it
                joint = r.view(r.shape[0], *([num_generations] * len(acting)))  # (M_s, G, ..., G)
                r = cross_credit(joint, acting.index(i), credit)
            values.append(r)
        if grouping == "agent":
            adv = agent_advantages(values, mode)
        else:
            adv = [compute_advantages(v, mode, scale) for v in values]
        per_stage = [torch.zeros(0) for _ in episode.turns]
        for s, a in zip(own, adv):
            per_stage[s] = a.reshape(-1)
        out.append(per_stage)
    return out
