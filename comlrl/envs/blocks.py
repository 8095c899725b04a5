"""Building a target in a block world by a team of two: ``blocks`` (a pure-Python voxel grid).

The world is a small grid of voxels, ``x`` (west to east), ``y`` (up) and ``z`` (north to south), every
cell empty (``air``) at the start. Agents build with commands, one per line::

    /fill x1 y1 z1 x2 y2 z2 block     # the box between two corners, inclusive; "air" clears it
    /setblock x y z block             # one cell

Each agent has its own palette (``air`` is always allowed). A command is rejected (invalid) when it does
not parse (seven integers and a block for ``/fill``), leaves the grid, uses a block outside the agent's
palette, or comes after the agent's ``max_commands``. Lines that are not commands (prose, fences) are
ignored; a ``minecraft:`` prefix is dropped. The valid commands run in order: agent 1's, then agent 2's,
so agent 2 can overwrite agent 1's blocks.

Tasks, generated in code and deterministic by seed (:func:`make_task`):

* ``str_build``: a word of 2-4 letters in a 3x5 pixel font on a wall (the plane z=0 of a (4L+1)x6x1
  grid); agent 1 builds the 1st and 3rd letters in its colour, agent 2 the 2nd and 4th in its own;
* ``house_build``: a house on an 8x6x8 grid from a blueprint, one layer per height: a floor, walls 2-3
  high with a door and glass windows, a flat roof (and a smaller second roof layer on larger houses);
  agent 1 (floor and walls materials) builds the floor and walls, agent 2 (glass and roof material)
  the windows and the roof.

Team reward (tiered, maximum 4.0). T: the target's filled cells; built: the grid's filled cells after
the valid commands; correct: cells of T holding the target block; extra: built cells that are not
correct (outside T, or the wrong block). Each cell of the grid belongs to the agent whose command
wrote it last (placed its block, or cleared it):

================  ======  ===================================================================================
level key         points  value
================  ======  ===================================================================================
level/commands    0.5     fraction of agents owning at least one correct cell; stop when none does
level/coverage    2.5     max(0, (correct - extra) / |T|): coverage of the target minus extra blocks
level/exact       1.0     the grid is exactly the target
level/palette     -0.5    mean over the target's materials of the fraction of its cells not correct
level/invalid     -0.5    min(1, rejected commands / 4), all agents together: 0.125 points per rejected command
================  ======  ===================================================================================

Only blocks of the target pay: a valid command that builds nothing of it (a no-op ``air``, a token block
of a teammate's material, a block in the wrong place) earns no ``level/commands`` and does not lower
``level/palette``; the invalid penalty counts rejected commands, so valid filler lines cannot dilute it.
``level/coverage`` and ``level/exact`` are 0 after the stop; the penalties always count, so an answer
that builds nothing of the target scores -0.5 (every material missing) and 0.125 less per rejected
command, at least -1.0. Other score keys:
``metric/iou`` (shape IoU of built and T), ``metric/accuracy`` (correct / |T|), ``metric/extra``
(extra / |T|), ``metric/n_commands``, ``metric/n_invalid``, ``metric/agent_<i>_valid``. ``evaluate``
adds ``blocks/iou`` and ``blocks/exact``.

Multi-turn (``transition="feedback"``, default): the next prompt repeats the task, shows the agent's
previous commands, the grid the team built (layers as text), its rejected commands with the reason,
what is still missing (as boxes, the agent's own part first) and what is extra; the agent writes its
complete command list again (it runs on an empty grid). ``transition="plain"`` only shows the grid.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any

import datasets

from .blocks_world import (  # noqa: F401 (re-exported)
    AIR,
    EMPTY,
    MAX_COMMANDS,
    BlocksTask,
    Command,
    apply_commands,
    boxes,
    build,
    command_lines,
    fill_text,
    layers_text,
    oracle_commands,
    parse_command,
    read_commands,
    render_layers,
)
from .core.base import Env, Formatter, TeamReward, agent_formatters, check_choices, summarize_scores
from .core.loaders import DatasetError, load_rows
from .core.registry import register

KINDS = ("str_build", "house_build")
TRANSITIONS = ("feedback", "plain")
LEVELS = ("level/commands", "level/coverage", "level/exact", "level/palette", "level/invalid")
WEIGHTS = {
    "level/commands": 0.5,
    "level/coverage": 2.5,
    "level/exact": 1.0,
    "level/palette": -0.5,
    "level/invalid": -0.5,
}
MAX_REWARD = 4.0
SPLIT_SEEDS = {"train": (0, 400), "test": (100_000, 100)}  # first seed, number of tasks
MAX_LISTED = 12  # boxes / rejected commands listed in feedback
INVALID_UNIT = 4  # rejected commands that cost the whole level/invalid penalty

# 3x5 pixel font: five rows of three columns, top row first
FONT = {
    "A": ("###", "#.#", "###", "#.#", "#.#"),
    "B": ("##.", "#.#", "##.", "#.#", "##."),
    "C": ("###", "#..", "#..", "#..", "###"),
    "D": ("##.", "#.#", "#.#", "#.#", "##."),
    "E": ("###", "#..", "##.", "#..", "###"),
    "F": ("###", "#..", "##.", "#..", "#.."),
    "G": ("###", "#..", "#.#", "#.#", "###"),
    "H": ("#.#", "#.#", "###", "#.#", "#.#"),
    "I": ("###", ".#.", ".#.", ".#.", "###"),
    "J": ("..#", "..#", "..#", "#.#", "###"),
    "K": ("#.#", "#.#", "##.", "#.#", "#.#"),
    "L": ("#..", "#..", "#..", "#..", "###"),
    "M": ("#.#", "###", "###", "#.#", "#.#"),
    "N": ("##.", "#.#", "#.#", "#.#", "#.#"),
    "O": ("###", "#.#", "#.#", "#.#", "###"),
    "P": ("###", "#.#", "###", "#..", "#.."),
    "Q": ("###", "#.#", "#.#", "###", "..#"),
    "R": ("##.", "#.#", "##.", "#.#", "#.#"),
    "S": ("###", "#..", "###", "..#", "###"),
    "T": ("###", ".#.", ".#.", ".#.", ".#."),
    "U": ("#.#", "#.#", "#.#", "#.#", "###"),
    "V": ("#.#", "#.#", "#.#", "#.#", ".#."),
    "W": ("#.#", "#.#", "###", "###", "#.#"),
    "X": ("#.#", "#.#", ".#.", "#.#", "#.#"),
    "Y": ("#.#", "#.#", ".#.", ".#.", ".#."),
    "Z": ("###", "..#", ".#.", "#..", "###"),
}
WORDS = (
    "AI", "GO", "HI", "OK", "UP", "RL", "ML", "NO", "ON", "IT",
    "CAT", "DOG", "SUN", "MAP", "BOX", "RED", "SKY", "FOX", "OWL", "JAM",
    "TREE", "LAMP", "FISH", "BIRD", "WOLF", "MOON", "STAR", "KING", "ZERO", "QUIZ",
)  # fmt: skip
COLOURS = (("red_wool", "R"), ("yellow_wool", "Y"), ("orange_wool", "O"), ("lime_wool", "L"))
COLOURS_2 = (("blue_wool", "B"), ("cyan_wool", "C"), ("purple_wool", "P"), ("black_wool", "K"))
FLOORS = ("oak_planks", "birch_planks")
WALLS = ("cobblestone", "stone_bricks", "bricks")
ROOFS = ("spruce_planks", "dark_oak_planks")

# --- tasks ---------------------------------------------------------------------------------------


def str_task(seed: int, task_id: str | None = None) -> BlocksTask:
    """A word on a wall: letters at x = 1 + 4i .. 3 + 4i, font row 0 at y=4, on z=0; alternating owners."""
    rng = random.Random(f"str_build-{seed}")
    word = rng.choice(WORDS)
    (block_1, char_1), (block_2, char_2) = rng.choice(COLOURS), rng.choice(COLOURS_2)
    target = {}
    for i, letter in enumerate(word):
        block = block_1 if i % 2 == 0 else block_2
        for row, line in enumerate(FONT[letter]):
            for col, pixel in enumerate(line):
                if pixel == "#":
                    target[(1 + 4 * i + col, 4 - row, 0)] = block
    first, second = (
        ("the letter " if len(word) <= k + 2 else "the letters ")
        + ", ".join(f"{word[i]} (letter {i + 1})" for i in range(k, len(word), 2))
        for k in (0, 1)
    )
    return BlocksTask(
        task_id=task_id or f"str_build-{seed}",
        kind="str_build",
        size=(4 * len(word) + 1, 6, 1),
        target=target,
        palettes=((block_1,), (block_2,)),
        parts=(f"{first} in {block_1}", f"{second} in {block_2}"),
        legend=((char_1, block_1), (char_2, block_2)),
        word=word,
    )


def house_task(seed: int, task_id: str | None = None) -> BlocksTask:
    """A house on an 8x6x8 grid: floor (y=0), walls with a door and windows, a flat roof (module docstring)."""
    rng = random.Random(f"house_build-{seed}")
    w, d, h = rng.randint(4, 6), rng.randint(4, 6), rng.randint(2, 3)
    x0, z0 = rng.randint(0, 8 - w), rng.randint(0, 8 - d)
    floor, wall, roof = rng.choice(FLOORS), rng.choice(WALLS), rng.choice(ROOFS)
    xs, zs = range(x0, x0 + w), range(z0, z0 + d)
    target: dict[tuple[int, int, int], str] = {}
    for x in xs:
        for z in zs:
            target[(x, 0, z)] = floor
            target[(x, h + 1, z)] = roof
            if x in (x0, x0 + w - 1) or z in (z0, z0 + d - 1):
                for y in range(1, h + 1):
                    target[(x, y, z)] = wall
    if w >= 5 and d >= 5 and h + 2 < 6:  # a second, inset roof layer
        for x in range(x0 + 1, x0 + w - 1):
            for z in range(z0 + 1, z0 + d - 1):
                target[(x, h + 2, z)] = roof
    # the walls' cells that are not corners, per side: (side name, cells along it at y=0)
    sides = {
        "north": [(x, z0) for x in xs[1:-1]],
        "south": [(x, z0 + d - 1) for x in xs[1:-1]],
        "west": [(x0, z) for z in zs[1:-1]],
        "east": [(x0 + w - 1, z) for z in zs[1:-1]],
    }
    door_side = rng.choice(sorted(sides))
    dx, dz = rng.choice(sides[door_side])
    for y in (1, 2):
        target.pop((dx, y, dz), None)
    windows = [s for s in sorted(sides) if s != door_side]
    for side in rng.sample(windows, rng.randint(1, 3)):
        wx, wz = rng.choice(sides[side])
        target[(wx, 2, wz)] = "glass"
    return BlocksTask(
        task_id=task_id or f"house_build-{seed}",
        kind="house_build",
        size=(8, 6, 8),
        target=target,
        palettes=((floor, wall), ("glass", roof)),
        parts=(f"the floor ({floor}) and the walls ({wall})", f"the windows (glass) and the roof ({roof})"),
        legend=(("F", floor), ("W", wall), ("G", "glass"), ("R", roof)),
    )


def make_task(kind: str, seed: int) -> BlocksTask:
    """The task of ``kind`` for ``seed`` (the same seed always gives the same task)."""
    if kind == "str_build":
        return str_task(seed)
    if kind == "house_build":
        return house_task(seed)
    raise ValueError(f"blocks: unknown task kind '{kind}'; choose one of {', '.join(KINDS)}.")


def task_to_row(task: BlocksTask, seed: int) -> dict:
    """The dataset row of a task (the target as text layers, see :func:`render_layers`)."""
    return {
        "task_id": task.task_id,
        "kind": task.kind,
        "seed": seed,
        "size": list(task.size),
        "layers": render_layers(task, task.target),
        "legend": json.dumps(dict(task.legend)),
        "palettes": [list(p) for p in task.palettes],
        "parts": list(task.parts),
        "max_commands": task.max_commands,
        "word": task.word,
    }


_TASK_CACHE: dict[str, BlocksTask] = {}


def task_from_row(row: dict) -> BlocksTask:
    """The task of a row: from its ``layers`` text (and legend, palettes, parts)."""
    key = json.dumps([row.get("task_id"), row["layers"], row["legend"], row["palettes"], row.get("max_commands")])
    task = _TASK_CACHE.get(key)
    if task is None:
        task = _parse_row(row)
        if len(_TASK_CACHE) > 4096:
            _TASK_CACHE.clear()
        _TASK_CACHE[key] = task
    return task


def _parse_row(row: dict) -> BlocksTask:
    legend = json.loads(row["legend"]) if isinstance(row["legend"], str) else dict(row["legend"])
    sx, sy, sz = (int(v) for v in row["size"])
    layers = list(row["layers"])
    if len(layers) != sy:
        raise ValueError(f"'layers' has {len(layers)} layers for a grid {sy} high")
    target = {}
    for y, layer in enumerate(layers):
        rows = layer.split("\n")
        if len(rows) != sz or any(len(r) != sx for r in rows):
            raise ValueError(f"layer y={y} is not {sz} rows of {sx} characters")
        for z, line in enumerate(rows):
            for x, ch in enumerate(line):
                if ch != EMPTY:
                    if ch not in legend:
                        raise ValueError(f"layer y={y} has '{ch}', which the legend does not define")
                    target[(x, y, z)] = legend[ch]
    palettes = tuple(tuple(p) for p in row["palettes"])
    return BlocksTask(
        task_id=str(row.get("task_id", "")),
        kind=str(row.get("kind", "")),
        size=(sx, sy, sz),
        target=target,
        palettes=palettes,
        parts=tuple(row.get("parts") or [f"your part ({', '.join(p)})" for p in palettes]),
        legend=tuple(legend.items()),
        max_commands=int(row.get("max_commands") or MAX_COMMANDS),
        word=str(row.get("word") or ""),
    )


# --- scoring -------------------------------------------------------------------------------------


@dataclass(kw_only=True)
class BlocksJudgement:
    """One joint answer: its commands, the grid they build and the levels."""

    task: BlocksTask
    commands: list[Command]
    grid: dict[tuple[int, int, int], str]
    levels: dict[str, float]
    metrics: dict[str, float]

    @property
    def reward(self) -> float:
        return sum(WEIGHTS[k] * v for k, v in self.levels.items())

    def scores(self) -> dict[str, float]:
        return {"reward": self.reward, **self.levels, **self.metrics}

    @property
    def missing(self) -> dict[tuple[int, int, int], str]:
        return {c: b for c, b in self.task.target.items() if self.grid.get(c) != b}

    @property
    def extra(self) -> dict[tuple[int, int, int], str]:
        return {c: b for c, b in self.grid.items() if self.task.target.get(c) != b}


def palettes_for(task: BlocksTask, num_agents: int) -> tuple[tuple[str, ...], ...]:
    """Each agent's palette; one agent gets every palette's blocks."""
    if num_agents == 1:
        return (tuple(dict.fromkeys(b for p in task.palettes for b in p)),)
    return task.palettes


def judge(task: BlocksTask, replies: list[str]) -> BlocksJudgement:
    """Score one joint answer (module docstring)."""
    n = len(replies)
    palettes = palettes_for(task, n)
    limit = task.max_commands * (len(task.palettes) if n == 1 else 1)
    per_agent = [read_commands(r, i, task=task, palette=palettes[i], limit=limit) for i, r in enumerate(replies)]
    commands = [c for cs in per_agent for c in cs]
    grid, owner = build(commands)
    target = task.target
    right = [c for c, b in target.items() if grid.get(c) == b]
    correct = len(right)
    extra = sum(target.get(c) != b for c, b in grid.items())
    overlap = len(set(grid) & set(target))
    union = len(set(grid) | set(target))
    n_invalid = sum(not c.valid for c in commands)
    # an agent is active when a correct cell is its doing: a valid command that builds nothing of the target
    # (a no-op, a token block anywhere) earns nothing
    active = [any(owner[c] == i for c in right) for i in range(n)]
    levels = {k: 0.0 for k in LEVELS}
    levels["level/commands"] = sum(active) / n
    if any(active):
        size = len(target)
        levels["level/coverage"] = max(0.0, (correct - extra) / size) if size else float(not grid)
        levels["level/exact"] = float(grid == target)
    # the penalties always count: placing nothing leaves every material missing. A material is missing in
    # proportion to its cells not built (one block of it somewhere does not make it used); the invalid penalty
    # counts rejected commands (a ratio would let valid filler lines dilute it)
    per_material: dict[str, list[bool]] = {}
    for c, b in target.items():
        per_material.setdefault(b, []).append(grid.get(c) == b)
    levels["level/palette"] = (
        sum(1 - sum(ok) / len(ok) for ok in per_material.values()) / len(per_material) if per_material else 0.0
    )
    levels["level/invalid"] = min(1.0, n_invalid / INVALID_UNIT)
    metrics = {
        "metric/iou": overlap / union if union else 1.0,
        "metric/accuracy": correct / len(target) if target else 1.0,
        "metric/extra": extra / len(target) if target else float(extra),
        "metric/n_commands": float(len(commands)),
        "metric/n_invalid": float(n_invalid),
        **{f"metric/agent_{i + 1}_valid": float(sum(c.valid for c in cs)) for i, cs in enumerate(per_agent)},
    }
    return BlocksJudgement(task=task, commands=commands, grid=grid, levels=levels, metrics=metrics)


class BlocksReward(TeamReward):
    """The tiered building reward (module docstring)."""

    level_names = LEVELS
    max_reward = MAX_REWARD

    def judge(self, agent_completions: list[list[str]], rows: list[dict]) -> list[BlocksJudgement]:
        return [judge(task_from_row(row), [c[j] for c in agent_completions]) for j, row in enumerate(rows)]

    def score_batch(self, agent_completions: list[list[str]], rows: list[dict]) -> list[dict[str, float]]:
        return [j.scores() for j in self.judge(agent_completions, rows)]


def _box_list(cells: dict[tuple[int, int, int], str]) -> list[str]:
    found = boxes(cells)
    lines = [fill_text(box, block).removeprefix("/fill ") for box, block in found[:MAX_LISTED]]
    if len(found) > MAX_LISTED:
        lines.append(f"... and {len(found) - MAX_LISTED} more boxes")
    return lines


def feedback_text(j: BlocksJudgement, agent: int, num_agents: int, detailed: bool = True) -> str:
    """The team's grid and, when ``detailed``, what ``agent`` should fix (rejected commands, missing, extra)."""
    task = j.task
    parts = [f"The grid your team's commands built:\n{layers_text(task, j.grid)}"]
    if not detailed:
        return parts[0]
    rejected = [c for c in j.commands if not c.valid and c.agent == agent]
    if rejected:
        lines = [f"- `{c.line}`: {c.error}" for c in rejected[:MAX_LISTED]]
        parts.append("Your rejected commands:\n" + "\n".join(lines))
    mine = set(palettes_for(task, num_agents)[agent])
    missing = j.missing
    own = {c: b for c, b in missing.items() if b in mine}
    others = len(missing) - len(own)
    if own:
        parts.append(
            f"Still missing from your part ({len(own)} blocks; x1 y1 z1 x2 y2 z2 block):\n" + "\n".join(_box_list(own))
        )
    if others:
        parts.append(f"Still missing from your teammate's part: {others} blocks.")
    extra = j.extra
    if extra:
        parts.append(f"Extra or wrong blocks that should not be there ({len(extra)}):\n" + "\n".join(_box_list(extra)))
    if not missing and not extra:
        parts.append("The grid matches the target.")
    return "\n\n".join(parts)


# --- the environment -----------------------------------------------------------------------------

COMMAND_HELP = (
    "Commands, one per line:\n"
    "/fill x1 y1 z1 x2 y2 z2 block   (fills the box between the two corners, inclusive; 'air' clears it)\n"
    "/setblock x y z block           (one cell)\n"
)


def generate_rows(kinds: tuple[str, ...], split: str) -> list[dict]:
    """The generated tasks of a split: seeds from SPLIT_SEEDS, kinds in turn."""
    if split not in SPLIT_SEEDS:
        raise DatasetError(f"blocks: unknown split '{split}'; choose one of {', '.join(SPLIT_SEEDS)}.")
    first, count = SPLIT_SEEDS[split]
    rows = []
    for i in range(count):
        seed, kind = first + i, kinds[i % len(kinds)]
        rows.append(task_to_row(make_task(kind, seed), seed))
    return rows


@register("blocks")
class BlocksEnv(Env):
    """Build a target in a voxel grid with /fill commands; each agent its own palette and part."""

    name = "blocks"
    description = "block world: build a word (str_build) or a house (house_build) with /fill commands"
    defaults = {"max_new_tokens": 256, "num_turns": 1}
    agent_counts = (1, 2)
    default_data = (
        "generated in code, deterministic by seed: str_build and house_build in turn; "
        f"splits train ({SPLIT_SEEDS['train'][1]} tasks), test ({SPLIT_SEEDS['test'][1]})"
    )

    def __init__(
        self,
        num_agents: int = 2,
        *,
        kinds: tuple[str, ...] | list[str] | str = KINDS,
        transition: str = "feedback",
    ) -> None:
        """``kinds``: the task kinds ``load_dataset()`` generates (``str_build``, ``house_build``), in turn;
        ``transition``: ``feedback`` (grid, rejected commands, missing and extra blocks) or ``plain`` (grid)."""
        super().__init__(num_agents)
        self.kinds = check_choices(self.name, "kinds", kinds, KINDS)
        [self.transition] = check_choices(self.name, "transition", [transition], TRANSITIONS)
        self.reward_func = BlocksReward(num_agents, self.name)
        self.external_transition = self._transition

    def roles(self) -> list[str]:
        if self.num_agents == 1:
            return ["the whole target"]
        return ["agent 1's part of the target (its palette)", "agent 2's part of the target (its palette)"]

    def _prompt(self, row: dict, agent: int | None) -> str:
        task = task_from_row(row)
        sx, sy, sz = task.size
        what = f"the word {task.word} in pixel letters on a wall" if task.kind == "str_build" else "a house"
        legend = ", ".join(f"{c} = {b}" for c, b in task.legend) + ", . = empty"
        grid = f"The grid: x = 0..{sx - 1} (west to east), y = 0..{sy - 1} (up), z = 0..{sz - 1} (north to south)."
        if agent is None:
            palette = palettes_for(task, 1)[0]
            intro = (
                f"Build {what} in a block world. {grid} Build every block of the target, nothing else.\n"
                f"Your palette: {', '.join(palette)} (and air). At most {task.max_commands * len(task.palettes)} "
                "commands; commands outside the grid or with other blocks are rejected."
            )
        else:
            mine, theirs = task.palettes[agent], task.palettes[1 - agent]
            order = (
                "Your commands run first, then your teammate's."
                if agent == 0
                else ("Your teammate's commands run first, then yours.")
            )
            intro = (
                f"You and a teammate build {what} in a block world. {grid}\n"
                f"You build {task.parts[agent]}; your teammate builds {task.parts[1 - agent]}. Build only your "
                f"part.\nYour palette: {', '.join(mine)} (and air); your teammate's: {', '.join(theirs)}. "
                f"At most {task.max_commands} commands; commands outside the grid or with blocks outside your "
                f"palette are rejected. {order}"
            )
        block = (palettes_for(task, 1)[0] if agent is None else task.palettes[agent])[0]
        return (
            f"{intro}\n\n{COMMAND_HELP}For example, /fill 0 0 0 1 0 0 {block} puts {block} on the two cells "
            f"x=0..1 at y=0, z=0.\n\nTarget ({legend}):\n{layers_text(task, task.target)}\n\n"
            "Reply with only your commands, one per line."
        )

    def formatters(self) -> list[Formatter]:
        return agent_formatters(self._prompt, self.num_agents)

    def single_formatter(self) -> Formatter:
        return lambda row: self._prompt(row, None)

    def split_single(self, answer: str, row: dict) -> list[str]:
        """One model's commands -> each to the agent whose palette has its block; ``air`` and unreadable
        lines go with the previous command's agent (agent 1 at the start)."""
        if self.num_agents == 1:
            return [answer]
        task = task_from_row(row)
        out: list[list[str]] = [[], []]
        owner = 0
        for line in command_lines(answer):
            words = line.split()
            block = words[-1].lower().removeprefix("minecraft:") if words else ""
            if block in task.palettes[1]:
                owner = 1
            elif block in task.palettes[0]:
                owner = 0
            out[owner].append(line)
        return ["\n".join(lines) for lines in out]

    def _transition(self, *, batch_item: dict, agent_completions: list[str], turn: int = 1, **kwargs: Any) -> list[str]:
        """Next prompt of each agent: the task, its previous commands, the built grid and what to fix."""
        [j] = self.reward_func.judge([[c] for c in agent_completions], [batch_item])
        prompts = []
        for i, fmt in enumerate(self.formatters()):
            previous = "\n".join(command_lines(agent_completions[i])) or "(no commands)"
            feedback = feedback_text(j, i, self.num_agents, detailed=self.transition == "feedback")
            prompts.append(
                f"{fmt(batch_item).rstrip()}\n\nYour previous commands:\n{previous}\n\n{feedback}\n\n"
                "Write your complete, corrected command list (it runs on an empty grid again). "
                "Reply with only your commands, one per line."
            )
        return prompts

    def evaluate(self, agent_completions: list[list[str]], batch_items: list[dict]) -> dict[str, float]:
        """``summarize_scores`` plus ``blocks/iou`` and ``blocks/exact``."""
        out = summarize_scores(self.reward_func.score(*agent_completions, batch_items=batch_items))
        out["blocks/iou"] = out.get("metric/iou", 0.0)
        out["blocks/exact"] = out.get("level/exact", 0.0)
        return out

    def load_dataset(self, source: Any = None, split: str = "train", limit: int | None = None) -> datasets.Dataset:
        """Tasks. ``source`` None: generated in code (:func:`make_task`, the env's ``kinds`` in turn), split
        ``train`` seeds 0-399, ``test`` seeds 100000-100099, never any file or the network. Else a local
        JSON/JSONL file (or rows) in the row schema of :func:`task_to_row` (``size``, ``layers``, ``legend``,
        ``palettes``; ``parts``, ``max_commands``, ``task_id``, ``kind``, ``word`` optional)."""

        def normalize(row: dict, index: int) -> dict:
            task = _parse_row(row)
            return {**task_to_row(task, int(row.get("seed") or 0)), "task_id": task.task_id or str(index)}

        return load_rows(
            source,
            split=split,
            limit=limit,
            required=["size", "layers", "legend", "palettes"],
            normalize=normalize,
            default=lambda s: generate_rows(self.kinds, s),
            default_label=f"blocks tasks generated in code ({', '.join(self.kinds)})",
            env_name=self.name,
        )
