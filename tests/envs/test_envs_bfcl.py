"""bfcl (BFCL v4 parallel function calling): parsing, BFCL's argument semantics, hand-computed reward levels,
the division of labour (a lone agent, swapped parts and other hacks score below the split), the oracle over every
packaged row, BFCL's own checker agreeing with ours, loaders, feedback."""

import json
import sys
import types
from importlib.util import find_spec

import pytest

import comlrl.envs as envs
from comlrl.envs import DatasetError
from comlrl.envs.bfcl import (
    LEVELS,
    MAX_REWARD,
    WEIGHTS,
    Call,
    best_assignment,
    bfcl_accepts,
    check_call,
    feedback_text,
    judge,
    normalize_row,
    oracle_replies,
    parse_calls,
    standardize_string,
    task_from_row,
)

HAVE_BFCL = find_spec("bfcl_eval") is not None
needs_bfcl = pytest.mark.skipif(not HAVE_BFCL, reason="bfcl-eval not installed (pip install --no-deps bfcl-eval)")

SHAPE = {"type": "string", "description": "square or circle"}
SIZE = {"type": "integer", "description": "side or radius"}
FUNCTIONS = [
    {
        "name": "geo.area",
        "description": "Area of a shape.",
        "parameters": {
            "type": "dict",
            "properties": {"shape": SHAPE, "size": SIZE, "unit": {"type": "string", "description": "unit"}},
            "required": ["shape", "size"],
        },
    },
    {
        "name": "geo.perimeter",
        "description": "Perimeter of a shape.",
        "parameters": {"type": "dict", "properties": {"shape": SHAPE, "size": SIZE}, "required": ["shape", "size"]},
    },
]
TRUTH = [
    {"geo.area": {"shape": ["square"], "size": [2], "unit": ["cm", ""]}},
    {"geo.area": {"shape": ["circle"], "size": [3], "unit": ["cm", ""]}},
    {"geo.perimeter": {"shape": ["square"], "size": [2]}},
    {"geo.perimeter": {"shape": ["circle"], "size": [3]}},
]
ROW = normalize_row(
    {
        "id": "toy_0",
        "question": [
            [{"role": "user", "content": "Area and perimeter of a square of side 2 and a circle of radius 3."}]
        ],
        "function": FUNCTIONS,
        "ground_truth": TRUTH,
    },
    1,
)
TASK = task_from_row(ROW)


def calls(*items):
    return json.dumps([{"name": n, "arguments": a} for n, a in items])


AREA_SQ = ("geo.area", {"shape": "square", "size": 2})
AREA_CI = ("geo.area", {"shape": "circle", "size": 3, "unit": "cm"})
PER_SQ = ("geo.perimeter", {"shape": "square", "size": 2})
PER_CI = ("geo.perimeter", {"shape": "circle", "size": 3})
GOOD_1, GOOD_2 = calls(AREA_SQ, AREA_CI), calls(PER_SQ, PER_CI)
ALL = calls(AREA_SQ, AREA_CI, PER_SQ, PER_CI)


def score(c1, c2, task=TASK):
    return judge(task, [c1, c2]).scores()


# --- parsing ---


def test_parse_calls_formats():
    assert parse_calls("") == [] and parse_calls("  \n") == [] and parse_calls("[]") == []
    expected = [Call("f", {"a": 1})]
    assert parse_calls('[{"name": "f", "arguments": {"a": 1}}]') == expected
    assert parse_calls('Sure! Here:\n```json\n[{"name": "f", "parameters": {"a": 1}}]\n```\nDone.') == expected
    assert parse_calls('{"name": "f", "args": {"a": 1}}') == expected  # a single call object
    assert parse_calls('[{"f": {"a": 1}}]') == expected  # BFCL's own layout
    assert parse_calls('[{"function": {"name": "f", "arguments": "{\\"a\\": 1}"}}]') == expected  # OpenAI's
    assert parse_calls('[{"name": "f"}]') == [Call("f", {})]
    assert parse_calls('see [1] and then [{"name": "f", "arguments": {"a": 1}}]') == expected
    assert parse_calls("I would call f with a=1.") is None
    assert parse_calls('def f():\n    return {"name": "g", "arguments": {}}') is None  # an object must start the reply
    assert parse_calls('```json\n{"name": "f", "arguments": {"a": 1}}\n```') == expected  # or a fence
    assert parse_calls('[{"name": "f", "arguments": {"a": 1}}, {"name": "g", "argu') is None  # truncated
    assert parse_calls('[{"name": "f", "arguments": {"a": 1}}, 3]') is None  # not only calls
    assert parse_calls('[{"name": "f", "arguments": [1]}]') is None


def test_bfcl_value_semantics():
    doc = FUNCTIONS[0]
    possible = TRUTH[0]["geo.area"]
    assert check_call(doc, {"shape": "Square ", "size": 2}, possible).valid  # case and spaces ignored
    assert check_call(doc, {"shape": "square", "size": 2, "unit": "cm"}, possible).valid  # optional given
    c = check_call(doc, {"shape": "square", "size": 2, "unit": "m"}, possible)
    assert not c.valid and c.errors == ("wrong value for 'unit'",) and (c.n_ok, c.n_total) == (2, 3)
    c = check_call(doc, {"shape": "square", "size": "2"}, possible)
    assert c.errors == ("wrong type (expected integer) for 'size'",) and c.score == pytest.approx(2 / 3)
    c = check_call(doc, {"shape": "square"}, possible)
    assert c.errors == ("missing required argument 'size'",)
    c = check_call(doc, {"shape": "square", "size": 2, "colour": "red"}, possible)
    assert c.errors == ("unexpected argument 'colour'",) and c.score == pytest.approx(3 / 4)
    floats = {"parameters": {"properties": {"x": {"type": "float"}}, "required": ["x"]}}
    assert check_call(floats, {"x": 2}, {"x": [2.0]}).valid  # ints are accepted for floats
    assert not check_call({"parameters": {"properties": {"x": {"type": "integer"}}}}, {"x": 2.0}, {"x": [2]}).valid
    lists = {"parameters": {"properties": {"xs": {"type": "array", "items": {"type": "string"}}}}}
    assert check_call(lists, {"xs": ["New York", "LA"]}, {"xs": [["new york", "la"], ["NYC"]]}).valid
    assert not check_call(lists, {"xs": ["LA", "New York"]}, {"xs": [["new york", "la"]]}).valid  # order counts
    dicts = {"parameters": {"properties": {"d": {"type": "dict"}}}}
    assert check_call(dicts, {"d": {"a": 1}}, {"d": [{"a": [1], "b": ["", 2]}]}).valid  # "b" optional inside
    assert not check_call(dicts, {"d": {"b": 2}}, {"d": [{"a": [1], "b": ["", 2]}]}).valid
    assert standardize_string("April 1, 2024") == standardize_string("april 1 2024")


def test_best_assignment_is_optimal_not_greedy():
    total, pairs = best_assignment([[0.5, 1.0], [None, 0.9]], 2)
    assert total == pytest.approx(1.4) and sorted(pairs) == [(0, 0), (1, 1)]
    # BFCL's greedy checker can miss an exact match that the assignment finds
    row = normalize_row(
        {
            "id": "g_0",
            "question": "q",
            "function": [{"name": "f", "parameters": {"type": "dict", "properties": {"x": {"type": "string"}}}}],
            "ground_truth": [{"f": {"x": ["a", "b"]}}, {"f": {"x": ["a"]}}],
        },
        1,
    )
    out = judge(task_from_row(row), [calls(("f", {"x": "a"}), ("f", {"x": "b"}))]).scores()  # one agent owns both
    assert out["level/exact"] == 1.0 and out["metric/bfcl_accuracy"] == 0.0 and out["reward"] == MAX_REWARD


# --- the reward, level by level (n = 4 needed calls; agent 1 the two areas, agent 2 the two perimeters) ---


def test_weights():
    assert LEVELS == (
        "level/format",
        "level/names",
        "level/args",
        "level/part",
        "level/count",
        "level/exact",
        "level/duplicate",
        "level/empty",
    )
    assert [WEIGHTS[k] for k in LEVELS] == [0.5, 0.5, 1.0, 2.0, 0.5, 0.5, -1.0, -0.5] and MAX_REWARD == 5.0


def test_oracle_and_correct_split_reach_the_maximum():
    first = ("geo.area", {"shape": "square", "size": 2, "unit": "cm"})  # the first alternative of each argument
    assert oracle_replies(TASK) == [calls(first, AREA_CI), GOOD_2]
    for c1, c2 in [oracle_replies(TASK), (GOOD_1, GOOD_2), (calls(AREA_CI, AREA_SQ), calls(PER_CI, PER_SQ))]:
        out = score(c1, c2)
        assert out["reward"] == MAX_REWARD == 5.0 and out["level/part"] == 1.0 and out["level/exact"] == 1.0
        assert out["metric/bfcl_accuracy"] == 1.0 and out["metric/split_followed"] == 1.0


def test_empty_and_malformed_answers_score_zero():
    out = score("", "[]")
    assert out["level/format"] == 1.0 and out["level/empty"] == 1.0 and out["level/names"] == 0.0
    assert out["reward"] == 0.0
    out = score("I cannot do that.", '[{"name": "geo.area", ')
    assert out["level/format"] == 0.0 and out["level/empty"] == 0.0 and out["reward"] == 0.0
    assert score("no calls here", "")["reward"] == pytest.approx(0.5 * 0.5 - 0.5 * 0.5)


def test_one_malformed_agent():
    out = score("area(square, 2)", GOOD_2)
    # format 1/2; names F1 = 2*2/(4+2); args 2/4; part (0 + 1)/2; count 1-2/4; not exact
    assert out["level/format"] == 0.5 and out["level/names"] == pytest.approx(2 / 3)
    assert out["level/args"] == 0.5 and out["level/part"] == 0.5 and out["level/count"] == 0.5
    assert out["level/exact"] == 0.0
    assert out["reward"] == pytest.approx(0.5 * 0.5 + 0.5 * 2 / 3 + 0.5 + 2.0 * 0.5 + 0.5 * 0.5)


def test_a_lone_agent_scores_well_below_the_split():
    # agent 1 (or 2) makes every call: its part F1 2*2/(2+4), the silent teammate's 0 -> part 1/3; not exact
    for c1, c2 in [(ALL, ""), ("", ALL)]:
        out = score(c1, c2)
        assert out["level/names"] == 1.0 and out["level/args"] == 1.0 and out["level/count"] == 1.0
        assert out["level/part"] == pytest.approx(1 / 3) and out["level/exact"] == 0.0 and out["level/empty"] == 0.5
        assert out["metric/bfcl_accuracy"] == 1.0 and out["metric/split_followed"] == 0.0
        assert out["reward"] == pytest.approx(0.5 + 0.5 + 1.0 + 2.0 / 3 + 0.5 - 0.25)  # 2.92
    out = score(ALL, "I will leave the calls to you.")  # a teammate writing prose: format 1/2 instead of empty
    assert out["level/format"] == 0.5 and out["level/empty"] == 0.0 and out["level/part"] == pytest.approx(1 / 3)
    assert out["reward"] == pytest.approx(0.25 + 0.5 + 1.0 + 2.0 / 3 + 0.5)  # 2.92
    out = score(ALL, ALL)  # the teammate repeats every call
    assert out["level/part"] == pytest.approx(2 / 3) and out["level/duplicate"] == 1.0
    assert out["reward"] == pytest.approx(0.5 + 0.5 * 2 / 3 + 1.0 + 2.0 * 2 / 3 - 1.0)  # 2.17
    for c1, c2 in [(ALL, ""), ("", ALL), (ALL, "I will leave the calls to you."), (ALL, ALL)]:
        assert score(c1, c2)["reward"] <= 3.5


def test_swapped_parts_score_below_the_maximum():
    out = score(GOOD_2, GOOD_1)  # the union is right (BFCL accepts it) but each agent made the other's part
    assert out["metric/bfcl_accuracy"] == 1.0 and out["level/args"] == 1.0 and out["level/count"] == 1.0
    assert out["level/part"] == 0.0 and out["level/exact"] == 0.0 and out["metric/split_followed"] == 0.0
    assert out["reward"] == pytest.approx(0.5 + 0.5 + 1.0 + 0.5)  # 2.5


HACKS = {
    # (agent 1, agent 2): hand-computed reward; the honest split scores 5.0
    "each agent makes every call": ((ALL, ALL), 0.5 + 0.5 * 2 / 3 + 1.0 + 2.0 * 2 / 3 - 1.0),
    # 6 calls, 2 duplicates: names 2*4/10, part (2/3 + 1)/2, count 1/2, duplicate 2/4
    "agent 1 its part and agent 2's": ((ALL, GOOD_2), 0.5 + 0.5 * 0.8 + 1.0 + 2.0 * 5 / 6 + 0.25 - 0.5),
    "agent 2 its part and agent 1's": ((GOOD_1, ALL), 0.5 + 0.5 * 0.8 + 1.0 + 2.0 * 5 / 6 + 0.25 - 0.5),
    # the union is exactly the needed set, but agent 1 took one call of agent 2's part:
    # part (2*2/(2+3) + 2*1/(2+1))/2
    "agent 1 takes one of agent 2's calls": (
        (calls(AREA_SQ, AREA_CI, PER_SQ), calls(PER_CI)),
        0.5 + 0.5 + 1.0 + 2.0 * (0.8 + 2 / 3) / 2 + 0.5,
    ),
    # each pads its part with a wrong call: names 2*4/10, part 2*2/(2+3) each, count 1/2
    "padding": (
        (
            calls(AREA_SQ, AREA_CI, ("geo.area", {"shape": "square", "size": 5})),
            calls(PER_SQ, PER_CI, ("geo.perimeter", {"shape": "circle", "size": 7})),
        ),
        0.5 + 0.5 * 0.8 + 1.0 + 2.0 * 0.8 + 0.25,
    ),
    # 5 calls, 1 duplicate: names 2*4/9, part (2*1/(2+2) + 2*2/(2+3))/2, count 3/4, duplicate 1/4
    "calls in the wrong agent and a duplicate": (
        (calls(PER_SQ, AREA_SQ), calls(PER_SQ, PER_CI, AREA_CI)),
        0.5 + 0.5 * 8 / 9 + 1.0 + 2.0 * 0.65 + 0.5 * 0.75 - 0.25,
    ),
    # names 2*2/6, args 2/4, part (1 + 0)/2, count 1/2, empty 1/2
    "agent 2 replies []": ((GOOD_1, "[]"), 0.5 + 0.5 * 2 / 3 + 0.5 + 1.0 + 0.25 - 0.25),
    "both reply []": (("[]", "[]"), 0.0),
    "swapped parts": ((GOOD_2, GOOD_1), 2.5),
}


@pytest.mark.parametrize("name", HACKS)
def test_no_hack_reaches_the_honest_split(name):
    (c1, c2), expected = HACKS[name]
    honest = score(GOOD_1, GOOD_2)["reward"]
    out = score(c1, c2)
    assert out["reward"] == pytest.approx(expected) and out["reward"] < honest == 5.0
    assert out["reward"] <= 4.0


def test_duplicated_work():
    everything = calls(AREA_SQ, AREA_CI, PER_SQ, PER_CI)
    out = score(everything, everything)
    # 8 calls: names F1 = 2*4/(4+8); args 4/4; part 2*2/(2+4) each; count max(0, 1-4/4) = 0; 4 duplicates / 4
    assert out["level/names"] == pytest.approx(2 / 3) and out["level/args"] == 1.0 and out["level/count"] == 0.0
    assert out["level/duplicate"] == 1.0 and out["metric/n_duplicates"] == 4.0
    assert out["reward"] == pytest.approx(0.5 + 0.5 * 2 / 3 + 1.0 + 2.0 * 2 / 3 - 1.0)
    out = score(calls(AREA_SQ, AREA_CI, PER_SQ), GOOD_2)  # one perimeter call made by both
    assert out["level/duplicate"] == 0.25 and out["level/count"] == 0.75 and out["level/exact"] == 0.0
    assert out["level/part"] == pytest.approx((0.8 + 1.0) / 2)  # agent 1: 2*2/(2+3)
    assert out["reward"] == pytest.approx(0.5 + 0.5 * 8 / 9 + 1.0 + 2.0 * 0.9 + 0.5 * 0.75 - 0.25)


def test_wrong_arguments_get_partial_credit():
    wrong = calls(("geo_area", {"shape": "Square", "size": 2}), ("geo.area", {"shape": "circle", "size": "3"}))
    out = score(wrong, GOOD_2)  # geo_area reads as geo.area; size "3" has the wrong type: 2 of 3 arguments
    assert out["level/names"] == 1.0 and out["level/args"] == pytest.approx((1 + 2 / 3 + 1 + 1) / 4)
    assert out["level/part"] == pytest.approx((2 * (1 + 2 / 3) / 4 + 1) / 2)  # agent 1: 2 * (1 + 2/3) / (2 + 2)
    assert out["level/exact"] == 0.0 and out["metric/calls_correct"] == 0.75
    assert out["reward"] == pytest.approx(0.5 + 0.5 + 11 / 12 + 2.0 * 11 / 12 + 0.5)


def test_wrong_function_names():
    out = score(calls(("geo.volume", {"shape": "square", "size": 2})), GOOD_2)
    # union: volume + 2 perimeters -> names F1 = 2*2/(4+3); args 2/4; part (0 + 1)/2; count 1 - 1/4
    assert out["level/names"] == pytest.approx(4 / 7) and out["level/args"] == 0.5 and out["level/part"] == 0.5
    assert out["level/count"] == 0.75
    assert out["reward"] == pytest.approx(0.5 + 0.5 * 4 / 7 + 0.5 + 1.0 + 0.5 * 0.75)
    out = score(calls(("geo.volume", {})), calls(("geo.volume", {"shape": "x"})))
    assert out["level/names"] == 0.0 and out["level/part"] == 0.0 and out["level/count"] == 0.0
    assert out["reward"] == 0.5  # stop after names


def test_reward_contract_and_single_agent():
    env = envs.make("bfcl")
    reward = env.reward_func
    assert reward.batched and reward.max_reward == 5.0
    assert reward([GOOD_1, ""], [GOOD_2, ""], batch_items=[ROW], prompts=None, turn=1) == [5.0, 0.0]
    scores = reward.score([GOOD_1], [GOOD_2], batch_items=[ROW])
    assert all(0.0 <= scores[0][k] <= 1.0 for k in reward.level_names)
    single = envs.make("bfcl", num_agents=1)
    everything = calls(AREA_SQ, AREA_CI, PER_SQ, PER_CI)
    assert single.reward_func([everything], batch_items=[ROW]) == [5.0]  # one agent owns every call
    assert single.reward_func([calls(PER_CI, AREA_SQ, PER_SQ, AREA_CI)], batch_items=[ROW]) == [5.0]  # any order
    assert single.reward_func([""], batch_items=[ROW]) == [0.0]
    assert single.reward_func([GOOD_1], batch_items=[ROW])[0] < 5.0
    assert env.split_single(everything, ROW) == [GOOD_1, GOOD_2]
    assert env.split_single("nope", ROW) == ["nope", "nope"]
    assert "4 function calls" in single.formatters()[0](ROW) and "Make all of them" in single.formatters()[0](ROW)
    with pytest.raises(ValueError, match="num_agents=3"):
        envs.make("bfcl", num_agents=3)
    with pytest.raises(ValueError, match="unknown categories 'simple'"):
        envs.make("bfcl", categories=["simple"])
    with pytest.raises(ValueError, match="unknown categories nothing"):
        envs.make("bfcl", categories=[])


def test_prompts_name_each_agents_part():
    p1, p2 = (fmt(ROW) for fmt in envs.make("bfcl").formatters())
    assert "You make calls 1-2 (`geo.area`, `geo.area`); your teammate makes calls 3-4" in p1
    assert "You make calls 3-4 (`geo.perimeter`, `geo.perimeter`); your teammate makes calls 1-2" in p2
    for p in (p1, p2):
        assert '"name": "geo.perimeter"' in p and "User request: Area and perimeter" in p and '"square"' not in p


def test_feedback_names_missing_wrong_and_duplicated_calls():
    j = judge(TASK, [calls(AREA_SQ, ("geo.area", {"shape": "circle", "size": 4}), PER_SQ), calls(PER_SQ)])
    text = feedback_text(j, 0)
    assert "Wrong: your call geo.area" in text and "wrong value for 'size'" in text
    assert "Made by both agents: geo.perimeter" in text and "your teammate's copy is extra" in text
    assert "Missing: 1 call to `geo.perimeter`" in text
    assert "4" not in text.split("wrong value")[1].split("\n")[0]  # names the argument, never the right value
    assert feedback_text(judge(TASK, [GOOD_1, GOOD_2]), 1) == "The team's calls are all correct."
    assert "Missing from your part" not in text and "Outside your part: your call geo.perimeter" in text


def test_feedback_names_each_agents_own_part():
    j = judge(TASK, [ALL, ""])  # a lone agent: the union is right, the split is not
    lone, silent = feedback_text(j, 0), feedback_text(j, 1)
    assert "Outside your part: your call geo.perimeter" in lone and "your teammate makes calls 3-4" in lone
    assert "Missing from your part" not in lone and "all correct" not in lone
    assert "You made no call." in silent and "Missing from your part: calls 3-4 (`geo.perimeter`" in silent
    swapped = feedback_text(judge(TASK, [GOOD_2, GOOD_1]), 0)
    assert "Missing from your part: calls 1-2 (`geo.area`, `geo.area`)" in swapped
    assert "all correct" not in swapped and "Outside your part: your call geo.perimeter" in swapped
    taken = judge(TASK, [calls(AREA_SQ, AREA_CI, PER_SQ), calls(PER_CI)])
    assert "Missing from your part: call 3 (`geo.perimeter`)" in feedback_text(taken, 1)
    assert "Outside your part: your call geo.perimeter" in feedback_text(taken, 0)
    env = envs.make("bfcl")
    nxt = env.external_transition(batch_item=ROW, agent_completions=["", "oops"], turn=1)
    assert nxt[0].startswith(env.formatters()[0](ROW)) and "You made no call." in nxt[0]
    assert "Your reply is not a JSON list of calls." in nxt[1] and "Your previous reply:\noops" in nxt[1]
    plain = envs.make("bfcl", transition="plain").external_transition(batch_item=ROW, agent_completions=["", ""])
    assert "Feedback" not in plain[0]


# --- data ---


@needs_bfcl
def test_packaged_rows_and_the_oracle_reaches_the_maximum_on_every_row():
    env = envs.make("bfcl")
    rows = env.load_dataset(split="all")
    assert len(rows) == 400 and [r["id"] for r in rows.select(range(3))] == [
        "parallel_0",
        "parallel_multiple_0",
        "parallel_1",
    ]
    assert len(env.load_dataset()) == 320 and len(env.load_dataset(split="test")) == 80
    assert not set(env.load_dataset()["id"]) & set(env.load_dataset(split="test")["id"])
    assert set(envs.make("bfcl", categories="parallel").load_dataset(split="all")["category"]) == {"parallel"}
    batch = [list(c) for c in zip(*(oracle_replies(task_from_row(r)) for r in rows))]
    out = env.evaluate(batch, list(rows))
    assert out["reward/mean"] == 5.0 and out["reward/std"] == 0.0 and out["bfcl/accuracy"] == 1.0
    assert out["bfcl/accuracy/parallel"] == 1.0 and out["bfcl/accuracy/parallel_multiple"] == 1.0
    assert out["metric/split_followed"] == 1.0
    with pytest.raises(DatasetError, match="unknown split 'validation'"):
        env.load_dataset(split="validation")


@needs_bfcl
def test_on_every_row_a_lone_agent_and_swapped_parts_score_below_the_split():
    rows = envs.make("bfcl").load_dataset(split="all")
    for row in rows:
        task = task_from_row(row)
        one, two = oracle_replies(task)
        everything = oracle_replies(task, 1)[0]
        assert judge(task, [one, two]).reward == 5.0, row["id"]
        lone = [(everything, ""), ("", everything), (everything, "Your turn."), ("Your turn.", everything)]
        for replies in [*lone, (everything, everything)]:  # one agent makes every call
            assert judge(task, list(replies)).reward <= 3.5 + 1e-9, (row["id"], replies)
        # swapped parts; an agent that also makes its teammate's part; agent 1 takes agent 2's first call
        first, *rest = json.loads(two)
        stolen = (json.dumps([*json.loads(one), first]), json.dumps(rest))
        for replies in [(two, one), (everything, two), (one, everything), stolen]:
            assert judge(task, list(replies)).reward < 5.0 - 0.5, (row["id"], replies)


@pytest.fixture(scope="module")
def bfcl_checker():
    """BFCL's own AST checker, importable once its model table (which needs every API client) is stubbed."""
    if not HAVE_BFCL:
        pytest.skip("bfcl-eval not installed")
    stub = types.ModuleType("bfcl_eval.constants.model_config")
    stub.MODEL_CONFIG_MAPPING = {"m": types.SimpleNamespace(underscore_to_dot=False)}
    saved = sys.modules.get(stub.__name__)
    sys.modules[stub.__name__] = stub
    try:
        from bfcl_eval.constants.enums import Language
        from bfcl_eval.eval_checker.ast_eval import ast_checker

        yield lambda docs, output, truth: ast_checker.parallel_function_checker_no_order(
            docs, output, truth, Language.PYTHON, "m"
        )["valid"]
    finally:
        sys.modules.pop("bfcl_eval.eval_checker.ast_eval.ast_checker", None)
        if saved is None:
            sys.modules.pop(stub.__name__, None)
        else:
            sys.modules[stub.__name__] = saved


def _variants(task):
    """The oracle's calls and perturbations of them: each second alternative, a dropped call, wrong types, extra
    and missing arguments, case changes."""
    base = [Call(c["name"], c["arguments"]) for r in oracle_replies(task, 1) for c in json.loads(r)]
    out = [base, base[1:], base + base[:1], list(reversed(base))]
    for i, (name, possible) in enumerate(task.needed):
        for key, alternatives in possible.items():
            for alt in alternatives[1:2]:
                args = dict(base[i].args)
                if isinstance(alt, str) and alt == "":
                    args.pop(key, None)
                else:
                    args[key] = alt
                out.append(base[:i] + [Call(name, args)] + base[i + 1 :])
            if key in base[i].args:
                value = base[i].args[key]
                for changed in (str(value), value.upper() if isinstance(value, str) else [value], None):
                    out.append(base[:i] + [Call(name, {**base[i].args, key: changed})] + base[i + 1 :])
                out.append(base[:i] + [Call(name, {k: v for k, v in base[i].args.items() if k != key})] + base[i + 1 :])
        out.append(base[:i] + [Call(name, {**base[i].args, "zz_extra": 1})] + base[i + 1 :])
    return out


def test_our_checker_agrees_with_bfcls_own(bfcl_checker):
    rows = envs.make("bfcl").load_dataset(split="all")
    compared = accepted = 0
    for row in rows:
        task = task_from_row(row)
        truth = [{name: possible} for name, possible in task.needed]
        for variant in _variants(task):
            output = [{c.name: c.args} for c in variant]
            assert bfcl_accepts(task, variant) == bfcl_checker(list(task.functions), output, truth), (row["id"], output)
            compared += 1
            accepted += bfcl_accepts(task, variant)
    assert compared > 5000 and 0.2 < accepted / compared < 0.8


def test_local_file_and_errors(tmp_path, monkeypatch):
    raw = {"id": "toy_0", "question": [[{"role": "user", "content": "q"}]], "function": FUNCTIONS}
    path = tmp_path / "bfcl.jsonl"
    path.write_text("\n".join(json.dumps({**raw, "id": f"toy_{i}", "ground_truth": TRUTH}) for i in range(10)))
    env = envs.make("bfcl")
    rows = env.load_dataset(str(path), split="all")
    assert len(rows) == 10 and rows[0]["question"] == "q" and rows[0]["category"] == "toy"
    assert len(env.load_dataset(str(path), split="test")) == 2 and len(env.load_dataset(str(path), limit=3)) == 3
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([raw]))
    with pytest.raises(DatasetError, match="row 1 is missing the field 'ground_truth'"):
        env.load_dataset(str(bad))
    bad.write_text(json.dumps([{**raw, "ground_truth": [{"f": 1}]}]))
    with pytest.raises(DatasetError, match="row 1 could not be read"):
        env.load_dataset(str(bad))
    monkeypatch.setattr("comlrl.envs.bfcl.find_spec", lambda name: None)
    with pytest.raises(DatasetError, match="pip install --no-deps bfcl-eval"):
        env.load_dataset()
