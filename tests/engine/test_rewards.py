"""compute_rewards: what a reward function is called with, what it may return, and errors that name the row."""

import math

import pytest
import torch

from comlrl.engine.rewards import batched_reward, compute_rewards
from comlrl.errors import RewardError

# 3 joint actions of 2 agents: agent i's completion / prompt in joint action j
COMPLETIONS = [["a", "bb", "ccc"], ["xxxx", "y", ""]]
PROMPTS = [["p0", "p1", "p2"], ["q0", "q1", "q2"]]
ITEMS = [{"k": 0}, {"k": 1}, {"k": 2}]
ROW_IDS = [7, 8, 9]


def rewards_of(fn, **kw):
    kw = {"prompts": PROMPTS, "batch_items": ITEMS, "row_ids": ROW_IDS, **kw}
    return compute_rewards(fn, COMPLETIONS, **kw)


def test_called_once_per_joint_action_with_the_keywords_it_names():
    calls = []

    def reward(a, b, prompts, turn):
        calls.append((a, b, prompts, turn))
        return [float(len(a[0]) - len(b[0]))]

    rewards, levels = rewards_of(reward, turn=2)
    assert rewards == [1 - 4, 2 - 1, 3 - 0] and levels == []
    assert calls == [
        (["a"], ["xxxx"], [["p0"], ["q0"]], 2),
        (["bb"], ["y"], [["p1"], ["q1"]], 2),
        (["ccc"], [""], [["p2"], ["q2"]], 2),
    ]


def test_keywords_passed_only_when_accepted_all_with_var_keywords():
    seen = []

    def plain(a, b):
        return [0.0]

    def everything(a, b, **kw):
        seen.append(kw)
        return [1.0]

    assert rewards_of(plain)[0] == [0.0, 0.0, 0.0]  # no keyword it does not name reaches it
    assert rewards_of(everything, turn=3)[0] == [1.0] * 3
    assert seen[1] == {"prompts": [["p1"], ["q1"]], "batch_items": [{"k": 1}], "turn": 3}


def test_batched_function_is_called_once_with_every_joint_action_and_a_processor_applies_to_each():
    calls = []

    @batched_reward
    def reward(a, b, batch_items):
        calls.append((a, b, batch_items))
        return torch.tensor([1.0, 2.0, 3.0])  # a 1-d tensor of the right length is accepted

    rewards, _ = rewards_of(reward, processor=lambda r: 10 * r)
    assert rewards == [10.0, 20.0, 30.0]
    assert calls == [(COMPLETIONS[0], COMPLETIONS[1], ITEMS)]


def test_score_reports_levels_beside_the_reward():
    class Scored:
        def score(self, a, b):
            return [{"reward": float(len(a[0])), "level/short_b": float(len(b[0]) < 2)}]

    rewards, levels = rewards_of(Scored())
    assert rewards == [1.0, 2.0, 3.0]
    assert levels == [{"level/short_b": 0.0}, {"level/short_b": 1.0}, {"level/short_b": 1.0}]


@pytest.mark.parametrize(
    "returned, message",
    [
        (lambda j: 1.0, r"joint action 1, dataset row 8, turn 2\): reward_func returned a number"),
        (lambda j: [math.nan], r"joint action 1, dataset row 8, turn 2\): reward is nan"),
        (lambda j: ["high"], r"joint action 1, dataset row 8, turn 2\): reward must be a number"),
        (lambda j: [1.0, 2.0], r"joint action 1, dataset row 8, turn 2\): reward_func returned 2 value\(s\) for 1"),
    ],
)
def test_a_bad_return_names_its_joint_action_row_and_turn(returned, message):
    """The second joint action (dataset row 8) returns something wrong; the first is fine."""

    def reward(a, b):
        return [0.0] if a == ["a"] else returned(a)

    with pytest.raises(RewardError, match=message):
        rewards_of(reward, turn=2)


def test_an_exception_in_the_function_names_the_row_and_a_batched_one_its_rows():
    def failing(a, b):
        if b == [""]:
            raise KeyError("missing")
        return [0.0]

    with pytest.raises(RewardError, match=r"joint action 2, dataset row 9, turn 1\) raised KeyError"):
        rewards_of(failing)
    with pytest.raises(RewardError, match=r"turn 1, rows \[7, 8, 9\]\): reward_func returned 2 value\(s\) for 3"):
        rewards_of(batched_reward(lambda a, b: [0.0, 1.0]))
    with pytest.raises(RewardError, match=r"reward_processor on reward_func \(joint action 0, dataset row 7"):
        rewards_of(lambda a, b: [1.0], processor=lambda r: math.inf)
