import pytest
import torch

from comlrl.algorithms.advantages import BASELINES, compute_advantages, cross_credit, register_baseline, tree_returns

R = torch.tensor([[1.0, 2.0, 3.0, 6.0]])


@pytest.mark.parametrize(
    "mode,expected",
    [
        ("none", [1.0, 2.0, 3.0, 6.0]),
        ("mean", [-2.0, -1.0, 0.0, 3.0]),  # mean 3
        ("loo", [1 - 11 / 3, 2 - 10 / 3, 3 - 3.0, 6 - 2.0]),  # mean of the other three
        ("max", [-5.0, -4.0, -3.0, 0.0]),
    ],
)
def test_baselines_hand_computed(mode, expected):
    torch.testing.assert_close(compute_advantages(R, mode), torch.tensor([expected]))


def test_four_baselines_differ_under_defaults():
    advs = [compute_advantages(R, m) for m in ("none", "mean", "loo", "max")]
    for i in range(4):
        for j in range(i + 1, 4):
            assert not torch.allclose(advs[i], advs[j])


def test_group_std_scaling_is_opt_in():
    """TRL's scale_rewards='group': divide by the group's Bessel-corrected std plus 1e-4. Returns [1, 2, 3, 6]:
    mean 3, A = [-2, -1, 0, 3], std = sqrt(14 / 3) = 2.1602469."""
    a = compute_advantages(R, "mean", scale="group")
    torch.testing.assert_close(a, torch.tensor([[-2.0, -1.0, 0.0, 3.0]]) / (2.1602469 + 1e-4))
    # with std scaling, mean and loo differ only by the factor G/(G-1): scaling does not make them equal
    b = compute_advantages(R, "loo", scale="group")
    torch.testing.assert_close(b, a * 4 / 3)


def test_group_scaling_of_a_pair_by_hand():
    """G = 2, returns [0, 1]: A = [-0.5, 0.5], Bessel std sqrt(0.5) = 0.7071068 (the population std, 0.5, would give
    +-1, sqrt(2) times TRL's advantages)."""
    a = compute_advantages(torch.tensor([[0.0, 1.0]]), "mean", scale="group")
    torch.testing.assert_close(a, torch.tensor([[-0.5, 0.5]]) / (0.7071068 + 1e-4))
    assert a[0, 1].item() == pytest.approx(0.70701, abs=1e-5)


def test_batch_scaling_uses_all_returns():
    """TRL's scale_rewards='batch': the Bessel-corrected std of every return plus 1e-4. Returns 0, 2, 10, 14: mean
    6.5, squared deviations 42.25 + 20.25 + 12.25 + 56.25 = 131, std = sqrt(131 / 3) = 6.6080760."""
    r = torch.tensor([[0.0, 2.0], [10.0, 14.0]])
    torch.testing.assert_close(
        compute_advantages(r, "mean", scale="batch"), torch.tensor([[-1.0, 1.0], [-2.0, 2.0]]) / (6.6080760 + 1e-4)
    )


def test_edge_cases():
    equal = torch.full((2, 3), 5.0)
    assert torch.all(compute_advantages(equal, "mean") == 0)
    assert torch.all(compute_advantages(equal, "max") == 0)
    assert torch.all(compute_advantages(equal, "mean", scale="group") == 0)  # std 0 -> eps, no NaN
    single = torch.tensor([[4.0]])
    assert compute_advantages(single, "none").item() == 4.0
    assert (
        compute_advantages(single, "none", "group").item() == compute_advantages(single, "none", "batch").item() == 4.0
    )
    assert compute_advantages(single, "mean").item() == 0.0
    with pytest.raises(ValueError, match="at least 2"):
        compute_advantages(single, "loo")
    with pytest.raises(ValueError, match="unknown advantage mode"):
        compute_advantages(R, "median")


def test_registry_rejects_duplicates():
    with pytest.raises(ValueError, match="already registered"):
        register_baseline("mean")(lambda r: r)
    assert set(BASELINES) >= {"none", "mean", "loo", "max"}


def test_cross_credit_two_agents_hand_worked():
    # G = 2: joint return R[a, b] for agent 0's sample a and agent 1's sample b
    joint = torch.tensor([[[1.0, 3.0], [5.0, 7.0]]])  # (1, 2, 2)
    torch.testing.assert_close(cross_credit(joint, 0), torch.tensor([[2.0, 6.0]]))  # rows: (1+3)/2, (5+7)/2
    torch.testing.assert_close(cross_credit(joint, 1), torch.tensor([[3.0, 5.0]]))  # cols: (1+5)/2, (3+7)/2
    torch.testing.assert_close(compute_advantages(cross_credit(joint, 0), "mean"), torch.tensor([[-2.0, 2.0]]))
    torch.testing.assert_close(compute_advantages(cross_credit(joint, 1), "mean"), torch.tensor([[-1.0, 1.0]]))


def test_cross_credit_three_agents():
    joint = torch.arange(8, dtype=torch.float32).view(1, 2, 2, 2)  # value = 4a + 2b + c
    torch.testing.assert_close(cross_credit(joint, 0), torch.tensor([[1.5, 5.5]]))
    torch.testing.assert_close(cross_credit(joint, 2), torch.tensor([[3.0, 4.0]]))


def test_tree_returns_hand_worked():
    r0 = torch.tensor([[1.0, 2.0]])
    r1 = torch.tensor([[0.0, 2.0], [4.0, 6.0]])  # children of joint actions 0 and 1
    ret = tree_returns([r0, r1], [torch.tensor([[0, 1]]), torch.full((2, 2), -1)], discount=0.5)
    torch.testing.assert_close(ret[0], torch.tensor([[1.0 + 0.5 * 1.0, 2.0 + 0.5 * 5.0]]))
    torch.testing.assert_close(ret[1], r1)


def test_tree_returns_terminated_branch_keeps_reward():
    r0 = torch.tensor([[3.0, 1.0]])
    r1 = torch.tensor([[10.0, 20.0]])  # only joint action 1 expanded
    ret = tree_returns([r0, r1], [torch.tensor([[-1, 0]]), torch.full((1, 2), -1)], discount=1.0)
    torch.testing.assert_close(ret[0], torch.tensor([[3.0, 16.0]]))


def test_cross_mode_multi_turn_credits_each_sample_with_its_joint_actions_tree_returns():
    """G=2, N=2, two turns: each of the root's 4 joint actions has a child node with 4 joint actions of its own."""
    from comlrl.rollout.episode import Episode, Turn, episode_advantages

    r0 = torch.tensor([[1.0, 2.0, 3.0, 4.0]])  # joint actions (0,0), (0,1), (1,0), (1,1)
    r1 = torch.tensor([[0.0] * 4, [4.0] * 4, [0.0, 2.0, 0.0, 2.0], [8.0] * 4])  # child means 0, 4, 1, 8
    turns = [
        Turn(nodes=[], samples=[], rewards=r0, children=torch.tensor([[0, 1, 2, 3]])),
        Turn(nodes=[], samples=[], rewards=r1, children=torch.full((4, 4), -1)),
    ]
    adv = episode_advantages(Episode(turns), 2, 2, joint_mode="cross", mode="mean", discount=0.5)
    # turn-0 returns 1 + 0, 2 + 2, 3 + 0.5, 4 + 4 = [[1, 4], [3.5, 8]] by (agent 0 sample, agent 1 sample)
    torch.testing.assert_close(adv[0][0], torch.tensor([-1.625, 1.625]))  # agent 0: credits 2.5, 5.75
    torch.testing.assert_close(adv[1][0], torch.tensor([-1.875, 1.875]))  # agent 1: credits 2.25, 6
    # turn 1: only node 2 separates agent 1's samples (rewards [[0, 2], [0, 2]]); agent 0's are tied everywhere
    torch.testing.assert_close(adv[0][1], torch.zeros(8))
    torch.testing.assert_close(adv[1][1], torch.tensor([0.0, 0.0, 0.0, 0.0, -1.0, 1.0, 0.0, 0.0]))


def test_standardize_recentres_after_any_baseline_by_hand():
    """The reference library's advantage_normalization: (A - mean A) / std A per group (population std).
    Returns [1, 2, 3, 6]: mean 3, A = [-2, -1, 0, 3], std = sqrt(14 / 4) = 1.870829."""
    r = torch.tensor([[1.0, 2.0, 3.0, 6.0]])
    want = torch.tensor([[-2.0, -1.0, 0.0, 3.0]]) / 1.8708287
    for mode in ("none", "mean", "loo", "max"):  # a baseline constant in the group drops out
        assert torch.allclose(compute_advantages(r, mode, "standardize"), want, atol=1e-6), mode
    single = torch.tensor([[5.0]])  # a group of one is left as it is (the reference skips it)
    assert compute_advantages(single, "none", "standardize").item() == 5.0
    flat = torch.tensor([[2.0, 2.0]])  # no spread: zero advantages, not a division by zero
    assert torch.equal(compute_advantages(flat, "mean", "standardize"), torch.zeros(1, 2))


def test_expanded_branches_by_scope():
    from comlrl.rollout.episode import expanded_branches

    r = torch.tensor([0.1, 0.5, 0.9])
    assert expanded_branches(r, None) == [True, True, True]
    assert expanded_branches(r, 0.5, "branch") == [True, False, False]  # reward >= threshold: no next turn
    assert expanded_branches(r, 0.5, "node") == [True, True, True]  # mean 0.5 is not > 0.5
    assert expanded_branches(r, 0.4, "node") == [False, False, False]  # mean 0.5 > 0.4: the node stops


def two_turn_episode(r0, r1, children0):
    from comlrl.rollout.episode import Episode, Turn

    return Episode(
        [
            Turn(nodes=[], samples=[], rewards=r0, children=children0),
            Turn(nodes=[], samples=[], rewards=r1, children=torch.full(r1.shape, -1)),
        ]
    )


def test_agent_advantages_divide_by_the_std_of_all_the_agents_returns_by_hand():
    """Returns over two turns: [[1, 3]] and [[0, 4], [2, 2]]. Group means 2; 2 and 2: A = [-1, 1]; [-2, 2], [0, 0].
    All six returns: mean 2, squared deviations 1 + 1 + 4 + 4 + 0 + 0 = 10, Bessel std sqrt(10 / 5) = 1.4142136."""
    from comlrl.algorithms.advantages import agent_advantages

    adv = agent_advantages([torch.tensor([[1.0, 3.0]]), torch.tensor([[0.0, 4.0], [2.0, 2.0]])], "mean")
    torch.testing.assert_close(adv[0], torch.tensor([[-1.0, 1.0]]) / (1.4142136 + 1e-4))
    torch.testing.assert_close(adv[1], torch.tensor([[-2.0, 2.0], [0.0, 0.0]]) / (1.4142136 + 1e-4))
    # the baseline is still the group's: 'none' keeps R, only divided
    raw = agent_advantages([torch.tensor([[1.0, 3.0]])], "none")
    torch.testing.assert_close(raw[0], torch.tensor([[1.0, 3.0]]) / (1.4142136 + 1e-4))
    assert agent_advantages([torch.tensor([[4.0]])], "none")[0].item() == 4.0  # one sample: no std, unscaled


def test_agent_grouping_is_batch_scaling_when_every_agent_shares_the_returns():
    """Single turn, align: each agent's returns are the joint returns, so its std is the batch's."""
    from comlrl.rollout.episode import Episode, Turn, episode_advantages

    r = torch.tensor([[0.0, 2.0], [10.0, 14.0]])
    ep = Episode([Turn(nodes=[], samples=[], rewards=r, children=torch.full((2, 2), -1))])
    agent = episode_advantages(ep, 2, 2, mode="mean", grouping="agent")
    batch = episode_advantages(ep, 2, 2, mode="mean", scale="batch")
    want = torch.tensor([-1.0, 1.0, -2.0, 2.0]) / (6.6080760 + 1e-4)  # std of 0, 2, 10, 14 (see above)
    for i in range(2):
        torch.testing.assert_close(agent[i][0], batch[i][0])
        torch.testing.assert_close(agent[i][0], want)


def test_agent_grouping_in_cross_mode_scales_each_agent_by_its_own_credits():
    """G = 2, N = 2, joint returns [[1, 3], [5, 7]] (agent 0's sample by agent 1's). Credits: agent 0 [2, 6] (std
    sqrt(8) = 2.8284271), agent 1 [3, 5] (std sqrt(2) = 1.4142136): both agents' advantages come out at +-0.7071, where
    the std of the joint returns 1, 3, 5, 7 (2.5819889) would leave agent 0's twice agent 1's."""
    from comlrl.rollout.episode import Episode, Turn, episode_advantages

    r = torch.tensor([[1.0, 3.0, 5.0, 7.0]])
    ep = Episode([Turn(nodes=[], samples=[], rewards=r, children=torch.full((1, 4), -1))])
    adv = episode_advantages(ep, 2, 2, joint_mode="cross", mode="mean", grouping="agent")
    torch.testing.assert_close(adv[0][0], torch.tensor([-2.0, 2.0]) / (2.8284271 + 1e-4))
    torch.testing.assert_close(adv[1][0], torch.tensor([-1.0, 1.0]) / (1.4142136 + 1e-4))
    team = episode_advantages(ep, 2, 2, joint_mode="cross", mode="mean")
    torch.testing.assert_close(team[0][0], 2 * team[1][0])  # the team's: agent 0's credits spread twice as wide


def test_agent_grouping_pools_the_turns_where_batch_scaling_does_not():
    """Turn 0 rewards [[1, 2]], each joint action with a child; turn 1 [[0, 2], [4, 6]]; discount 0.5. Returns: turn 0
    [1 + 0.5 * 1, 2 + 0.5 * 5] = [1.5, 4.5], turn 1 the rewards. All six: mean 3, squared deviations
    2.25 + 2.25 + 9 + 1 + 1 + 9 = 24.5, Bessel std sqrt(24.5 / 5) = 2.2135944; batch scaling takes each turn's own."""
    from comlrl.rollout.episode import episode_advantages

    ep = two_turn_episode(torch.tensor([[1.0, 2.0]]), torch.tensor([[0.0, 2.0], [4.0, 6.0]]), torch.tensor([[0, 1]]))
    adv = episode_advantages(ep, 2, 2, mode="mean", discount=0.5, grouping="agent")
    torch.testing.assert_close(adv[1][0], torch.tensor([-1.5, 1.5]) / (2.2135944 + 1e-4))
    torch.testing.assert_close(adv[1][1], torch.tensor([-1.0, 1.0, -1.0, 1.0]) / (2.2135944 + 1e-4))
    batch = episode_advantages(ep, 2, 2, mode="mean", discount=0.5, scale="batch")
    torch.testing.assert_close(batch[1][0], torch.tensor([-1.5, 1.5]) / (2.1213203 + 1e-4))  # std of 1.5, 4.5


def test_agent_turn_grouping_compares_each_turns_own_rewards():
    """The episode above: turn 0's advantages come from its rewards [1, 2] alone (AT-GRPO), not the returns
    [1.5, 4.5]; the last turn has no future, so it is the team's."""
    from comlrl.rollout.episode import episode_advantages

    ep = two_turn_episode(torch.tensor([[1.0, 2.0]]), torch.tensor([[0.0, 2.0], [4.0, 6.0]]), torch.tensor([[0, 1]]))
    at = episode_advantages(ep, 2, 2, mode="mean", discount=0.5, grouping="agent_turn")
    team = episode_advantages(ep, 2, 2, mode="mean", discount=0.5, grouping="team")
    for i in range(2):
        torch.testing.assert_close(at[i][0], torch.tensor([-0.5, 0.5]))
        torch.testing.assert_close(team[i][0], torch.tensor([-1.5, 1.5]))
        torch.testing.assert_close(at[i][1], team[i][1])
    # the configured scale runs per group: 'group' divides [-0.5, 0.5] by the std of [1, 2], sqrt(0.5)
    scaled = episode_advantages(ep, 2, 2, mode="mean", discount=0.5, scale="group", grouping="agent_turn")
    torch.testing.assert_close(scaled[0][0], torch.tensor([-0.5, 0.5]) / (0.7071068 + 1e-4))


def test_agent_turn_grouping_in_cross_mode_credits_each_agent_from_the_turns_rewards():
    """The cross episode above: turn 0 rewards [1, 2, 3, 4] for (0,0), (0,1), (1,0), (1,1). Agent 0's credits
    (1 + 2) / 2, (3 + 4) / 2 = 1.5, 3.5 -> A = [-1, 1]; agent 1's (1 + 3) / 2, (2 + 4) / 2 = 2, 3 -> [-0.5, 0.5]."""
    from comlrl.rollout.episode import Episode, Turn, episode_advantages

    r0 = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    r1 = torch.tensor([[0.0] * 4, [4.0] * 4, [0.0, 2.0, 0.0, 2.0], [8.0] * 4])
    ep = Episode(
        [
            Turn(nodes=[], samples=[], rewards=r0, children=torch.tensor([[0, 1, 2, 3]])),
            Turn(nodes=[], samples=[], rewards=r1, children=torch.full((4, 4), -1)),
        ]
    )
    adv = episode_advantages(ep, 2, 2, joint_mode="cross", mode="mean", discount=0.5, grouping="agent_turn")
    torch.testing.assert_close(adv[0][0], torch.tensor([-1.0, 1.0]))
    torch.testing.assert_close(adv[1][0], torch.tensor([-0.5, 0.5]))
    torch.testing.assert_close(adv[1][1], torch.tensor([0.0, 0.0, 0.0, 0.0, -1.0, 1.0, 0.0, 0.0]))


def test_team_grouping_is_the_default_and_unknown_groupings_raise():
    from comlrl.rollout.episode import episode_advantages

    ep = two_turn_episode(torch.tensor([[1.0, 2.0]]), torch.tensor([[0.0, 2.0], [4.0, 6.0]]), torch.tensor([[0, 1]]))
    default = episode_advantages(ep, 2, 2, mode="loo", scale="group", discount=0.5)
    team = episode_advantages(ep, 2, 2, mode="loo", scale="group", discount=0.5, grouping="team")
    assert all(torch.equal(a, b) for d, t in zip(default, team) for a, b in zip(d, t))
    with pytest.raises(ValueError, match="advantage grouping 'agents'.*team, agent, agent_turn"):
        episode_advantages(ep, 2, 2, grouping="agents")
    with pytest.raises(ValueError, match="scale"):  # 'agent' divides by each agent's std itself
        episode_advantages(ep, 2, 2, scale="group", grouping="agent")


def test_config_validates_the_grouping_and_the_expansion():
    from comlrl import IACConfig, MAACConfig, MADPOConfig, MAGRPOConfig
    from comlrl.errors import ConfigError

    assert MAGRPOConfig().advantage_grouping == "team" and MAGRPOConfig().rollout_expansion == "tree"
    with pytest.raises(ConfigError, match="advantage_grouping='agents'.*'team', 'agent', 'agent_turn'.*'agent'"):
        MAGRPOConfig(advantage_grouping="agents")
    with pytest.raises(ConfigError, match="advantage_grouping='agent'.*scale_rewards='group'"):
        MAGRPOConfig(advantage_grouping="agent", scale_rewards="group")
    with pytest.raises(ConfigError, match="rollout_expansion='beam'.*'tree', 'best', 'top_k'"):
        MAGRPOConfig(rollout_expansion="beam")
    with pytest.raises(ConfigError, match="expansion_top_k=0"):
        MAGRPOConfig(rollout_expansion="top_k", expansion_top_k=0)
    # the actor-critic trainers expand their tree alike (GAE needs no sibling groups); the grouping is MAGRPO's
    assert IACConfig(rollout_expansion="best").rollout_expansion == "best"
    for cls in (IACConfig, MAACConfig):
        with pytest.raises(ConfigError, match="unknown field 'advantage_grouping'"):
            cls(advantage_grouping="agent")
    for name in ("advantage_grouping", "rollout_expansion"):  # MADPO trains single-turn pairs, without advantages
        with pytest.raises(ConfigError, match=f"unknown field '{name}'"):
            MADPOConfig(**{name: "team" if name == "advantage_grouping" else "best"})


def test_tree_gae_takes_a_bf16_critics_values():
    """A critic computing in bf16 hands bf16 values; GAE runs in fp32. Rewards [[1, 2]], child values 0.5 and 1.5 for
    the two joint actions, V(root) 1, discount 1, lambda 1: A = r + V(child) - V(root) + mean A(child)."""
    from comlrl.algorithms.advantages import tree_gae

    rewards = [torch.tensor([[1.0, 2.0]]), torch.tensor([[0.0, 0.0], [1.0, 1.0]])]
    children = [torch.tensor([[0, 1]]), torch.full((2, 2), -1)]
    values = [torch.tensor([1.0]), torch.tensor([0.5, 1.5])]
    adv, targets = tree_gae(rewards, [v.bfloat16() for v in values], children, discount=1.0, lam=1.0)
    # child advantages: [-0.5, -0.5] and [-0.5, -0.5]; root: 1 + 0.5 - 1 - 0.5 = 0, 2 + 1.5 - 1 - 0.5 = 2
    torch.testing.assert_close(adv[0], torch.tensor([[0.0, 2.0]]))
    torch.testing.assert_close(targets[0], torch.tensor([[1.0, 3.0]]))
    assert adv[0].dtype == targets[0].dtype == torch.float32
