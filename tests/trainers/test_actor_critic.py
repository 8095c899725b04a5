"""IAC and MAAC: TD/GAE targets by hand, value loss, and critics that learn a fixed reward per prompt."""

import pytest
import torch
from tiny import tiny_model, tiny_tokenizer

from comlrl.algorithms.advantages import normalize, tree_gae
from comlrl.algorithms.losses import value_loss
from comlrl.errors import ConfigError
from comlrl.trainers import IACConfig, IACTrainer, MAACConfig, MAACTrainer, MAGRPOTrainer

CHAIN = dict(
    rewards=[torch.tensor([[1.0]]), torch.tensor([[2.0]]), torch.tensor([[3.0]])],
    values=[torch.tensor([0.5]), torch.tensor([1.0]), torch.tensor([1.5])],
    children=[torch.tensor([[0]]), torch.tensor([[0]]), torch.tensor([[-1]])],
)


def test_td0_targets_and_advantages_three_turns():
    adv, tgt = tree_gae(**CHAIN, discount=0.9, lam=0.0)
    # delta_t = r_t + 0.9 V_{t+1} - V_t
    assert [round(float(a), 6) for a in adv] == [1.4, 2.35, 1.5]
    assert [round(float(t), 6) for t in tgt] == [1.9, 3.35, 3.0]


def test_gae_lambda_half_three_turns():
    adv, tgt = tree_gae(**CHAIN, discount=0.9, lam=0.5)
    # A2 = 1.5; A1 = 2.35 + 0.45 * 1.5 = 3.025; A0 = 1.4 + 0.45 * 3.025 = 2.76125
    torch.testing.assert_close(torch.stack([a.squeeze() for a in adv]), torch.tensor([2.76125, 3.025, 1.5]))
    torch.testing.assert_close(torch.stack([t.squeeze() for t in tgt]), torch.tensor([3.26125, 4.025, 3.0]))


def test_gae_lambda_one_is_monte_carlo_return_minus_value():
    adv, _ = tree_gae(**CHAIN, discount=0.9, lam=1.0)
    assert float(adv[0]) == pytest.approx(1 + 0.9 * 2 + 0.81 * 3 - 0.5)


def test_gae_on_a_branching_tree_uses_the_mean_child_advantage():
    rewards = [torch.tensor([[1.0, 0.0]]), torch.tensor([[2.0, 4.0], [0.0, 0.0]])]
    values = [torch.tensor([1.0]), torch.tensor([2.0, 0.5])]
    children = [torch.tensor([[0, 1]]), torch.full((2, 2), -1)]
    adv, _ = tree_gae(rewards, values, children, discount=1.0, lam=1.0)
    # child 0: A = [0, 2] (mean 1); child 1: A = [-0.5, -0.5] (mean -0.5)
    torch.testing.assert_close(adv[1], torch.tensor([[0.0, 2.0], [-0.5, -0.5]]))
    torch.testing.assert_close(adv[0], torch.tensor([[1.0 + 2.0 - 1.0 + 1.0, 0.0 + 0.5 - 1.0 - 0.5]]))


def test_value_loss_plain_and_clipped():
    v, t = torch.tensor([1.0, 2.0]), torch.tensor([0.0, 4.0])
    assert float(value_loss(v, v, t)) == pytest.approx(0.5 * (1 + 4) / 2)
    old = torch.tensor([0.8, 1.0])  # second value moved by 1.0 > clip 0.5: clipped value 1.5 is worse -> used
    assert float(value_loss(v, old, t, clip=0.5)) == pytest.approx(0.5 * (1 + 6.25) / 2)


def test_normalize():
    x = normalize(torch.tensor([1.0, 3.0]))
    torch.testing.assert_close(x, torch.tensor([-1.0, 1.0]), atol=1e-5, rtol=0)


ROWS = [{"prompt": f"Task {i}: {'abc' * i}", "target": [-1.0, 0.5, 1.0, 2.0][i]} for i in range(4)]


def fixed_reward(a, b, batch_items):
    return [float(batch_items[0]["target"])]


def ac_trainer(cls, cfg_cls, transition=None, **kw):
    settings = dict(
        per_device_train_batch_size=4,
        num_generations=2,
        max_new_tokens=3,
        max_steps=40,
        learning_rate=0.0,
        critic_learning_rate=3e-3,
        logging_steps=0,
        disable_tqdm=True,
        seed=0,
    )
    return cls(
        model=tiny_model(),
        tokenizer=tiny_tokenizer(),
        train_dataset=ROWS,
        reward_func=fixed_reward,
        args=cfg_cls(**{**settings, **kw}),
        critic=tiny_model(seed=3),
        external_transition=transition,
    )


@pytest.mark.parametrize("cls,cfg_cls", [(IACTrainer, IACConfig), (MAACTrainer, MAACConfig)])
def test_critic_learns_fixed_reward_per_prompt(cls, cfg_cls):
    t = ac_trainer(cls, cfg_cls, shuffle=False)
    out = t.train()
    losses = [h["critic/0/value_loss"] for h in out["history"]]
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert last < 0.1 * first, (first, last)
    # steadily: the loss of each block of 10 steps is below the block before it
    blocks = [sum(losses[i : i + 10]) / 10 for i in range(0, 40, 10)]
    assert all(b2 < b1 for b1, b2 in zip(blocks, blocks[1:])), blocks

    ep = t.rollout(ROWS, [0, 1, 2, 3], settings=t.generation_settings(), num_generations=2, reward_func=t.reward_func)
    values, _ = t._values(ep)[0]
    torch.testing.assert_close(values[0], torch.tensor([r["target"] for r in ROWS]), atol=0.25, rtol=0)
    assert len(t.critics) == (1 if cls is MAACTrainer else 2)


def test_maac_critic_updated_once_per_joint_sample():
    t = ac_trainer(MAACTrainer, MAACConfig, max_steps=3)
    t.train()
    steps = [s["step"] for s in t.critics[0].optimizer.state.values()]
    assert steps and all(int(s) == 3 for s in steps)


def test_maac_q_critic_and_multi_turn():
    t = ac_trainer(
        MAACTrainer,
        MAACConfig,
        critic_type="q",
        max_steps=2,
        num_turns=2,
        gae_lambda=0.5,
        value_clip=0.2,
        normalize_advantages=True,
        transition=lambda agent_completions: [f"again: {c}" for c in agent_completions],
    )
    out = t.train()
    assert "critic/0/value_loss" in out["metrics"]
    ep = t.rollout(ROWS[:2], [0, 1], settings=t.generation_settings(), num_generations=2, reward_func=t.reward_func)
    adv = t.compute_advantages(ep, {})
    assert [x.shape[0] for x in adv[0]] == [4, 8]  # turn 1: 2 nodes x G; turn 2: 4 nodes x G


def test_iac_value_head_on_actor_backbone_moves_only_the_head():
    t = ac_trainer(IACTrainer, IACConfig, use_separate_critic=False, max_steps=3)
    before = [p.detach().clone() for p in t.agents[0].model.parameters()]
    head = t.critics[0].model.head.weight.detach().clone()
    t.train()
    assert all(torch.equal(p, q) for p, q in zip(before, t.agents[0].model.parameters()))  # actor lr 0, head only
    assert not torch.equal(head, t.critics[0].model.head.weight)


def test_actor_critic_works_with_one_generation_and_lora():
    from peft import LoraConfig

    t = IACTrainer(
        model=tiny_model(),
        tokenizer=tiny_tokenizer(),
        train_dataset=ROWS,
        reward_func=fixed_reward,
        args=IACConfig(
            per_device_train_batch_size=2,
            num_generations=1,
            max_new_tokens=3,
            max_steps=2,
            learning_rate=1e-2,
            logging_steps=0,
            disable_tqdm=True,
        ),
        peft_config=LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj"], lora_dropout=0.0),
    )
    out = t.train()
    assert "critic/1/value_loss" in out["metrics"]


def test_bad_actor_critic_configs():
    with pytest.raises(ConfigError, match="use MAACConfig for Q"):
        IACConfig(critic_type="q")
    with pytest.raises(ConfigError, match="centralized critic"):
        MAACConfig(use_separate_critic=False)
    with pytest.raises(ConfigError, match="gae_lambda"):
        IACConfig(gae_lambda=1.5)
    with pytest.raises(ConfigError, match="IACTrainer needs args=IACConfig"):
        IACTrainer(
            model=tiny_model(),
            tokenizer=tiny_tokenizer(),
            train_dataset=ROWS,
            reward_func=fixed_reward,
            args=MAACConfig(),
        )
    with pytest.raises(ConfigError, match="MAGRPOTrainer needs args=MAGRPOConfig"):
        MAGRPOTrainer(
            model=tiny_model(),
            tokenizer=tiny_tokenizer(),
            train_dataset=ROWS,
            reward_func=fixed_reward,
            args=IACConfig(),
        )


@pytest.mark.parametrize(
    "cls,cfg_cls,kw,folders",
    [
        (IACTrainer, IACConfig, {}, ["agent_0/critic", "agent_1/critic"]),
        (MAACTrainer, MAACConfig, {}, ["critic"]),
        (IACTrainer, IACConfig, {"use_separate_critic": False}, ["agent_0", "agent_1"]),  # the head on the actor
    ],
)
def test_save_model_writes_critics_that_reload(cls, cfg_cls, kw, folders, tmp_path):
    from comlrl.engine.critic import encode_texts, load_critic

    t = ac_trainer(cls, cfg_cls, max_steps=1, **kw)
    t.train()  # one critic update: the saved critic is the trained one, not the initial copy
    t.save_model(str(tmp_path / "final"))
    texts = [r["prompt"] for r in ROWS]
    for critic, folder in zip(t.critics, folders):
        path = tmp_path / "final" / folder
        head = torch.load(path / "value_head.pt", weights_only=True)  # the reference's ValueHead state dict
        assert set(head) == {"value_projection.weight", "value_projection.bias"}
        loaded, tok = load_critic(path)
        ids, mask = encode_texts(tok, texts)
        with torch.no_grad():
            torch.testing.assert_close(loaded(ids, mask), t._forward_values(critic, ids, mask))
    t.save_model(str(tmp_path / "ckpt"), gather_sharded=False)  # a checkpoint keeps its critics in critics.pt
    assert not list((tmp_path / "ckpt").rglob("value_head.pt"))
