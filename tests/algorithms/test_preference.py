import math

import pytest
import torch

from comlrl.algorithms.preference import (
    PairSelection,
    agent_margins,
    bradley_terry_loss,
    join_roles,
    pair_accuracy,
    replay_sample,
    replay_weights,
    select_pairs,
    sequence_logps,
    split_roles,
    team_dpo_loss,
)

BETA = 0.5
# 2 agents, 1 pair. Agent 1: (pc - rc) - (pr - rr) = (-1.0 + 1.2) - (-1.5 + 1.4) = 0.2 + 0.1 = 0.3
#                   Agent 2: (-2.0 + 2.05) - (-2.5 + 2.45) = 0.05 + 0.05 = 0.1
# h = 0.3 + 0.1 = 0.4, beta * h = 0.2
PC = [[-1.0], [-2.0]]
PR = [[-1.5], [-2.5]]
RC = [[-1.2], [-2.05]]
RR = [[-1.4], [-2.45]]
# log sigmoid(0.2) = -ln(1 + e^-0.2) = -ln(1 + 0.818731) = -ln(1.818731) = -0.598139
LOGSIG_02 = -0.5981389
# sigmoid(-0.2) = 1 - 1/1.818731 = 1 - 0.549834 = 0.450166
SIG_M02 = 0.4501660
SIG_02 = 0.5498340


def inputs(pc=PC, pr=PR, rc=RC, rr=RR):
    """Policy log-probs that require grad, reference log-probs that do not (all (N, P))."""
    return (
        torch.tensor(pc, requires_grad=True),
        torch.tensor(pr, requires_grad=True),
        torch.tensor(rc),
        torch.tensor(rr),
    )


def test_dpo_value_with_reference():
    pc, pr, rc, rr = inputs()
    loss, m = team_dpo_loss(pc, pr, rc, rr, beta=BETA)
    # team loss -log sigmoid(0.2) = 0.598139; the returned loss sums each agent's copy: 2 * 0.598139 = 1.196278
    torch.testing.assert_close(m["loss"], torch.tensor(-LOGSIG_02))
    torch.testing.assert_close(loss, torch.tensor(-2 * LOGSIG_02))
    torch.testing.assert_close(m["agent_loss"], torch.tensor([-LOGSIG_02, -LOGSIG_02]))
    torch.testing.assert_close(m["margin"], torch.tensor(0.4))
    assert m["reward_accuracy"].item() == 1.0
    # chosen rewards beta*(pc - rc): 0.5*0.2 = 0.1, 0.5*0.05 = 0.025; rejected 0.5*(-0.1) = -0.05, 0.5*(-0.05) = -0.025
    torch.testing.assert_close(m["chosen_rewards"], torch.tensor([0.1, 0.025]))
    torch.testing.assert_close(m["rejected_rewards"], torch.tensor([-0.05, -0.025]))
    assert all(not v.requires_grad for v in m.values())


def test_dpo_value_reference_free():
    pc, pr, _, _ = inputs()
    loss, m = team_dpo_loss(pc, pr, None, None, beta=BETA, reference_free=True)
    # h = (-1.0 + 1.5) + (-2.0 + 2.5) = 1.0, beta*h = 0.5
    # -log sigmoid(0.5) = ln(1 + e^-0.5) = ln(1 + 0.606531) = ln(1.606531) = 0.474077
    torch.testing.assert_close(m["loss"], torch.tensor(0.4740770))
    torch.testing.assert_close(loss, torch.tensor(2 * 0.4740770))
    torch.testing.assert_close(m["margin"], torch.tensor(1.0))
    # the refs count as 0: chosen rewards beta*pc = (-0.5, -1.0), rejected beta*pr = (-0.75, -1.25)
    torch.testing.assert_close(m["chosen_rewards"], torch.tensor([-0.5, -1.0]))
    torch.testing.assert_close(m["rejected_rewards"], torch.tensor([-0.75, -1.25]))
    # gradient: d/dpc_i = -beta*sigmoid(-0.5) = -0.5 * 0.377541 = -0.188770
    loss.backward()
    torch.testing.assert_close(pc.grad, torch.full((2, 1), -0.1887703))
    torch.testing.assert_close(pr.grad, torch.full((2, 1), 0.1887703))


def test_dpo_reference_free_ignores_refs_and_refs_needed_otherwise():
    pc, pr, rc, rr = inputs()
    a, _ = team_dpo_loss(pc, pr, rc, rr, beta=BETA, reference_free=True)
    b, _ = team_dpo_loss(pc, pr, None, None, beta=BETA, reference_free=True)
    torch.testing.assert_close(a, b)
    with pytest.raises(ValueError, match="reference_free"):
        team_dpo_loss(pc, pr, None, None, beta=BETA)


def test_dpo_gradient_is_each_agents_own_term_scaled_by_one_over_p():
    # P = 2: pair 0 as above (h = 0.4); pair 1 swaps chosen and rejected, which negates every term (h = -0.4)
    pc, pr, rc, rr = inputs(
        pc=[[-1.0, -1.5], [-2.0, -2.5]],
        pr=[[-1.5, -1.0], [-2.5, -2.0]],
        rc=[[-1.2, -1.4], [-2.05, -2.45]],
        rr=[[-1.4, -1.2], [-2.45, -2.05]],
    )
    loss, m = team_dpo_loss(pc, pr, rc, rr, beta=BETA)
    loss.backward()
    # d total / d pc_i[p] = -beta*sigmoid(-beta h_p)/P:
    #   pair 0: -0.5 * sigmoid(-0.2) / 2 = -0.5 * 0.450166 / 2 = -0.112542
    #   pair 1: -0.5 * sigmoid(+0.2) / 2 = -0.5 * 0.549834 / 2 = -0.137458
    # (without the detach, each agent would also get the other agent's copy: twice these values)
    g = torch.tensor([-BETA * SIG_M02 / 2, -BETA * SIG_02 / 2])
    torch.testing.assert_close(pc.grad, torch.stack([g, g]))
    torch.testing.assert_close(pr.grad, -torch.stack([g, g]))
    assert m["reward_accuracy"].item() == 0.5  # h > 0 in pair 0 only
    torch.testing.assert_close(m["margin"], torch.tensor(0.0), atol=1e-6, rtol=0)
    # team loss: mean of -log sigmoid(0.2) = 0.598139 and -log sigmoid(-0.2) = 0.598139 + 0.2 = 0.798139 -> 0.698139
    torch.testing.assert_close(m["loss"], torch.tensor(0.6981389))


def test_agent_margin_carries_only_its_own_agents_gradient():
    pc, pr, rc, rr = inputs()
    h_agents, h = agent_margins(pc, pr, rc, rr)
    torch.testing.assert_close(h_agents, torch.tensor([[0.4], [0.4]]))
    torch.testing.assert_close(h, torch.tensor([0.4]))
    h_agents[0].sum().backward()
    # agent 1's margin: d/dpc_1 = 1, d/dpr_1 = -1; agent 2's inputs get nothing
    assert pc.grad.tolist() == [[1.0], [0.0]]
    assert pr.grad.tolist() == [[-1.0], [0.0]]


def test_dpo_label_smoothing():
    pc, pr, rc, rr = inputs()
    loss, m = team_dpo_loss(pc, pr, rc, rr, beta=BETA, label_smoothing=0.1)
    # -(0.9) log sigmoid(0.2) - 0.1 log sigmoid(-0.2); log sigmoid(-0.2) = log sigmoid(0.2) - 0.2 = -0.798139
    # = 0.9 * 0.598139 + 0.1 * 0.798139 = 0.538325 + 0.079814 = 0.618139
    torch.testing.assert_close(m["loss"], torch.tensor(0.6181389))
    loss.backward()
    # d/dh = beta * (-(0.9) sigmoid(-0.2) + 0.1 sigmoid(0.2)) = 0.5 * (-0.405149 + 0.054983) = -0.175083
    torch.testing.assert_close(pc.grad, torch.full((2, 1), -0.1750830))
    torch.testing.assert_close(pr.grad, torch.full((2, 1), 0.1750830))


def test_dpo_ipo_value_and_gradient():
    pc, pr, rc, rr = inputs()
    loss, m = team_dpo_loss(pc, pr, rc, rr, beta=BETA, loss_type="ipo")
    # 1/(2 beta) = 1; (h - 1)^2 = (0.4 - 1)^2 = 0.36; two agents' copies: 0.72
    torch.testing.assert_close(m["loss"], torch.tensor(0.36))
    torch.testing.assert_close(loss, torch.tensor(0.72))
    loss.backward()
    # d/dpc_i = 2 (h - 1) = -1.2, d/dpr_i = +1.2 (P = 1)
    torch.testing.assert_close(pc.grad, torch.full((2, 1), -1.2))
    torch.testing.assert_close(pr.grad, torch.full((2, 1), 1.2))


def test_dpo_rejects_bad_settings():
    pc, pr, rc, rr = inputs()
    with pytest.raises(ValueError, match="'hinge'"):
        team_dpo_loss(pc, pr, rc, rr, beta=BETA, loss_type="hinge")
    with pytest.raises(ValueError, match="label_smoothing"):
        team_dpo_loss(pc, pr, rc, rr, beta=BETA, loss_type="ipo", label_smoothing=0.1)
    with pytest.raises(ValueError, match="beta"):
        team_dpo_loss(pc, pr, rc, rr, beta=0.0)
    with pytest.raises(ValueError, match="shape"):
        team_dpo_loss(pc, pr[:1], rc, rr, beta=BETA)
    with pytest.raises(ValueError, match="P = 0"):
        team_dpo_loss(pc[:, :0], pr[:, :0], rc[:, :0], rr[:, :0], beta=BETA)


def test_bradley_terry_value_gradient_and_accuracy():
    sw = torch.tensor([0.5, 1.0], requires_grad=True)
    sl = torch.tensor([0.5, 0.8])
    loss = bradley_terry_loss(sw, sl)
    # differences 0 and 0.2: -log sigmoid(0) = ln 2 = 0.693147; -log sigmoid(0.2) = 0.598139; mean 0.645643
    torch.testing.assert_close(loss, torch.tensor(0.6456430))
    loss.backward()
    # d/ds_w = -sigmoid(-d)/P: -0.5/2 = -0.25, -0.450166/2 = -0.225083
    torch.testing.assert_close(sw.grad, torch.tensor([-0.25, -SIG_M02 / 2]))
    assert pair_accuracy(sw, sl).item() == 0.5  # the tie counts as wrong
    # logsigmoid is stable far out: -log sigmoid(-1000) = 1000
    torch.testing.assert_close(bradley_terry_loss(torch.tensor([0.0]), torch.tensor([1000.0])), torch.tensor(1000.0))


R = torch.tensor([1.0, 3.0, 3.0, 0.0])
# untied pairs (i, j), gap r_i - r_j: (0,3) 1, (1,0) 2, (1,3) 3, (2,0) 2, (2,3) 3; candidates 1 and 2 tie (3 = 3)
ALL = [(0, 3), (1, 0), (1, 3), (2, 0), (2, 3)]


def test_select_pairs_all_drops_ties():
    assert select_pairs(R, mode="all") == PairSelection(ALL, ties=1)
    assert select_pairs(R, mode="all", pairs_per_prompt=2).pairs == [(0, 3), (1, 0)]


def test_select_pairs_reward_gap_largest_first_index_tie_break():
    sel = select_pairs(R, mode="reward_gap")
    assert sel.pairs == [(1, 3), (2, 3), (1, 0), (2, 0), (0, 3)]
    assert sel.ties == 1
    assert select_pairs(R, mode="reward_gap", pairs_per_prompt=3).pairs == [(1, 3), (2, 3), (1, 0)]


def test_select_pairs_random_subset_is_seeded():
    def draw(seed):
        return select_pairs(R, mode="random", pairs_per_prompt=3, generator=torch.Generator().manual_seed(seed))

    sel = draw(0)
    assert len(sel.pairs) == 3 and set(sel.pairs) <= set(ALL) and sel.pairs == sorted(sel.pairs)
    assert sel.ties == 1
    assert draw(0) == sel
    assert {tuple(draw(s).pairs) for s in range(20)} != {tuple(sel.pairs)}  # other seeds draw other subsets
    assert select_pairs(R, mode="random").pairs == ALL  # no cap: every pair


def test_select_pairs_tolerance_and_all_tied():
    # tolerance 1: |1 - 0| = 1 and |3 - 3| = 0 are ties; pairs left (1,0), (1,3), (2,0), (2,3)
    assert select_pairs(R, mode="all", tie_tolerance=1.0) == PairSelection([(1, 0), (1, 3), (2, 0), (2, 3)], ties=2)
    assert select_pairs(torch.tensor([2.0, 2.0, 2.0]), mode="reward_gap") == PairSelection([], ties=3)


def test_select_pairs_rejects_bad_input():
    with pytest.raises(ValueError, match="'best'"):
        select_pairs(R, mode="best")
    with pytest.raises(ValueError, match="pairs_per_prompt"):
        select_pairs(R, mode="all", pairs_per_prompt=0)
    with pytest.raises(ValueError, match="finite"):
        select_pairs(torch.tensor([1.0, float("nan")]), mode="all")
    with pytest.raises(ValueError, match=r"\(K,\)"):
        select_pairs(R.view(2, 2), mode="all")


AGES = torch.tensor([0, 1, 2, 3])


@pytest.mark.parametrize(
    "mode,kwargs,expected",
    [
        ("current", {}, [1.0, 0.0, 0.0, 0.0]),
        ("last_k", {"k": 2}, [1.0, 1.0, 0.0, 0.0]),  # ages 0 and 1 < 2
        ("all", {}, [1.0, 1.0, 1.0, 1.0]),
        ("decay", {"decay": 0.5}, [1.0, 0.5, 0.25, 0.125]),  # 0.5^0, 0.5^1, 0.5^2, 0.5^3
    ],
)
def test_replay_weights(mode, kwargs, expected):
    assert replay_weights(AGES, mode, **kwargs).tolist() == expected


def test_replay_weights_reject_unknown_mode_and_missing_parameters():
    with pytest.raises(ValueError, match="'newest'"):
        replay_weights(AGES, "newest")
    with pytest.raises(ValueError, match="last_k"):
        replay_weights(AGES, "last_k")
    with pytest.raises(ValueError, match="decay"):
        replay_weights(AGES, "decay")
    with pytest.raises(ValueError, match="ages"):
        replay_weights(torch.tensor([-1]), "all")


def test_split_roles_well_formed_and_reordered():
    assert split_roles("<agent_1> def aux(): pass\n</agent_1>\n<agent_2>\nmain\n</agent_2>", 2) == (
        ["def aux(): pass", "main"],
        True,
    )
    assert split_roles("<agent_2>b</agent_2><agent_1>a</agent_1>", 2) == (["a", "b"], True)
    assert split_roles("<agent_1></agent_1><agent_2> </agent_2>", 2) == (["", ""], True)  # empty roles parse


def test_split_roles_ignores_text_outside_tags():
    text = "Plan: split the work.\n<agent_1>a</agent_1>\nthen\n<agent_2>b</agent_2>\nDone."
    assert split_roles(text, 2) == (["a", "b"], True)


@pytest.mark.parametrize(
    "text",
    [
        "<agent_1>a</agent_1>",  # missing agent_2
        "<agent_1>a</agent_1><agent_2>b</agent_2><agent_1>c</agent_1>",  # duplicated
        "<agent_1>a</agent_1><agent_2>b",  # unclosed
        "<agent_1>a<agent_2>b</agent_2></agent_1>",  # nested
        "<agent_1>a</agent_2><agent_2>b</agent_1>",  # closes the other role
        "<agent_1>a</agent_1></agent_1><agent_2>b</agent_2>",  # closed twice
        "<agent_1>a</agent_1><agent_2>b</agent_2><agent_3>c</agent_3>",  # no role 3 in a team of 2
        "<agent_01>a</agent_01><agent_2>b</agent_2>",  # not the spelling join_roles writes
    ],
)
def test_split_roles_malformed(text):
    assert split_roles(text, 2) == (["", ""], False)


def test_join_roles_round_trip():
    outputs = ["def aux(x):\n    return x + 1", "def main():\n    return aux(1)", "tests"]
    text = join_roles(outputs)
    assert text.startswith("<agent_1>def aux(x):") and text.endswith("<agent_3>tests</agent_3>")
    assert split_roles(text, 3) == (outputs, True)
    with pytest.raises(ValueError, match="agent 2"):
        join_roles(["a", "b <agent_1> c"])


def test_select_pairs_with_sides_pairs_only_across_teams() -> None:
    # candidates 0, 1 from the team, 2, 3 from the comparator; rewards 3, 1, 2, 1
    sel = select_pairs(torch.tensor([3.0, 1.0, 2.0, 1.0]), mode="all", sides=[0, 0, 1, 1])
    # across pairs: (0,2) gap 1, (0,3) gap 2, (2,1) gap 1; (1,3) is a tie; (0,1) and (2,3) are within a side
    assert sel.pairs == [(0, 2), (0, 3), (2, 1)]
    assert sel.ties == 1
    gap = select_pairs(torch.tensor([3.0, 1.0, 2.0, 1.0]), mode="reward_gap", pairs_per_prompt=2, sides=[0, 0, 1, 1])
    assert gap.pairs == [(0, 3), (0, 2)]


def test_team_dpo_loss_pair_weights_scale_each_pair() -> None:
    # two pairs, one agent, reference-free: h = (1 - 0, 0 - 1) = (1, -1); beta 1
    pc, pr = torch.tensor([[1.0, 0.0]]), torch.tensor([[0.0, 1.0]])
    loss, m = team_dpo_loss(pc, pr, None, None, beta=1.0, reference_free=True, pair_weights=torch.tensor([1.0, 0.5]))
    expected = (-math.log(1 / (1 + math.exp(-1))) * 1.0 + -math.log(1 / (1 + math.exp(1))) * 0.5) / 2
    assert float(loss) == pytest.approx(expected, rel=1e-6)
    assert float(m["loss"]) == pytest.approx(expected, rel=1e-6)
    with pytest.raises(ValueError, match="pair_weights"):
        team_dpo_loss(pc, pr, None, None, beta=1.0, reference_free=True, pair_weights=torch.tensor([1.0]))


# ----------------------------------------------------------------------------------------------- IPO (TRL's form)


def test_sequence_logps_sum_for_sigmoid_token_mean_for_ipo() -> None:
    # two rows of per-token log-probs, 0 where the mask is 0 (as completion_logprobs returns them)
    tok = torch.tensor([[-1.0, -2.0, -3.0], [-2.0, -2.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    assert sequence_logps(tok, mask, "sigmoid").tolist() == [-6.0, -4.0]
    assert sequence_logps(tok, mask, "ipo").tolist() == [-2.0, -2.0]  # -6 / 3, -4 / 2
    # an empty completion (no tokens) averages to 0, not NaN
    assert sequence_logps(torch.zeros(1, 2), torch.zeros(1, 2), "ipo").tolist() == [0.0]
    with pytest.raises(ValueError, match="loss_type"):
        sequence_logps(tok, mask, "hinge")


def test_ipo_loss_on_token_mean_logps_matches_hand_computed() -> None:
    # one agent, one pair. Chosen tokens (-1, -2, -3), rejected (-2, -2); reference chosen (-1, -1, -1), rejected
    # (-1, -3). Token means: pc = -2, pr = -2, rc = -1, rr = -2, so h = (pc - rc) - (pr - rr) = -1 - 0 = -1.
    # TRL's IPO: (h - 1/(2 beta))^2 with beta = 0.5: (-1 - 1)^2 = 4. (Summed log-probs would give h = -3, loss 16.)
    tok = torch.tensor([[-1.0, -2.0, -3.0], [-2.0, -2.0, 0.0]])
    ref = torch.tensor([[-1.0, -1.0, -1.0], [-1.0, -3.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    pol, rf = sequence_logps(tok, mask, "ipo"), sequence_logps(ref, mask, "ipo")
    loss, m = team_dpo_loss(pol[None, :1], pol[None, 1:], rf[None, :1], rf[None, 1:], beta=0.5, loss_type="ipo")
    assert float(loss) == pytest.approx(4.0) and float(m["margin"]) == pytest.approx(-1.0)
    summed = sequence_logps(tok, mask, "sigmoid"), sequence_logps(ref, mask, "sigmoid")
    loss_sum, _ = team_dpo_loss(
        summed[0][None, :1], summed[0][None, 1:], summed[1][None, :1], summed[1][None, 1:], beta=0.5, loss_type="ipo"
    )
    assert float(loss_sum) == pytest.approx(16.0)


# ------------------------------------------------------------------------------------------- replay sampling


def test_replay_sample_always_takes_the_rounds_own_pairs_first() -> None:
    # 3 fresh pairs (0, 1, 2) and 4 older ones; 5 slots: every fresh pair, then 2 draws by weight
    weights = torch.tensor([1.0, 1.0, 1.0, 0.5, 0.5, 0.0, 0.25])
    fresh = torch.tensor([True, True, True, False, False, False, False])
    for seed in range(20):
        idx = replay_sample(weights, fresh, 5, torch.Generator().manual_seed(seed))
        assert len(idx) == 5 and idx[:3] == [0, 1, 2]
        assert 5 not in idx  # weight 0: never drawn
    a = replay_sample(weights, fresh, 5, torch.Generator().manual_seed(3))
    assert a == replay_sample(weights, fresh, 5, torch.Generator().manual_seed(3))  # seeded: reproducible


def test_replay_sample_draws_the_other_slots_in_proportion_to_weight() -> None:
    # no fresh pair this round; weights 1, 0.5, 0.25, 0.25 (sum 2): expected shares 0.5, 0.25, 0.125, 0.125
    weights = torch.tensor([1.0, 0.5, 0.25, 0.25])
    fresh = torch.tensor([False, False, False, False])
    idx = replay_sample(weights, fresh, 40000, torch.Generator().manual_seed(0))
    share = torch.bincount(torch.tensor(idx), minlength=4).float() / len(idx)
    assert share.tolist() == pytest.approx([0.5, 0.25, 0.125, 0.125], abs=0.01)
    # with fresh pairs: each fresh one once, then every slot drawn from the whole pool by weight (fresh weigh 1)
    weights = torch.tensor([1.0, 1.0, 0.5])
    fresh = torch.tensor([True, True, False])
    idx = replay_sample(weights, fresh, 20002, torch.Generator().manual_seed(1))
    counts = torch.bincount(torch.tensor(idx[2:]), minlength=3).float() / 20000
    assert idx[:2] == [0, 1] and counts.tolist() == pytest.approx([0.4, 0.4, 0.2], abs=0.01)


def test_replay_sample_more_fresh_pairs_than_slots_takes_a_subset_of_them() -> None:
    weights = torch.tensor([1.0] * 6 + [1.0, 1.0])
    fresh = torch.tensor([True] * 6 + [False, False])
    idx = replay_sample(weights, fresh, 4, torch.Generator().manual_seed(0))
    assert len(idx) == 4 and len(set(idx)) == 4 and all(i < 6 for i in idx) and idx == sorted(idx)
    with pytest.raises(ValueError, match="no pair"):
        replay_sample(torch.tensor([0.0]), torch.tensor([False]), 3, torch.Generator())
    with pytest.raises(ValueError, match="weights"):
        replay_sample(torch.tensor([1.0, 1.0]), torch.tensor([True]), 3, torch.Generator())


def test_comparator_reward_selection_by_hand():
    """Team candidates 0, 1 (side 0) against comparator candidates 2, 3 (side 1), rewards [3, 0, 2, 1]: the cross
    pairs with a gap are (0, 2) gap 1, (0, 3) gap 2, (2, 1) gap 2, (3, 1) gap 1. Highest comparator reward first:
    candidate 2 (reward 2) in (2, 1) and (0, 2), larger gap first, then candidate 3's (0, 3), (3, 1)."""
    r = torch.tensor([3.0, 0.0, 2.0, 1.0])
    sel = select_pairs(r, mode="comparator_reward", pairs_per_prompt=None, sides=[0, 0, 1, 1])
    assert sel.pairs == [(2, 1), (0, 2), (0, 3), (3, 1)]
    assert select_pairs(r, mode="comparator_reward", pairs_per_prompt=2, sides=[0, 0, 1, 1]).pairs == [(2, 1), (0, 2)]
    assert (
        select_pairs(r, mode="comparator_reward", pairs_per_prompt=2).pairs
        == select_pairs(r, mode="reward_gap", pairs_per_prompt=2).pairs
    )  # no sides


def test_select_pairs_with_positions_pairs_only_the_same_candidate_index():
    from comlrl.algorithms.preference import select_pairs

    rewards = torch.tensor([3.0, 0.0, 1.0, 2.0, 2.0, 5.0])  # team 0..2, comparator 0..2
    sel = select_pairs(
        rewards, mode="all", pairs_per_prompt=None, sides=[0, 0, 0, 1, 1, 1], positions=[0, 1, 2, 0, 1, 2]
    )
    assert sel.pairs == [(0, 3), (4, 1), (5, 2)] and sel.ties == 0
    assert (
        len(select_pairs(rewards, mode="all", pairs_per_prompt=None, sides=[0, 0, 0, 1, 1, 1]).pairs) == 9
    )  # any team x comparator
