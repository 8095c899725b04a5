"""blocks (a voxel world built with /fill): command checks, hand-computed reward levels, generated tasks and
their oracles, the multi-turn feedback, loaders and a 2-step training through the real reward path."""

import json

import pytest

import comlrl.envs as envs
from comlrl.envs import DatasetError
from comlrl.envs.blocks import (
    FONT,
    MAX_REWARD,
    apply_commands,
    boxes,
    command_lines,
    feedback_text,
    judge,
    make_task,
    oracle_commands,
    parse_command,
    task_from_row,
    task_to_row,
)

# A 4x2x1 wall: A = red_wool (agent 1), B = blue_wool (agent 2); |T| = 4, two materials.
ROW = {
    "task_id": "toy",
    "kind": "str_build",
    "size": [4, 2, 1],
    "layers": ["AAB.", "A..."],  # y=0, y=1 (one row each: z=0)
    "legend": json.dumps({"A": "red_wool", "B": "blue_wool"}),
    "palettes": [["red_wool"], ["blue_wool"]],
    "parts": ["the red cells", "the blue cell"],
    "max_commands": 4,
}
TASK = task_from_row(ROW)
RED = "/fill 0 0 0 1 0 0 red_wool\n/setblock 0 1 0 red_wool"
BLUE = "/setblock 2 0 0 blue_wool"


def score(c1, c2, row=ROW):
    return judge(task_from_row(row), [c1, c2]).scores()


def test_command_checks():
    palette = ("red_wool",)
    c = parse_command("/fill 1 0 0 0 0 0 minecraft:red_wool", 0, TASK, palette)
    assert c.valid and c.box == (0, 0, 0, 1, 0, 0) and c.block == "red_wool"  # corners in any order
    assert parse_command("fill 0 0 0 0 0 0 red_wool replace", 0, TASK, palette).valid
    assert parse_command("/setblock 3 1 0 air", 0, TASK, palette).valid  # air is always allowed
    assert parse_command("/fill 0 0 0 4 0 0 red_wool", 0, TASK, palette).error.startswith("outside the grid")
    assert parse_command("/fill 0 0 0 0 0 0 blue_wool", 0, TASK, palette).error.startswith("blue_wool is not in")
    assert parse_command("/fill ~ 0 0 0 0 0 red_wool", 0, TASK, palette).error.startswith("not '/fill x1")
    assert parse_command("/fill 0 0 0 red_wool", 0, TASK, palette).error.startswith("not '/fill x1")
    assert (
        parse_command("/setblock 0 0 0 red_wool hollow", 0, TASK, palette).error == "unexpected words after the block"
    )
    text = "Fill the wall with red.\n1. /fill 0 0 0 0 0 0 red_wool\n- `setblock ~ 0 0 red_wool`\n/fill"
    assert command_lines(text) == ["/fill 0 0 0 0 0 0 red_wool", "/setblock ~ 0 0 red_wool", "/fill"]
    grid = apply_commands([parse_command(line, 0, TASK, palette) for line in RED.splitlines()])
    assert grid == {(0, 0, 0): "red_wool", (1, 0, 0): "red_wool", (0, 1, 0): "red_wool"}
    cleared = apply_commands(
        [parse_command(x, 0, TASK, palette) for x in ("/fill 0 0 0 3 1 0 red_wool", "/fill 1 0 0 3 1 0 air")]
    )
    assert sorted(cleared) == [(0, 0, 0), (0, 1, 0)]


def test_oracle_reaches_the_maximum():
    out = score(RED, BLUE)
    assert out["reward"] == MAX_REWARD == 4.0 and out["metric/iou"] == 1.0
    assert (
        score("Here you go:\n```\n- /fill 0 0 0 1 0 0 red_wool\n/setblock 0 1 0 red_wool\n```", BLUE)["reward"] == 4.0
    )


def test_empty_and_malformed_answers():
    for c1, c2 in [("", ""), ("I will build the red part.", "ok")]:  # no command: both materials unused
        out = score(c1, c2)
        assert out["level/commands"] == 0.0 and out["level/palette"] == 1.0 and out["level/invalid"] == 0.0
        assert out["reward"] == -0.5
    out = score("/fill 0 0 red_wool", "/setblock x y z blue_wool")  # only rejected commands: 0.125 points each
    assert out["level/commands"] == 0.0 and out["level/invalid"] == 0.5 and out["reward"] == -0.75
    out = score("/fill 0 0 red_wool\n" * 3, "/setblock x y z blue_wool\n" * 3)  # 4 or more: the whole penalty
    assert out["level/invalid"] == 1.0 and out["reward"] == -1.0
    out = score("/setblock 3 1 0 red_wool", "")  # one valid command, in the wrong place: no target block built
    assert out["level/commands"] == 0.0 and out["level/coverage"] == 0.0 and out["level/palette"] == 1.0
    assert out["reward"] == -0.5


def test_one_agent_builds_nothing():
    out = score(RED, "")
    # commands 1/2; coverage (3 - 0)/4; blue never placed -> palette 1/2
    assert out["level/commands"] == 0.5 and out["level/coverage"] == 0.75 and out["level/palette"] == 0.5
    assert out["reward"] == pytest.approx(0.25 + 2.5 * 0.75 - 0.25)


def test_extra_blocks():
    out = score(RED + "\n/setblock 3 0 0 red_wool", BLUE)  # one extra block: (4 - 1)/4
    assert out["level/coverage"] == 0.75 and out["level/exact"] == 0.0 and out["metric/iou"] == pytest.approx(0.8)
    assert out["reward"] == pytest.approx(0.5 + 2.5 * 0.75)
    flood = score("/fill 0 0 0 3 1 0 red_wool", BLUE)  # 8 cells, 4 right: coverage max(0, (4 - 4)/4)
    assert flood["level/coverage"] == 0.0 and flood["metric/accuracy"] == 1.0 and flood["reward"] == 0.5


def test_wrong_material_overwrites():
    out = score(RED, "/setblock 1 0 0 blue_wool")  # agent 2 runs last and puts blue on a red cell
    # correct 2 (two reds), extra 1 (blue on red's cell): (2 - 1)/4; agent 2 owns no correct cell: commands 1/2;
    # palette: red 1/3 missing, blue 1/1 missing -> mean 2/3
    assert out["level/coverage"] == 0.25 and out["level/commands"] == 0.5 and out["metric/extra"] == 0.25
    assert out["level/palette"] == pytest.approx(2 / 3)
    assert out["reward"] == pytest.approx(0.25 + 2.5 * 0.25 - 0.5 * 2 / 3)


def test_invalid_commands():
    out = score(RED + "\n/fill 0 0 0 9 0 0 red_wool", "/setblock 2 0 0 red_wool\n" + BLUE)
    # out of bounds + outside agent 2's palette: 2 rejected commands, 2/4 of the penalty; the grid is exact
    assert out["level/invalid"] == pytest.approx(0.5) and out["level/exact"] == 1.0 and out["metric/n_invalid"] == 2
    assert out["reward"] == pytest.approx(4.0 - 0.5 * 0.5)
    filler = "\n/setblock 0 1 0 red_wool" * 20  # valid filler lines (under a limit of 24) do not dilute the penalty
    padded = score(
        RED + "\n/fill 0 0 0 9 0 0 red_wool" + filler, "/setblock 2 0 0 red_wool\n" + BLUE, {**ROW, "max_commands": 24}
    )
    assert padded["reward"] == out["reward"]


def test_duplicated_work_hits_the_command_limit():
    row = {**ROW, "max_commands": 2}
    twice = "/fill 0 0 0 1 0 0 red_wool\n/fill 0 0 0 1 0 0 red_wool\n/setblock 0 1 0 red_wool"
    out = score(twice, BLUE, row)  # the third command is over the limit: rejected, its cell missing
    assert out["metric/n_invalid"] == 1 and out["level/coverage"] == 0.75
    assert out["level/palette"] == pytest.approx((1 / 3 + 0) / 2)  # a third of the red cells missing
    assert out["reward"] == pytest.approx(0.5 + 2.5 * 0.75 - 0.5 / 6 - 0.5 * 0.25)
    # both agents building the blue cell: agent 1 cannot (not its palette), its command is rejected
    out = score(RED + "\n/setblock 2 0 0 blue_wool", BLUE)
    assert out["level/invalid"] == pytest.approx(1 / 4) and out["level/exact"] == 1.0


def test_reward_contract_and_single_agent():
    env = envs.make("blocks")
    assert env.reward_func.max_reward == 4.0 and env.reward_func.batched
    assert env.reward_func([RED, ""], [BLUE, ""], batch_items=[ROW], turn=1) == [4.0, -0.5]
    single = envs.make("blocks", num_agents=1)
    assert single.reward_func([RED + "\n" + BLUE], batch_items=[ROW]) == [4.0]  # one agent: both palettes
    assert "red_wool, blue_wool (and air)" in single.formatters()[0](ROW)
    assert env.split_single(BLUE + "\n" + RED + "\n/setblock 3 0 0 air", ROW) == [RED + "\n/setblock 3 0 0 air", BLUE]
    with pytest.raises(ValueError, match="blocks: unknown kinds 'castle'; choose from str_build, house_build"):
        envs.make("blocks", kinds="castle")
    with pytest.raises(ValueError, match="unknown transition 'level_feedback'"):
        envs.make("blocks", transition="level_feedback")


def test_generated_tasks_are_deterministic_and_oracles_reach_the_maximum():
    assert task_to_row(make_task("house_build", 7), 7) == task_to_row(make_task("house_build", 7), 7)
    assert make_task("house_build", 7).target != make_task("house_build", 8).target
    env = envs.make("blocks")
    train, test = env.load_dataset(), env.load_dataset(split="test")
    assert (len(train), len(test)) == (400, 100) and not set(train["task_id"]) & set(test["task_id"])
    assert train[0]["kind"] == "str_build" and train[1]["kind"] == "house_build"
    rows = list(train) + list(test)
    for n in (1, 2):
        team = envs.make("blocks", num_agents=n)
        answers = [oracle_commands(task_from_row(r), n) for r in rows]
        out = team.evaluate([[a[i] for a in answers] for i in range(n)], rows)
        assert out["reward/mean"] == 4.0 and out["blocks/exact"] == 1.0 and out["level/invalid"] == 0.0
    assert max(len(c.splitlines()) for r in rows for c in oracle_commands(task_from_row(r))) <= 24
    assert set(envs.make("blocks", kinds=["house_build"]).load_dataset(limit=5)["kind"]) == {"house_build"}


def test_str_build_task_and_prompts():
    task = make_task("str_build", 3)
    word = task.word
    assert task.size == (4 * len(word) + 1, 6, 1)
    assert len(task.target) == sum(line.count("#") for letter in word for line in FONT[letter])
    row = task_to_row(task, 3)
    p1, p2 = (fmt(row) for fmt in envs.make("blocks").formatters())
    assert f"the word {word} in pixel letters" in p1 and "Front view of the wall z=0" in p1
    assert f"You build the letter{'s' if len(word) > 2 else ''} {word[0]} (letter 1)" in p1
    assert f"your teammate builds the letter{'s' if len(word) > 3 else ''} {word[1]} (letter 2)" in p1
    assert "Your commands run first" in p1 and "Your teammate's commands run first" in p2
    house = envs.make("blocks").formatters()[0](task_to_row(make_task("house_build", 1), 1))
    assert "Layers from the top" in house and "y=0:\n" in house and "You build the floor" in house


def test_boxes_cover_exactly():
    cells = {(x, y, 0): "a" for x in range(3) for y in range(2)} | {(5, 0, 0): "b"}
    assert boxes(cells) == [((0, 0, 0, 2, 1, 0), "a"), ((5, 0, 0, 5, 0, 0), "b")]


def test_feedback_shows_the_grid_missing_extra_and_rejected():
    j = judge(TASK, ["/setblock 0 0 0 red_wool\n/setblock 3 1 0 red_wool\n/fill 0 0 0 0 0 0 gold_block", ""])
    text = feedback_text(j, 0, 2)
    assert "y=1  ...A\ny=0  A..." in text  # the built grid, front view, top row first
    assert "`/fill 0 0 0 0 0 0 gold_block`: gold_block is not in your palette" in text
    assert "Still missing from your part (2 blocks" in text and "1 0 0 1 0 0 red_wool\n0 1 0 0 1 0 red_wool" in text
    assert "Still missing from your teammate's part: 1 blocks." in text
    assert "Extra or wrong blocks that should not be there (1):\n3 1 0 3 1 0 red_wool" in text
    assert "matches the target" in feedback_text(judge(TASK, [RED, BLUE]), 1, 2)
    env = envs.make("blocks")
    nxt = env.external_transition(batch_item=ROW, agent_completions=["hello", BLUE], turn=1)
    assert nxt[0].startswith(env.formatters()[0](ROW)) and "Your previous commands:\n(no commands)" in nxt[0]
    assert "Your previous commands:\n" + BLUE in nxt[1] and "runs on an empty grid" in nxt[1]
    plain = envs.make("blocks", transition="plain").external_transition(batch_item=ROW, agent_completions=["", ""])
    assert "The grid your team's commands built" in plain[0] and "missing" not in plain[0]


def test_local_file_and_errors(tmp_path):
    env = envs.make("blocks")
    rows = list(env.load_dataset(limit=4))
    path = tmp_path / "tasks.json"
    path.write_text(json.dumps(rows))
    assert list(env.load_dataset(str(path))) == rows
    path.write_text(json.dumps([{**ROW, "layers": ["AAB", "A..."]}]))
    with pytest.raises(DatasetError, match="layer y=0 is not 1 rows of 4 characters"):
        env.load_dataset(str(path))
    path.write_text(json.dumps([{**ROW, "layers": ["AAX.", "A..."]}]))
    with pytest.raises(DatasetError, match="'X', which the legend does not define"):
        env.load_dataset(str(path))
    with pytest.raises(DatasetError, match="unknown split 'validation'"):
        env.load_dataset(split="validation")


# --- the hack set: cheap answers that do not build the target score clearly below honest work ---------------------


def _bbox(cells):
    xs, ys, zs = zip(*cells)
    return (min(xs), min(ys), min(zs), max(xs), max(ys), max(zs))


def blocks_hacks(task):
    """Answers a policy under reward pressure could try instead of building its part."""
    from comlrl.envs.blocks import fill_text

    o1, o2 = oracle_commands(task)
    sx, sy, sz = task.size
    grid = (0, 0, 0, sx - 1, sy - 1, sz - 1)
    corner = f"{sx - 1} {sy - 1} {sz - 1}"
    p1, p2 = task.palettes
    cells = {m: [c for c, b in task.target.items() if b == m] for m in task.materials}
    return {
        "empty": ("", ""),
        "prose": ("I will build my part of the target now.", "Done, my part is built."),
        "echo the syntax": ("/fill x1 y1 z1 x2 y2 z2 block\n/setblock x y z block", "/fill x1 y1 z1 x2 y2 z2 block"),
        "lone agent 1": (o1, ""),
        "lone agent 1, teammate's no-op air": (o1, f"/setblock {corner} air"),
        "lone agent 1, teammate's token blocks": (o1, "\n".join(f"/setblock {corner} {m}" for m in p2)),
        "agent 1 builds everything in its block": ("\n".join(fill_text(b, p1[0]) for b, _ in boxes(task.target)), ""),
        "agent 2 repeats agent 1": (o1, o1),
        "each floods the grid": (fill_text(grid, p1[0]), fill_text(grid, p2[0])),
        "a box per material": tuple(
            "\n".join(fill_text(_bbox(cells[m]), m) for m in p if m in cells) for p in task.palettes
        ),
        "outside the grid": (fill_text((0, 0, 0, sx, sy, sz), p1[0]), fill_text((-1, 0, 0, 0, 0, 0), p2[0])),
        "blocks of no palette": ("/fill 0 0 0 1 0 0 gold_block", "/fill 0 0 0 1 0 0 diamond_block"),
        "swapped palettes": (o2, o1),
        "one command repeated past the limit": tuple("\n".join([o.splitlines()[0]] * 30) for o in (o1, o2)),
        "agent 2 clears agent 1's work": (o1, fill_text(grid, "air") + "\n" + o2),
    }


def blocks_additions(task):
    """Lines added to an honest answer that build nothing of the target."""
    o1, o2 = oracle_commands(task)
    sx, sy, sz = task.size
    corner = f"{sx - 1} {sy - 1} {sz - 1}"
    p1, p2 = task.palettes
    return {
        "duplicated commands": tuple("\n".join([o.splitlines()[0]] * 10) for o in (o1, o2)),
        "no-op air": (f"/setblock {corner} air", f"/setblock {corner} air"),
        "a token block of every material": tuple("\n".join(f"/setblock {corner} {m}" for m in p) for p in (p1, p2)),
        "set and clear again": (f"/setblock {corner} {p1[0]}\n/setblock {corner} air\n" * 5, ""),
        "prose": ("Here are my commands.", "All done."),
    }


def honest_partial(task):
    """An honest, imperfect answer: each agent's last command left out (when it has two) and one command rejected."""
    l1, l2 = (o.splitlines() for o in oracle_commands(task))
    return "\n".join(l1[:-1] + ["/fill 0 0 0 0 0 0 gold_block"]), "\n".join(l2[:-1] if len(l2) > 1 else l2)


HACK_TASKS = [
    make_task("str_build", 0),
    make_task("str_build", 2),
    make_task("house_build", 1),
    make_task("house_build", 3),
]


@pytest.mark.parametrize("task", HACK_TASKS, ids=lambda t: t.task_id)
def test_hacks_score_clearly_below_the_honest_answer(task):
    env = envs.make("blocks")
    row = task_to_row(task, 0)

    def reward(c1, c2):
        return env.reward_func.score([c1], [c2], batch_items=[row])[0]["reward"]

    lone = reward(oracle_commands(task)[0], "")
    assert reward(*oracle_commands(task)) == 4.0
    for name, (c1, c2) in blocks_hacks(task).items():
        got = reward(c1, c2)
        assert got <= 3.5, f"{task.task_id}: hack '{name}' scores {got:.3f} of the oracle's 4.0"
        if name.startswith("lone agent 1,") or name == "agent 2 repeats agent 1":  # no more than building nothing
            assert got <= lone + 1e-9, f"{task.task_id}: '{name}' {got:.3f} > lone agent {lone:.3f}"
    assert reward(*blocks_hacks(task)["each floods the grid"]) <= 0.5
    assert reward(*blocks_hacks(task)["echo the syntax"]) < reward("", "")  # rejected lines cost more than nothing


@pytest.mark.parametrize("task", HACK_TASKS, ids=lambda t: t.task_id)
def test_hacks_added_to_an_honest_answer_do_not_raise_it(task):
    env = envs.make("blocks")
    row = task_to_row(task, 0)

    def reward(c1, c2):
        return env.reward_func.score([c1], [c2], batch_items=[row])[0]["reward"]

    h1, h2 = honest_partial(task)
    honest = reward(h1, h2)
    assert 1.0 < honest < 4.0
    for name, (a, b) in blocks_additions(task).items():
        got = reward(h1 + "\n" + a, h2 + "\n" + b)
        assert got <= honest + 1e-9, f"{task.task_id}: adding '{name}' raises {honest:.3f} to {got:.3f}"
