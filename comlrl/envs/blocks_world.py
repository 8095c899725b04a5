"""The voxel world of ``blocks`` (:mod:`.blocks`): a task's grid and target, agents' ``/fill`` and ``/setblock``
commands checked against it, the grid they build, its text rendering, and the box cover of a target.

A command line is ``/fill x1 y1 z1 x2 y2 z2 block`` or ``/setblock x y z block`` (the slash optional before a
number; list markers and backticks ignored); it is rejected when it is malformed, leaves the grid, names a block
outside the agent's palette (``air`` always allowed, to clear) or comes after the command limit.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

AIR = "air"
EMPTY = "."
MAX_COMMANDS = 24  # per agent and task


@dataclass(frozen=True, kw_only=True)
class BlocksTask:
    """A target: grid size, target cells -> block, each agent's palette and part, the command limit."""

    task_id: str
    kind: str
    size: tuple[int, int, int]  # x, y, z extents
    target: dict[tuple[int, int, int], str] = field(hash=False, compare=False)
    palettes: tuple[tuple[str, ...], ...]
    parts: tuple[str, ...]  # each agent's part, in words
    legend: tuple[tuple[str, str], ...]  # (character, block)
    max_commands: int = MAX_COMMANDS
    word: str = ""

    @property
    def materials(self) -> set[str]:
        return set(self.target.values())

    def char(self, block: str) -> str:
        return next((c for c, b in self.legend if b == block), "?")

    def in_bounds(self, x: int, y: int, z: int) -> bool:
        return 0 <= x < self.size[0] and 0 <= y < self.size[1] and 0 <= z < self.size[2]


# --- commands and the grid ---------------------------------------------------------------------

# "/fill ..." (anything after it), or "fill 1 ..." without the slash (so prose like "Fill the wall" is no command)
_COMMAND = re.compile(
    r"^\s*(?:[-*>]|\d+[.)])?\s*`?\s*(?:/\s*(?P<verb>fill|setblock)\b|(?P<bare>fill|setblock)(?=\s+[-~^\d]))(?P<rest>.*)$",
    re.I,
)
_BLOCK = re.compile(r"^(?:minecraft:)?([a-z_]+)$")


@dataclass(frozen=True, kw_only=True)
class Command:
    """A command line of an agent: the box it fills and the block, or why it was rejected."""

    agent: int
    line: str
    box: tuple[int, int, int, int, int, int] | None = None  # x1, y1, z1, x2, y2, z2 (ordered)
    block: str = ""
    error: str = ""  # empty when valid

    @property
    def valid(self) -> bool:
        return not self.error


def command_lines(text: str) -> list[str]:
    """The command lines of ``text`` (``/fill``, ``/setblock``, the slash optional before a number), each as
    ``/verb rest`` without list markers or backticks."""
    out = []
    for line in text.splitlines():
        match = _COMMAND.match(line)
        if match is not None:
            verb = (match.group("verb") or match.group("bare")).lower()
            out.append(f"/{verb} {match.group('rest').strip().rstrip('`').strip()}".strip())
    return out


def parse_command(line: str, agent: int, task: BlocksTask, palette: tuple[str, ...]) -> Command:
    """Check one command line (syntax, bounds, palette); the count limit is checked by :func:`read_commands`."""
    match = _COMMAND.match(line)
    if match is None:
        return Command(agent=agent, line=line, error="not a command")
    verb = (match.group("verb") or match.group("bare")).lower()
    rest = match.group("rest").strip().rstrip("`").split()
    want = 7 if verb == "fill" else 4
    if len(rest) < want or not all(re.fullmatch(r"-?\d+", t) for t in rest[: want - 1]):
        return Command(
            agent=agent, line=line, error=f"not '/{verb} {'x1 y1 z1 x2 y2 z2' if verb == 'fill' else 'x y z'} block'"
        )
    if len(rest) > want and rest[want:] != ["replace"]:
        return Command(agent=agent, line=line, error="unexpected words after the block")
    coords = [int(t) for t in rest[: want - 1]]
    if verb == "setblock":
        coords = coords * 2
    block_match = _BLOCK.match(rest[want - 1].lower())
    if block_match is None:
        return Command(agent=agent, line=line, error=f"'{rest[want - 1]}' is not a block name")
    block = block_match.group(1)
    x1, y1, z1, x2, y2, z2 = coords
    box = (min(x1, x2), min(y1, y2), min(z1, z2), max(x1, x2), max(y1, y2), max(z1, z2))
    if not (task.in_bounds(*box[:3]) and task.in_bounds(*box[3:])):
        sx, sy, sz = task.size
        return Command(
            agent=agent,
            line=line,
            box=box,
            block=block,
            error=f"outside the grid (x 0-{sx - 1}, y 0-{sy - 1}, z 0-{sz - 1})",
        )
    if block != AIR and block not in palette:
        return Command(
            agent=agent, line=line, box=box, block=block, error=f"{block} is not in your palette ({', '.join(palette)})"
        )
    return Command(agent=agent, line=line, box=box, block=block)


def read_commands(text: str, agent: int, *, task: BlocksTask, palette: tuple[str, ...], limit: int) -> list[Command]:
    """Every command line of one agent's answer, checked; those after the first ``limit`` are rejected."""
    out = []
    for line in command_lines(text):
        command = parse_command(line, agent, task, palette)
        if len(out) >= limit:
            command = Command(
                agent=agent,
                line=line,
                box=command.box,
                block=command.block,
                error=f"over the limit of {limit} commands",
            )
        out.append(command)
    return out


def apply_commands(commands: list[Command]) -> dict[tuple[int, int, int], str]:
    """The grid (filled cells -> block) after the valid commands, in order, from an empty grid."""
    return build(commands)[0]


def build(commands: list[Command]) -> tuple[dict[tuple[int, int, int], str], dict[tuple[int, int, int], int]]:
    """The grid after the valid commands (as :func:`apply_commands`) and each written cell's owner: the agent
    whose command wrote it last (placed a block or cleared it)."""
    grid: dict[tuple[int, int, int], str] = {}
    owner: dict[tuple[int, int, int], int] = {}
    for c in commands:
        if not c.valid or c.box is None:
            continue
        x1, y1, z1, x2, y2, z2 = c.box
        for x in range(x1, x2 + 1):
            for y in range(y1, y2 + 1):
                for z in range(z1, z2 + 1):
                    owner[(x, y, z)] = c.agent
                    if c.block == AIR:
                        grid.pop((x, y, z), None)
                    else:
                        grid[(x, y, z)] = c.block
    return grid, owner


def render_layers(task: BlocksTask, grid: dict[tuple[int, int, int], str]) -> list[str]:
    """One text layer per height y (bottom first): rows z = 0.., columns x = 0..; '.' empty, '?' a block
    outside the legend."""
    sx, sy, sz = task.size
    return [
        "\n".join(
            "".join(task.char(grid[(x, y, z)]) if (x, y, z) in grid else EMPTY for x in range(sx)) for z in range(sz)
        )
        for y in range(sy)
    ]


def layers_text(task: BlocksTask, grid: dict[tuple[int, int, int], str]) -> str:
    """The grid for a prompt: a wall (one z) as its front view, top row first; else each layer y, top first."""
    layers = render_layers(task, grid)
    sx, sy, sz = task.size
    if sz == 1:
        lines = [f"y={y}  {layers[y]}" for y in reversed(range(sy))]
        return f"Front view of the wall z=0 (top row y={sy - 1}, columns x=0..{sx - 1}):\n" + "\n".join(lines)
    parts = [f"Layers from the top (rows z=0..{sz - 1} top to bottom, columns x=0..{sx - 1} left to right):"]
    for y in reversed(range(sy)):
        parts.append(f"y={y}:\n{layers[y]}")
    return "\n".join(parts)


def _all_block(cells: dict[tuple[int, int, int], str], block: str, xs: range, ys: range, zs: range) -> bool:
    return all(cells.get((a, b, c)) == block for a in xs for b in ys for c in zs)


def boxes(cells: dict[tuple[int, int, int], str]) -> list[tuple[tuple[int, int, int, int, int, int], str]]:
    """Cover ``cells`` (cell -> block) with boxes of one block each: (x1, y1, z1, x2, y2, z2), block.

    Greedy: from each uncovered cell (by y, z, x) grow along x, then z, then y while every cell is in
    ``cells`` with the same block."""
    covered: set[tuple[int, int, int]] = set()
    out = []
    for cell in sorted(cells, key=lambda c: (c[1], c[2], c[0])):
        if cell in covered:
            continue
        x, y, z = cell
        block = cells[cell]
        x2 = x
        while _all_block(cells, block, range(x2 + 1, x2 + 2), range(y, y + 1), range(z, z + 1)):
            x2 += 1
        z2 = z
        while _all_block(cells, block, range(x, x2 + 1), range(y, y + 1), range(z2 + 1, z2 + 2)):
            z2 += 1
        y2 = y
        while _all_block(cells, block, range(x, x2 + 1), range(y2 + 1, y2 + 2), range(z, z2 + 1)):
            y2 += 1
        for a in range(x, x2 + 1):
            for b in range(y, y2 + 1):
                for c in range(z, z2 + 1):
                    covered.add((a, b, c))
        out.append(((x, y, z, x2, y2, z2), block))
    return out


def fill_text(box: tuple[int, ...], block: str) -> str:
    return "/fill " + " ".join(map(str, box)) + f" {block}"


def oracle_commands(task: BlocksTask, num_agents: int = 2) -> list[str]:
    """A command list per agent that builds the target exactly (each agent its palette's cells)."""
    palettes = task.palettes if num_agents > 1 else (tuple(b for p in task.palettes for b in p),)
    return [
        "\n".join(fill_text(box, block) for box, block in boxes({c: b for c, b in task.target.items() if b in p}))
        for p in palettes
    ]
