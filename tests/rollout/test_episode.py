"""run_episode on tiny models with a reward checkable by hand: which answers form each joint action, the reward of
each, and the advantages from them."""

import torch
from tiny import tiny_model, tiny_tokenizer

from comlrl.rollout.agent import Agent
from comlrl.rollout.episode import episode_advantages, joint_indices, root_nodes, run_episode
from comlrl.rollout.protocol import GenerationSettings

ROWS = [{"prompt": "Say a word."}, {"prompt": "Name a colour."}]
G = 3


def team():
    """Two agents with different weights, so that their answers differ."""
    return [
        Agent(index=i, model=tiny_model(seed=i), tokenizer=tiny_tokenizer(), formatter=lambda r: r["prompt"])
        for i in range(2)
    ]


def score(text):
    """A reward that varies from answer to answer and is computed again by hand below."""
    return float(sum(map(ord, text)) % 13)


def episode(joint_mode, calls, g=G):
    def reward(a, b, batch_items):
        calls.append((a[0], b[0], batch_items[0]["prompt"]))
        return [score(a[0]) + 100 * score(b[0])]

    agents = team()
    return run_episode(
        agents,
        root_nodes(agents, ROWS, [0, 1]),
        reward_func=reward,
        num_generations=g,
        settings=GenerationSettings(max_new_tokens=6, do_sample=True),
        joint_mode=joint_mode,
        seed=5,
    )


def test_aligned_joint_actions_pair_the_kth_answers_and_get_their_reward():
    calls = []
    ep = episode("align", calls)
    (turn,) = ep.turns
    texts = [s.texts for s in turn.samples]
    assert [len(t) for t in texts] == [len(ROWS) * G] * 2  # rows = node * G + g
    assert turn.rewards.shape == (len(ROWS), G)
    for m, row in enumerate(ROWS):
        for k in range(G):
            a, b = texts[0][m * G + k], texts[1][m * G + k]
            assert calls[m * G + k] == (a, b, row["prompt"])  # the k-th answers of both agents, on row m
            assert float(turn.rewards[m, k]) == score(a) + 100 * score(b)
    assert (turn.children == -1).all()  # one turn: no child nodes
    assert len(set(texts[0])) > 1 and turn.rewards.std() > 0


def test_advantages_are_the_rewards_minus_each_prompts_mean():
    ep = episode("align", [])
    r = ep.turns[0].rewards  # (M, G)
    by_hand = torch.stack([torch.tensor([float(x) - sum(row.tolist()) / G for x in row]) for row in r])
    adv = episode_advantages(ep, 2, G, mode="mean")
    for i in range(2):  # both agents share their joint action's advantage
        torch.testing.assert_close(adv[i][0], by_hand.reshape(-1))
    assert float(adv[0][0].abs().sum()) > 0


def test_cross_joint_actions_pair_every_answer_with_every_other():
    calls, g = [], 2
    ep = episode("cross", calls, g=g)
    (turn,) = ep.turns
    texts = [s.texts for s in turn.samples]
    combos = joint_indices(2, g, "cross")
    assert combos == [(0, 0), (0, 1), (1, 0), (1, 1)] and turn.rewards.shape == (len(ROWS), g * g)
    for m in range(len(ROWS)):
        for k, (i0, i1) in enumerate(combos):
            a, b = texts[0][m * g + i0], texts[1][m * g + i1]
            assert calls[m * len(combos) + k][:2] == (a, b)
            assert float(turn.rewards[m, k]) == score(a) + 100 * score(b)
