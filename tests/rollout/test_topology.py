"""Topologies: the stages of each built-in and of a user graph, its validation, the prompt each agent sees (exact
strings), the samples each agent draws per stage, the returns over stages by hand, and 2-step tiny-model runs of
MAGRPO under every topology, of IAC under 'chain' and of a LoRA team."""

import pytest
import torch
from tiny import tiny_model, tiny_tokenizer

from comlrl.algorithms.advantages import tree_gae, tree_returns
from comlrl.compare import episode_records
from comlrl.configs.centralized import CentralizedMAGRPOConfig
from comlrl.configs.policy import MAGRPOConfig
from comlrl.configs.preference import MADPOConfig
from comlrl.errors import ConfigError
from comlrl.rollout.episode import Episode, Turn, episode_advantages, root_nodes, run_episode
from comlrl.rollout.protocol import GenerationSettings
from comlrl.rollout.topology import builtin, compose_prompt, resolve_topology
from comlrl.trainers.actor_critic import IACTrainer
from comlrl.trainers.magrpo import MAGRPOTrainer

FORMATTERS = [lambda r: "A: " + r["prompt"], lambda r: "B: " + r["prompt"]]
ROWS = [{"prompt": "Task 0."}, {"prompt": "Task 1."}]
BASE = ["A: Task 0.", "B: Task 0."]  # each agent's formatted prompt of row 0


# ------------------------------------------------------------------ definitions and validation
def test_builtin_stages():
    assert builtin("parallel", 3).turn(4).stages() == [[0, 1, 2]]
    chain = builtin("chain", 3).turn(0)
    assert chain.stages() == [[0], [1], [2]] and set(chain.same_turn) == {(0, 1), (0, 2), (1, 2)}
    debate = builtin("debate", 2)
    assert debate.turn(0).previous_turn == () and set(debate.turn(3).previous_turn) == {(0, 0), (0, 1), (1, 0), (1, 1)}
    leader = builtin("leader", 3)
    assert [leader.turn(t).stages() for t in range(4)] == [[[0], [1, 2]], [[0]], [[0], [1, 2]], [[0]]]
    assert set(leader.turn(1).previous_turn) == {(1, 0), (2, 0)}
    graph = resolve_topology([{"same_turn": [[1, 0]]}, {"acting": [1], "previous_turn": [[0, 1]]}], 2)
    assert [graph.turn(t).stages() for t in range(3)] == [[[1], [0]], [[1]], [[1]]]  # the last graph repeats
    assert builtin("parallel", 2).is_parallel and not graph.is_parallel


@pytest.mark.parametrize(
    "value, message",
    [
        ({"same_turn": [[0, 1], [1, 2], [2, 0]]}, r"topology, turn 1: same_turn edges form a cycle 0 -> 1 -> 2 -> 0"),
        ([{}, {"previous_turn": [[3, 0]]}], r"topology, turn 2: previous_turn edge \[3, 0\]: agent 3 is out of range"),
        ({"acting": [0], "same_turn": [[0, 1]]}, r"turn 1: same_turn edge \[0, 1\]: agent 1 does not act"),
        ({"acting": [1], "same_turn": [[0, 1]]}, r"agent 0 does not act in this turn, so it has no answer"),
        ({"same_turns": [[0, 1]]}, r"unknown key 'same_turns'.*Did you mean 'same_turn'"),
        ({"same_turn": [[0]]}, r"same_turn edge \[0\]: an edge is a pair"),
        ("chian", r"topology='chian': must be one of .*Did you mean 'chain'"),
    ],
)
def test_graph_validation_names_the_turn_and_edge(value, message):
    with pytest.raises(ConfigError, match=message):
        resolve_topology(value, 3)


def test_configs_check_the_topology_and_refuse_it_where_unsupported():
    with pytest.raises(ConfigError, match=r"MAGRPOConfig.topology, turn 2: same_turn edges form a cycle 0 -> 1 -> 0"):
        MAGRPOConfig(topology=[{}, {"same_turn": [[0, 1], [1, 0]]}])
    with pytest.raises(ConfigError, match=r"MADPOConfig.topology='chain': the preference trainers pair"):
        MADPOConfig(topology="chain")
    with pytest.raises(ConfigError, match=r"CentralizedMAGRPOConfig.topology='debate': one model writes"):
        CentralizedMAGRPOConfig(topology="debate")
    with pytest.raises(ConfigError, match=r"num_turns=2 needs external_transition.*topology='chain' shows no answer"):
        MAGRPOTrainer(model=tiny_model(), num_agents=2, reward_func=lambda a, b: [0.0], args=cfg("chain", num_turns=2))
    with pytest.raises(ConfigError, match=r"MAGRPOConfig.topology, turn 1: .*agent 2 is out of range for 2 agents"):
        MAGRPOTrainer(model=tiny_model(), num_agents=2, reward_func=lambda a, b: [0.0], args=cfg({"acting": [0, 2]}))


def test_default_composition():
    visible = [(0, 1, "plan\n"), (1, 2, " draft "), (2, 2, "mine")]
    assert compose_prompt("Q. ", visible, 2, 2) == (
        "Q.\n\nAgent 1's answer (previous turn):\nplan\n\nAgent 2's answer (this turn):\ndraft\n\n"
        "Your answer (this turn):\nmine"
    )
    assert compose_prompt("Q. ", [], 0, 1) == "Q. "  # nothing seen: the prompt as it is


# ------------------------------------------------------------------ stages of an episode, returns by hand
class FakeSamples:
    def __init__(self, texts):
        self.texts = texts


def fake_episode(topology, *, turns=1, g=2, prompt=None):
    """Agent i's answer k at a node is 'i<k>'; records each stage's acting agents and rows per agent."""
    calls = []

    def generate(agents, nodes, g, acting=None, **_):
        who = list(range(len(nodes[0].prompts))) if acting is None else acting
        calls.append((who, len(nodes) * g, [nd.prompts for nd in nodes]))
        return [FakeSamples([f"{i}{k}" for _ in nodes for k in range(g)]) for i in who]

    def reward(a, b):  # agent 0's answer k counts 10 k, agent 1's k counts k
        return [10.0 * int(a[0][1:] or 0) + int(b[0][1:] or 0)]

    nodes = root_nodes(FORMATTERS, ROWS[:1], [0])
    ep = run_episode(
        [0, 1],
        nodes,
        reward_func=reward,
        num_generations=g,
        settings=GenerationSettings(max_new_tokens=4),
        num_turns=turns,
        generate_fn=generate,
        topology=topology,
        topology_prompt=prompt,
    )
    return ep, calls


def test_chain_samples_g_per_answer_of_the_agent_before_and_its_returns_flow_back():
    ep, calls = fake_episode("chain")
    assert [(who, rows) for who, rows, _ in calls] == [([0], 2), ([1], 4)]  # agent 0: G, agent 1: G^2
    s0, s1 = ep.turns
    assert (s0.scored, s1.scored, s0.acting, s1.acting) == (False, True, [0], [1])
    assert s0.rewards.tolist() == [[0.0, 0.0]] and s0.children.tolist() == [[0, 1]]
    assert s1.rewards.tolist() == [[0.0, 1.0], [10.0, 11.0]]  # node m carries agent 0's answer '0m'
    assert [nd.prompts[1] for nd in s1.nodes] == [f"{BASE[1]}\n\nAgent 1's answer (this turn):\n0{m}" for m in (0, 1)]
    assert len(s0.samples[1].texts) == 0 and s1.samples[0].completion_ids.shape[0] == 0  # the idle agent: 0 rows
    adv = episode_advantages(ep, 2, 2, mode="mean", discount=0.5)
    # agent 0: returns 0 + 1 x mean of its child's (0.5, 10.5), minus their mean; agent 1: per node (state)
    assert [a.tolist() for a in adv[0]] == [[-5.0, 5.0], []]
    assert [a.tolist() for a in adv[1]] == [[], [-0.5, 0.5, -0.5, 0.5]]


def test_returns_over_stages_by_hand():
    """Two chain turns of 2 stages: discount 1 from a stage to the next of its turn, 0.5 from turn 1 to turn 2.
    R3 = [[2, 4], [6, 8]]; R2 = 0 + mean R3 per child = [[3, 7]]; R1 = [[0 + 0.5 x mean R2, 1], [10, 11]] =
    [[2.5, 1], [10, 11]]; R0 = [[mean(2.5, 1), mean(10, 11)]] = [[1.75, 10.5]]."""
    rewards = [torch.zeros(1, 2), torch.tensor([[0.0, 1.0], [10.0, 11.0]]), torch.zeros(1, 2)]
    rewards.append(torch.tensor([[2.0, 4.0], [6.0, 8.0]]))
    children = [
        torch.tensor([[0, 1]]),
        torch.tensor([[0, -1], [-1, -1]]),
        torch.tensor([[0, 1]]),
        torch.full((2, 2), -1),
    ]
    expected = [[[1.75, 10.5]], [[2.5, 1.0], [10.0, 11.0]], [[3.0, 7.0]], [[2.0, 4.0], [6.0, 8.0]]]
    returns = tree_returns(rewards, children, [1.0, 0.5, 1.0, 1.0])
    assert [r.tolist() for r in returns] == expected
    values = [torch.zeros(r.shape[0]) for r in rewards]
    adv, _ = tree_gae(rewards, values, children, discount=[1.0, 0.5, 1.0, 1.0], lam=1.0)
    assert [a.tolist() for a in adv] == expected  # V = 0 and lambda = 1: the tree returns
    turns = [
        Turn(nodes=[], samples=[], rewards=r, children=c, turn=s // 2, acting=[s % 2], scored=s % 2 == 1)
        for s, (r, c) in enumerate(zip(rewards, children))
    ]
    adv = episode_advantages(Episode(turns), 2, 2, mode="none", discount=0.5)
    assert [a.tolist() for a in adv[0]] == [[1.75, 10.5], [], [3.0, 7.0], []]
    assert [a.tolist() for a in adv[1]] == [[], [2.5, 1.0, 10.0, 11.0], [], [2.0, 4.0, 6.0, 8.0]]
    adv = episode_advantages(Episode(turns), 2, 2, mode="none", discount=0.5, grouping="agent_turn")
    assert adv[0][0].tolist() == [0.5, 10.5]  # no return from turn 2, but the turn's own reward flows back


def test_leader_and_debate_need_no_transition_and_show_the_previous_turn():
    ep, calls = fake_episode("leader", turns=2)
    assert [(who, rows) for who, rows, _ in calls] == [([0], 2), ([1], 4), ([0], 8)]
    final = ep.turns[2].nodes[3]  # from turn 1's stage-2 node 1 (plan '01'), its joint action 1 (worker answer '11')
    assert final.prompts == [f"{BASE[0]}\n\nAgent 2's answer (previous turn):\n11", BASE[1]]
    # agent 0's final answer k counts 10 k, the worker's answer of turn 1 ('11', sample 1) counts 1
    assert ep.turns[2].rewards[3].tolist() == [1.0, 11.0]
    ep, calls = fake_episode("debate", turns=2)
    assert [(who, rows) for who, rows, _ in calls] == [([0, 1], 2), ([0, 1], 4)]
    shown = "\n\nYour answer (previous turn):\n01\n\nAgent 2's answer (previous turn):\n11"
    assert ep.turns[1].nodes[1].prompts[0] == BASE[0] + shown


def test_a_topology_prompt_composes_every_acting_agents_prompt():
    seen = []

    def prompt(base, visible, agent, turn, row):
        seen.append((agent, turn, visible, row["prompt"]))
        return f"{base} | " + ",".join(text for _, _, text in visible)

    ep, _ = fake_episode({"same_turn": [[1, 0]]}, prompt=prompt)
    assert seen[0] == (1, 1, [], "Task 0.") and seen[1] == (0, 1, [(1, 1, "10")], "Task 0.")
    assert [nd.prompts[0] for nd in ep.turns[1].nodes] == ["A: Task 0. | 10", "A: Task 0. | 11"]


# ------------------------------------------------------------------ tiny-model runs
def varied_reward(a, b):
    """A reward that differs from answer to answer, so that every group has a learning signal."""
    return [float(sum(map(ord, a[0])) % 7 + sum(map(ord, b[0])) % 5)]


def cfg(topology, config=MAGRPOConfig, **kw):
    base = dict(
        per_device_train_batch_size=1,
        num_generations=2,
        max_new_tokens=4,
        max_steps=2,
        learning_rate=1e-2,
        logging_steps=0,
        disable_tqdm=True,
        topology=topology,
    )
    return config(**{**base, **kw})


def rows_per_stage(ep):
    return [[s.completion_ids.shape[0] for s in turn.samples] for turn in ep.turns]


def trained(topology, trainer=MAGRPOTrainer, config=MAGRPOConfig, **kw):
    t = trainer(
        model=tiny_model(),
        tokenizer=tiny_tokenizer(),
        train_dataset=ROWS,
        reward_func=varied_reward,
        formatters=FORMATTERS,
        args=cfg(topology, config, **kw),
    )
    history = t.train()["history"]
    assert len(history) == 2 and all("agent/1/policy/pg_loss" in m for m in history)
    ep = t.rollout(ROWS[:1], [0], settings=t.generation_settings(), num_generations=2, reward_func=t.reward_func)
    return t, ep


def text(ep, stage, agent, row):
    return ep.turns[stage].samples[agent].texts[row].strip()


def test_magrpo_parallel_and_chain():
    _, ep = trained("parallel")
    assert rows_per_stage(ep) == [[2, 2]] and ep.turns[0].nodes[0].prompts == BASE
    t, ep = trained("chain")
    assert rows_per_stage(ep) == [[2, 0], [0, 4]]
    for m in range(2):  # stage-2 node m: agent 0's answer m of stage 1
        shown = f"{BASE[1]}\n\nAgent 1's answer (this turn):\n{text(ep, 0, 0, m)}"
        assert ep.turns[1].nodes[m].prompts == [BASE[0], shown]
    metrics = t.evaluate(ROWS)  # greedy, one sample: each row's scored stage holds both answers
    assert "eval/reward/mean" in metrics and len(t.last_eval_samples) == 2
    sample = t.last_eval_samples[0]
    answer = sample["completions"][0].strip()
    assert sample["prompts"] == [BASE[0], f"{BASE[1]}\n\nAgent 1's answer (this turn):\n{answer}"]
    # a comparison's records of a chain: every joint answer of the scored stage (G x G per row), each with the
    # answer of agent 0 its node carries, the stage's reward, and the row's agent-0 tokens shared among them
    records = episode_records([ep])
    scored = ep.turns[1]
    assert [(r["row"], r["sample"]) for r in records] == [(0, k) for k in range(4)]
    assert [r["reward"] for r in records] == scored.rewards.reshape(-1).tolist()
    assert [r["completions"] for r in records] == [
        [ep.turns[0].samples[0].texts[m], scored.samples[1].texts[m * 2 + k]] for m in range(2) for k in range(2)
    ]
    agent0 = ep.turns[0].samples[0].completion_mask.sum().item()
    agent1 = scored.samples[1].completion_mask.sum(dim=1).tolist()
    assert [r["tokens"] for r in records] == pytest.approx([a + agent0 / 4 for a in agent1])


def test_magrpo_debate_and_leader():
    _, ep = trained("debate", num_turns=2)
    assert rows_per_stage(ep) == [[2, 2], [4, 4]]
    for m in range(2):  # turn-2 node m: turn 1's joint action m
        a, b = text(ep, 0, 0, m), text(ep, 0, 1, m)
        assert ep.turns[1].nodes[m].prompts == [
            f"{BASE[0]}\n\nYour answer (previous turn):\n{a}\n\nAgent 2's answer (previous turn):\n{b}",
            f"{BASE[1]}\n\nAgent 1's answer (previous turn):\n{a}\n\nYour answer (previous turn):\n{b}",
        ]
    _, ep = trained("leader", num_turns=2)
    assert rows_per_stage(ep) == [[2, 0], [0, 4], [8, 0]]
    plan = text(ep, 0, 0, 1)
    assert ep.turns[1].nodes[1].prompts == [BASE[0], f"{BASE[1]}\n\nAgent 1's answer (this turn):\n{plan}"]
    worker = text(ep, 1, 1, 1 * 2 + 0)  # stage-2 node 1, joint action 0: turn-2 node 2
    assert ep.turns[1].children[1, 0] == 2
    assert ep.turns[2].nodes[2].prompts == [f"{BASE[0]}\n\nAgent 2's answer (previous turn):\n{worker}", BASE[1]]


def test_magrpo_user_graph():
    graph = [{"same_turn": [[1, 0]]}, {"acting": [1], "previous_turn": [[0, 1]]}]
    t, ep = trained(graph, num_turns=2)
    assert rows_per_stage(ep) == [[0, 2], [4, 0], [0, 8]]
    first = text(ep, 0, 1, 1)
    assert ep.turns[1].nodes[1].prompts == [f"{BASE[0]}\n\nAgent 2's answer (this turn):\n{first}", BASE[1]]
    assert ep.turns[1].children[1, 1] == 3
    shown = f"{BASE[1]}\n\nAgent 1's answer (previous turn):\n{text(ep, 1, 0, 1 * 2 + 1)}"
    assert ep.turns[2].nodes[3].prompts == [BASE[0], shown]  # agent 0 does not act in turn 2: its base prompt
    metrics = t.episode_metrics(ep)
    assert set(metrics) >= {"reward/turn_1/mean", "reward/turn_2/mean", "agent/0/completion/mean_length"}


def test_iac_chain_values_every_stage_and_advantages_only_where_an_agent_acts():
    from comlrl.configs.actor_critic import IACConfig

    t, ep = trained("chain", IACTrainer, IACConfig)
    adv = t.compute_advantages(ep, {})
    assert [[a.numel() for a in per] for per in adv] == [[2, 0], [0, 4]]


def test_maac_chain_critics_label_each_acting_agent_by_its_number():
    from comlrl.configs.actor_critic import MAACConfig
    from comlrl.trainers.actor_critic import MAACTrainer

    for critic_type in ("v", "q"):
        t, ep = trained("chain", MAACTrainer, MAACConfig, critic_type=critic_type)
        stage2 = t._critic_texts(t.critics[0], ep)[1]
        prompt = f"[Agent 2 prompt]\n{ep.turns[1].nodes[0].prompts[1]}"
        if critic_type == "v":  # one text per node: agent 1 (the second agent) alone acts
            assert stage2[0] == prompt
        else:  # one per joint action: its prompt, then its answer
            assert stage2[0] == f"{prompt}\n\n[Agent 2 answer]\n{ep.turns[1].samples[1].texts[0]}"


def test_lora_team_chain_trains_each_adapter_alone_where_their_stages_differ():
    from peft import LoraConfig

    t = MAGRPOTrainer(
        model=tiny_model(),
        num_agents=2,
        tokenizer=tiny_tokenizer(),
        train_dataset=ROWS,
        reward_func=varied_reward,
        formatters=FORMATTERS,
        args=cfg("chain", bf16=True, team_lora_forward=True),
        peft_config=LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj"], lora_dropout=0.0),
    )
    assert [len(g) for g in t.update._update_groups()] == [2]  # a pair that routes one pass when rows match
    before = [[p.detach().clone() for p in a.params] for a in t.agents]
    t.train()
    for a, old in zip(t.agents, before):
        assert any(not torch.equal(p, q) for p, q in zip(a.params, old))  # each adapter learned
