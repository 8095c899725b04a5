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
