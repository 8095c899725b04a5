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


# --- rollout_expansion, on a generation faked by text: no model needed

SAMPLE_REWARD = [1.0, 5.0, 3.0]  # reward of a joint action by the sample index of agent 0's answer in it


class FakeSamples:
    def __init__(self, texts):
        self.texts = texts


def fake_generate(counts):
    """Each agent's answer k at a node is '<the node's prompt>/<k>'; ``counts`` gets each turn's rows per agent."""

    def generate(agents, nodes, g, **_):
        counts.append(len(nodes) * g)
        return [FakeSamples([f"{nd.prompts[a]}/{k}" for nd in nodes for k in range(g)]) for a in agents]

    return generate


def sample_reward(a, b):
    return [SAMPLE_REWARD[int(x.rsplit("/", 1)[1]) % 3] for x in a]


def fake_episode(expansion, *, g=3, turns=3, rows=1, joint_mode="align", top_k=2, threshold=None):
    counts = []
    agents = [0, 1]
    nodes = root_nodes([lambda r: r["prompt"]] * 2, [{"prompt": f"row{m}"} for m in range(rows)], list(range(rows)))
    ep = run_episode(
        agents,
        nodes,
        reward_func=sample_reward,
        num_generations=g,
        settings=GenerationSettings(max_new_tokens=4),
        joint_mode=joint_mode,
        num_turns=turns,
        external_transition=lambda agent_completions: list(agent_completions),  # the next prompt: the answer
        termination_threshold=threshold,
        rollout_expansion=expansion,
        expansion_top_k=top_k,
        generate_fn=fake_generate(counts),
    )
    return ep, counts


def test_tree_expansion_grows_by_the_joint_actions_per_turn():
    ep, counts = fake_episode("tree")  # G = 3, T = 3, one row: 3 + 9 + 27 samples per agent
    assert counts == [3, 9, 27] and [len(t.nodes) for t in ep.turns] == [1, 3, 9]
    _, cross = fake_episode("tree", g=2, joint_mode="cross")  # J = G^2 = 4 joint actions per node: 2 + 8 + 32
    assert cross == [2, 8, 32]


def test_best_expansion_costs_g_samples_per_turn_and_continues_the_best_joint_action():
    ep, counts = fake_episode("best")  # G * T = 3 + 3 + 3 samples per agent
    assert counts == [3, 3, 3]
    assert [t.nodes[0].prompts[0] for t in ep.turns] == ["row0", "row0/1", "row0/1/1"]  # reward 5: sample 1
    assert ep.turns[0].children.tolist() == [[-1, 0, -1]] and ep.turns[2].children.tolist() == [[-1, -1, -1]]
    _, two_rows = fake_episode("best", rows=2)
    assert two_rows == [6, 6, 6]  # G * T per agent per dataset row
    _, cross = fake_episode("best", g=2, joint_mode="cross")
    assert cross == [2, 2, 2]


def test_top_k_expansion_keeps_k_nodes_per_row_after_the_first_turn():
    """Turn 1: one node, 3 joint actions (rewards 1, 5, 3): samples 1 and 2 continue, 2 nodes. Turn 2: 2 nodes x 3
    joint actions, the 2 best of the row's 6 are both reward 5 (ties: the lowest index, node 0's then node 1's
    sample 1). So G + k G (T - 1) = 3 + 6 + 6 samples per agent."""
    ep, counts = fake_episode("top_k")
    assert counts == [3, 6, 6]
    assert ep.turns[0].children.tolist() == [[-1, 0, 1]]
    assert [nd.prompts[0] for nd in ep.turns[1].nodes] == ["row0/1", "row0/2"]
    assert ep.turns[1].children.tolist() == [[-1, 0, -1], [-1, 1, -1]]
    assert [nd.prompts[0] for nd in ep.turns[2].nodes] == ["row0/1/1", "row0/2/1"]
    _, two_rows = fake_episode("top_k", rows=2)
    assert two_rows == [6, 12, 12]  # k nodes per row, not per batch
    _, wide = fake_episode("top_k", top_k=5)  # k > J at turn 1: all 3 continue; then 5 of the row's 9
    assert wide == [3, 9, 15]


def test_expansion_with_termination_and_the_returns_of_branches_not_continued():
    ep, counts = fake_episode("best", threshold=5.0)  # the best joint action reaches the threshold: the episode ends
    assert counts == [3] and ep.turns[0].children.tolist() == [[-1, -1, -1]]
    _, counts = fake_episode("top_k", threshold=5.0)  # of the top 2 (rewards 5, 3) only the 3 continues
    assert counts == [3, 3, 3]
    ep, _ = fake_episode("best", turns=2)
    # returns with discount 0.5: only sample 1 has a child (rewards 1, 5, 3, mean 3); the others keep their reward
    adv = episode_advantages(ep, 2, 3, mode="none", discount=0.5)
    torch.testing.assert_close(adv[0][0], torch.tensor([1.0, 5.0 + 0.5 * 3.0, 3.0]))


def test_unknown_expansion_raises():
    import pytest

    with pytest.raises(ValueError, match="rollout_expansion 'beam'.*tree, best, top_k"):
        fake_episode("beam")


def test_the_trainer_passes_its_expansion_and_grouping():
    """MultiAgentTrainer.rollout and compute_advantages read rollout_expansion and advantage_grouping from args."""
    from types import SimpleNamespace

    from comlrl import MAGRPOConfig
    from comlrl.trainers.base import MultiAgentTrainer

    counts = []
    args = MAGRPOConfig(
        num_generations=3, num_turns=3, rollout_expansion="top_k", expansion_top_k=2, advantage_grouping="agent_turn"
    )
    trainer = SimpleNamespace(
        args=args,
        formatters=[lambda r: r["prompt"]] * 2,
        train_dataset=None,
        state={"step": 0},
        dist=SimpleNamespace(
            generate_team=lambda *a, generate_team, **k: fake_generate(counts)(*a, **k), run_once=None
        ),
        agents=[0, 1],
        external_transition=lambda agent_completions: list(agent_completions),
        reward_processor=None,
        rollout_dtype=None,
        num_agents=2,
    )
    settings = GenerationSettings(max_new_tokens=4)
    ep = MultiAgentTrainer.rollout(
        trainer, [{"prompt": "row0"}], [0], settings=settings, num_generations=3, reward_func=sample_reward
    )
    assert counts == [3, 6, 6]
    adv = MultiAgentTrainer.compute_advantages(trainer, ep, {})
    torch.testing.assert_close(adv[0][0], torch.tensor([-2.0, 2.0, 0.0]))  # turn 1's own rewards 1, 5, 3 - mean 3
