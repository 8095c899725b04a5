"""Communication topologies: which agents act at each turn, whose answers each one sees, and the prompt it gets.

A topology gives every turn a graph (:class:`TurnGraph`): the agents that act, edges within the turn (``(j, k)``:
agent j's answer of this turn is in agent k's prompt; a DAG) and edges from the previous turn (``(j, k)``: agent j's
answer of the previous turn is in agent k's prompt). A turn is played in *stages*, the topological levels of its
within-turn DAG over the acting agents: the agents of one stage sample at the same time, each with the answers its
in-edges bring (:func:`visible_answers`) composed into its prompt (:func:`compose_prompt`, or the ``topology_prompt``
a trainer is given).

Built-ins (:data:`TOPOLOGIES`), for N agents:

- ``parallel``: one stage, every agent, no edges (independent answers);
- ``chain``: stages [0], [1], ..., [N-1]; agent k sees the answers of agents < k of the same turn;
- ``debate``: one stage; from turn 2 every agent sees every agent's answer of the previous turn, its own included;
- ``leader``: turn 1: agent 0 plans (stage 1), agents 1..N-1 answer with the plan (stage 2); turn 2: agent 0 alone
  acts and sees the workers' answers of turn 1 (the final answer); later turns alternate likewise.

A user graph is a dict ``{"same_turn": [[j, k], ...], "previous_turn": [[j, k], ...], "acting": [...]}`` (each key
optional; ``acting`` defaults to every agent), or a list of such dicts, one per turn, the last repeating.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ..errors import ConfigError, suggest

TOPOLOGIES = ("parallel", "chain", "debate", "leader")
GRAPH_KEYS = ("same_turn", "previous_turn", "acting")

# (prompt, visible answers [(agent, turn, text)], agent, turn (1-based), dataset row) -> the agent's prompt
TopologyPrompt = Callable[[str, list, int, int, dict], str]


@dataclass(frozen=True)
class TurnGraph:
    """One turn of a topology: the acting agents (in index order) and the edges that carry answers to prompts."""

    acting: tuple[int, ...]
    same_turn: tuple[tuple[int, int], ...] = ()
    previous_turn: tuple[tuple[int, int], ...] = ()

    def stages(self) -> list[list[int]]:
        """The acting agents by topological level of the within-turn DAG: an agent's level is one more than the
        highest level of the agents whose answers it sees (0 without in-edges)."""
        level: dict[int, int] = {}

        def depth(k: int) -> int:
            if k not in level:
                level[k] = 1 + max((depth(j) for j, kk in self.same_turn if kk == k), default=-1)
            return level[k]

        for k in self.acting:
            depth(k)
        return [[k for k in self.acting if level[k] == s] for s in range(max(level.values(), default=-1) + 1)]


@dataclass(frozen=True)
class Topology:
    """A topology resolved for a team: a graph per turn (``turns[t]`` for turn t + 1; past the list, the list
    repeats when ``cycle``, else its last graph does)."""

    name: str
    num_agents: int
    turns: tuple[TurnGraph, ...]
    cycle: bool = False

    def turn(self, t: int) -> TurnGraph:
        """The graph of turn t + 1 (0-based ``t``)."""
        if t < len(self.turns):
            return self.turns[t]
        return self.turns[t % len(self.turns)] if self.cycle else self.turns[-1]

    @property
    def is_parallel(self) -> bool:
        """Whether every turn is one stage of every agent with nothing shown (independent answers)."""
        every = tuple(range(self.num_agents))
        return all(g.acting == every and not g.same_turn and not g.previous_turn for g in self.turns)


def builtin(name: str, num_agents: int, *, field: str = "topology") -> Topology:
    """The built-in topology ``name`` (one of :data:`TOPOLOGIES`) for ``num_agents`` agents (``field``: named in the
    error for another name)."""
    n = num_agents
    every = tuple(range(n))
    if name == "parallel":
        return Topology(name, n, (TurnGraph(every),))
    if name == "chain":
        return Topology(name, n, (TurnGraph(every, tuple((j, k) for k in every for j in range(k))),))
    if name == "debate":
        shown = tuple((j, k) for k in every for j in every)
        return Topology(name, n, (TurnGraph(every), TurnGraph(every, (), shown)))
    if name == "leader":
        plan = TurnGraph(every, tuple((0, k) for k in every[1:]))
        final = TurnGraph((0,), (), tuple((k, 0) for k in every[1:]))
        return Topology(name, n, (plan, final), cycle=True)
    raise ConfigError(f"{field}={name!r}: must be one of {TOPOLOGIES} or a graph.{suggest(name, list(TOPOLOGIES))}")


def resolve_topology(value: Any, num_agents: int | None = None, *, field: str = "topology") -> Topology:
    """The :class:`Topology` of a config value: a name of :data:`TOPOLOGIES`, a graph dict, or a list of graph dicts
    (one per turn, the last repeating). ConfigError naming ``field``, the turn and the edge when it is not one: an
    unknown key, an agent index out of range (``num_agents``; None: not checked), an edge to or within the turn from
    an agent that does not act, a cycle of same-turn edges."""
    n = 2 if num_agents is None else num_agents
    if isinstance(value, str):
        return builtin(value, n, field=field)
    graphs = [value] if isinstance(value, dict) else value
    if not isinstance(graphs, (list, tuple)) or not graphs:
        raise ConfigError(
            f"{field}={value!r:.80}: must be one of {TOPOLOGIES}, a graph dict with keys {GRAPH_KEYS}, or a non-empty "
            "list of such dicts (one per turn, the last repeating)."
        )
    turns = tuple(_turn_graph(g, t, num_agents, field) for t, g in enumerate(graphs))
    return Topology("graph", n, turns)


def _turn_graph(graph: Any, t: int, num_agents: int | None, field: str) -> TurnGraph:
    """One turn's graph dict, checked (``t``: 0-based turn)."""
    where = f"{field}, turn {t + 1}"
    if not isinstance(graph, dict):
        raise ConfigError(f"{where}: {graph!r:.80} is not a dict with keys {GRAPH_KEYS}.")
    for key in graph:
        if key not in GRAPH_KEYS:
            raise ConfigError(
                f"{where}: unknown key {key!r}; valid: {', '.join(GRAPH_KEYS)}.{suggest(str(key), list(GRAPH_KEYS))}"
            )

    def agent(k: Any, what: str) -> int:
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise ConfigError(f"{where}: {what}: {k!r} is not an agent index (an int >= 0).")
        if num_agents is not None and k >= num_agents:
            raise ConfigError(
                f"{where}: {what}: agent {k} is out of range for {num_agents} agents (0..{num_agents - 1})."
            )
        return k

    acting_in = graph.get("acting")
    if acting_in is None:
        if num_agents is None:
            ends = [k for key in ("same_turn", "previous_turn") for e in graph.get(key) or () for k in e]
            acting_in = range(max([agent(k, "edge") for k in ends], default=1) + 1)
        else:
            acting_in = range(num_agents)
    if not isinstance(acting_in, (list, tuple, range)) or not acting_in:
        raise ConfigError(f"{where}: acting={acting_in!r}: must be a non-empty list of agent indices.")
    acting = [agent(k, f"acting={list(acting_in)!r}") for k in acting_in]
    if len(set(acting)) != len(acting):
        raise ConfigError(f"{where}: acting={acting!r} names an agent twice.")
    edges = {}
    for key in ("same_turn", "previous_turn"):
        out = []
        for e in graph.get(key) or ():
            what = f"{key} edge {e!r}"
            if not isinstance(e, (list, tuple)) or len(e) != 2:
                raise ConfigError(f"{where}: {what}: an edge is a pair [j, k] (j's answer shown to k).")
            j, k = agent(e[0], what), agent(e[1], what)
            if k not in acting:
                raise ConfigError(f"{where}: {what}: agent {k} does not act in this turn (acting: {sorted(acting)}).")
            if key == "same_turn" and j not in acting:
                raise ConfigError(f"{where}: {what}: agent {j} does not act in this turn, so it has no answer to show.")
            if key == "same_turn" and j == k:
                raise ConfigError(f"{where}: {what}: an agent cannot see its own answer of the same turn.")
            out.append((j, k))
        edges[key] = tuple(dict.fromkeys(out))
    result = TurnGraph(tuple(sorted(acting)), edges["same_turn"], edges["previous_turn"])
    cycle = _cycle(result)
    if cycle:
        raise ConfigError(
            f"{where}: same_turn edges form a cycle {' -> '.join(map(str, cycle))}: agents of one turn must be "
            "ordered (a DAG); show an answer of the previous turn with previous_turn instead."
        )
    return result


def _cycle(graph: TurnGraph) -> list[int]:
    """A cycle of the graph's same-turn edges as a path [a, b, ..., a], or [] when it is a DAG."""
    state: dict[int, int] = {}  # 1: on the current path, 2: done
    path: list[int] = []

    def visit(j: int) -> list[int]:
        state[j] = 1
        path.append(j)
        for a, k in graph.same_turn:
            if a != j:
                continue
            if state.get(k) == 1:
                return path[path.index(k) :] + [k]
            if k not in state and (found := visit(k)):
                return found
        state[j] = 2
        path.pop()
        return []

    for j in graph.acting:
        if j not in state and (found := visit(j)):
            return found
    return []


def needs_transition(value: Any, num_turns: int) -> bool:
    """Whether a run of ``num_turns`` turns under topology ``value`` needs an external_transition: some turn after
    the first shows no answer of the previous turn, so without one its prompts would repeat turn 1's unchanged."""
    topology = resolve_topology(value)
    return any(not topology.turn(t).previous_turn for t in range(1, num_turns))


def visible_answers(
    graph: TurnGraph, agent: int, this_turn: list[str | None], previous: list[str | None], turn: int
) -> list[tuple[int, int, str]]:
    """What ``agent`` sees at turn ``turn`` (1-based): (agent, turn, text) of each answer its in-edges bring, the
    previous turn's first, each group in agent order. ``this_turn`` / ``previous``: every agent's answer of this turn
    so far and of the previous turn (None: none; an answer that is None is not shown)."""
    shown = []
    for j in sorted(j for j, k in graph.previous_turn if k == agent):
        if turn > 1 and j < len(previous) and previous[j] is not None:
            shown.append((j, turn - 1, previous[j]))
    for j in sorted(j for j, k in graph.same_turn if k == agent):
        if j < len(this_turn) and this_turn[j] is not None:
            shown.append((j, turn, this_turn[j]))
    return shown


def compose_prompt(prompt: str, visible: list[tuple[int, int, str]], agent: int, turn: int, row: Any = None) -> str:
    """The default prompt composition: ``prompt`` followed by each visible answer under a header naming the agent
    (``Your`` for the agent's own; agents numbered from 1, as the environments' prompts number them) and whether it
    is this turn's or the previous turn's; ``prompt`` unchanged when nothing is visible."""
    if not visible:
        return prompt
    parts = [prompt.rstrip()]
    for k, t, text in visible:
        who = "Your" if k == agent else f"Agent {k + 1}'s"
        when = "this turn" if t == turn else "previous turn"
        parts.append(f"{who} answer ({when}):\n{text.strip()}")
    return "\n\n".join(parts)
