"""Preference-based team training: pure functions on tensors and strings.

Shapes: N agents, P preference pairs. A *pair* is two joint actions of the whole team on one prompt, the chosen
(preferred) one and the rejected one. ``policy_chosen`` etc. are (N, P): agent i's log-prob of its own completion
in pair p, reduced over the completion's tokens by :func:`sequence_logps` (summed for DPO, averaged per token for
IPO, as TRL; the loss functions use whatever log-probs they are given).

* :func:`team_dpo_loss`: multi-agent DPO (Rafailov et al. 2023) on the team's summed log-ratio margin, with
  per-agent credit (each agent's gradient flows only through its own term), sigmoid or IPO loss.
* :func:`bradley_terry_loss`, :func:`pair_accuracy`: a learned joint reward model's pairwise loss.
* :func:`select_pairs`: which (chosen, rejected) pairs to build from one prompt's K scored team candidates.
* :func:`sequence_logps`: a completion's log-prob from its per-token log-probs, as the loss type reads it.
* :func:`replay_weights`, :func:`replay_sample`: how much pairs stored in earlier rounds of iterative training still
  count, and which pairs a round trains on (its own, then stored ones drawn by that weight).
* :func:`split_roles`, :func:`join_roles`: the ``<agent_i>...</agent_i>`` tags of centralized training, where one
  model writes the whole team's answer; :func:`centralized_prompt`: that model's prompt, asking for those tags.
* :class:`CentralizedComparatorAdapter`, :class:`TaggedCentralizedComparatorAdapter`: the prompt and the parser of
  a centralized comparator (MADPO's ``comparator_generation='centralized'``), the same tags by default.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, Sequence

import torch
import torch.nn.functional as F

from ..errors import CentralizedComparatorParseError

# loss_type -> per-pair loss of the margin h: (h, beta, label_smoothing) -> (..., P)
DpoLoss = Callable[[torch.Tensor, float, float], torch.Tensor]


def _sigmoid_loss(h: torch.Tensor, beta: float, eps: float) -> torch.Tensor:
    """-(1-eps) log sigmoid(beta h) - eps log sigmoid(-beta h): DPO, with conservative label smoothing (cDPO)."""
    return -(1.0 - eps) * F.logsigmoid(beta * h) - eps * F.logsigmoid(-beta * h)


def _ipo_loss(h: torch.Tensor, beta: float, eps: float) -> torch.Tensor:
    """(h - 1/(2 beta))^2 (Azar et al. 2023, eq. 17) on the log-probs as given.

    TRL averages the log-probs over each completion's tokens before this loss (its IPO branch), and so does
    :func:`sequence_logps` for loss_type 'ipo'; summed log-probs give the paper's sequence log-ratio instead.
    """
    return (h - 1.0 / (2.0 * beta)) ** 2


DPO_LOSSES: dict[str, DpoLoss] = {"sigmoid": _sigmoid_loss, "ipo": _ipo_loss}


def sequence_logps(token_logps: torch.Tensor, mask: torch.Tensor, loss_type: str = "sigmoid") -> torch.Tensor:
    """Each completion's log-prob as ``loss_type`` reads it: (B, C) per-token log-probs and mask -> (B,).

    'sigmoid': the sum over the completion's tokens (log pi(y | x)). 'ipo': the mean over them (the sum divided by
    the number of tokens, at least 1), as TRL's DPOTrainer computes the log-probs for its IPO loss. Positions where
    ``mask`` is 0 do not count.
    """
    if loss_type not in DPO_LOSSES:
        raise ValueError(f"unknown DPO loss_type '{loss_type}'; valid: {sorted(DPO_LOSSES)}")
    m = mask.to(token_logps.dtype)
    total = (token_logps * m).sum(dim=-1)
    if loss_type == "ipo":
        return total / m.sum(dim=-1).clamp(min=1.0)
    return total


def agent_margins(
    policy_chosen: torch.Tensor,
    policy_rejected: torch.Tensor,
    ref_chosen: torch.Tensor | None = None,
    ref_rejected: torch.Tensor | None = None,
    *,
    reference_free: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The team's log-ratio margin, once per agent with only that agent's term differentiable.

    All inputs (N, P). Agent i's term t_i = (pc_i - rc_i) - (pr_i - rr_i) (reference_free: pc_i - pr_i).
    Returns (h_agents (N, P), h (P,)): h = sum_i t_i detached; h_agents[i] = t_i + (h - t_i).detach(), equal to h
    in value, so d h_agents[i] / d (agent j's inputs) = 0 for j != i.
    """
    if policy_chosen.dim() != 2 or policy_rejected.shape != policy_chosen.shape:
        raise ValueError(
            f"policy log-probs must both have shape (N agents, P pairs), got {tuple(policy_chosen.shape)} "
            f"and {tuple(policy_rejected.shape)}"
        )
    terms = policy_chosen - policy_rejected  # (N, P)
    if not reference_free:
        if ref_chosen is None or ref_rejected is None:
            raise ValueError("ref_chosen and ref_rejected are needed unless reference_free=True")
        if ref_chosen.shape != policy_chosen.shape or ref_rejected.shape != policy_chosen.shape:
            raise ValueError(
                f"reference log-probs must have the policy's shape {tuple(policy_chosen.shape)}, got "
                f"{tuple(ref_chosen.shape)} and {tuple(ref_rejected.shape)}"
            )
        terms = terms - (ref_chosen - ref_rejected)
    total = terms.sum(dim=0)  # (P,)
    h_agents = terms + (total.unsqueeze(0) - terms).detach()  # (N, P): own term live, the others' detached
    return h_agents, total.detach()


def team_dpo_loss(
    policy_chosen: torch.Tensor,
    policy_rejected: torch.Tensor,
    ref_chosen: torch.Tensor | None,
    ref_rejected: torch.Tensor | None,
    *,
    beta: float,
    loss_type: str = "sigmoid",
    label_smoothing: float = 0.0,
    reference_free: bool = False,
    pair_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Multi-agent DPO on the team's implied reward margin, each agent credited through its own term.

    Inputs (N, P) summed sequence log-probs (see the module docstring); the refs may be None when reference_free.
    h = sum_i [(pc_i - rc_i) - (pr_i - rr_i)]  (reference_free: sum_i (pc_i - pr_i), i.e. refs taken as 0).
    Per pair: sigmoid: -(1-eps) log sigmoid(beta h) - eps log sigmoid(-beta h); ipo: (h - 1/(2 beta))^2.
    Agent i's loss is the pair loss of h_i (:func:`agent_margins`), averaged over the P pairs; the returned loss is
    the sum over agents, so d loss / d pc_i[p] = (1/P) d l(h_p) / d h_p, e.g. -beta sigmoid(-beta h_p) / P for
    sigmoid. Its *value* is N times the team's loss (each agent's copy counts once); metrics["loss"] is the team's.
    ``pair_weights`` (P,) >= 0 (replayed pairs, :func:`replay_weights`): pair p's loss counts w_p times in the mean
    over the P pairs (not renormalized, so old pairs weigh less than new ones in the same batch and across batches).

    Returns (loss, metrics), metrics detached: ``loss`` (mean pair loss of h), ``reward_accuracy`` (fraction of
    pairs with h > 0), ``margin`` (mean h; the reward margin is beta * margin), ``chosen_rewards`` and
    ``rejected_rewards`` (N,): per-agent means over pairs of beta (pc_i - rc_i) and beta (pr_i - rr_i) (refs 0 when
    reference_free), and ``agent_loss`` (N,).
    """
    if loss_type not in DPO_LOSSES:
        raise ValueError(f"unknown DPO loss_type '{loss_type}'; valid: {sorted(DPO_LOSSES)}")
    if beta <= 0:
        raise ValueError(f"beta must be > 0, got {beta}")
    if not 0.0 <= label_smoothing < 0.5:
        raise ValueError(f"label_smoothing must be in [0, 0.5), got {label_smoothing}")
    if label_smoothing and loss_type != "sigmoid":
        raise ValueError(f"label_smoothing applies to loss_type 'sigmoid' only, not '{loss_type}'")
    if policy_chosen.dim() == 2 and policy_chosen.shape[1] == 0:
        raise ValueError("no preference pairs (P = 0)")
    h_agents, h = agent_margins(policy_chosen, policy_rejected, ref_chosen, ref_rejected, reference_free=reference_free)
    loss_fn = DPO_LOSSES[loss_type]
    w = torch.ones_like(h) if pair_weights is None else pair_weights.to(h)
    if w.shape != h.shape or (w < 0).any():
        raise ValueError(f"pair_weights must be (P,) = {tuple(h.shape)} and >= 0, got {w.tolist()}")
    agent_loss = (loss_fn(h_agents, beta, label_smoothing) * w).mean(dim=1)  # (N,)
    chosen = policy_chosen.detach() if reference_free else (policy_chosen - ref_chosen).detach()
    rejected = policy_rejected.detach() if reference_free else (policy_rejected - ref_rejected).detach()
    metrics = {
        "loss": (loss_fn(h, beta, label_smoothing) * w).mean(),
        "reward_accuracy": (h > 0).float().mean(),
        "margin": h.mean(),
        "chosen_rewards": beta * chosen.mean(dim=1),
        "rejected_rewards": beta * rejected.mean(dim=1),
        "agent_loss": agent_loss.detach(),
    }
    return agent_loss.sum(), metrics


def bradley_terry_loss(score_chosen: torch.Tensor, score_rejected: torch.Tensor) -> torch.Tensor:
    """mean -log sigmoid(s_w - s_l) over pairs (Bradley & Terry 1952; the reward-model loss of Ouyang et al. 2022).

    score_chosen, score_rejected: (P,) scalar scores of the chosen and rejected joint actions.
    """
    if score_chosen.shape != score_rejected.shape:
        raise ValueError(f"score shapes differ: {tuple(score_chosen.shape)} and {tuple(score_rejected.shape)}")
    return -F.logsigmoid(score_chosen - score_rejected).mean()


def pair_accuracy(score_chosen: torch.Tensor, score_rejected: torch.Tensor) -> torch.Tensor:
    """Fraction of pairs scored strictly right, s_w > s_l (a tie counts as wrong); (P,), (P,) -> () detached."""
    if score_chosen.shape != score_rejected.shape:
        raise ValueError(f"score shapes differ: {tuple(score_chosen.shape)} and {tuple(score_rejected.shape)}")
    return (score_chosen > score_rejected).float().mean().detach()


PAIR_MODES = ("reward_gap", "all", "random", "comparator_reward")


@dataclass
class PairSelection:
    """Pairs (chosen, rejected) of candidate indices, and how many unordered candidate pairs were dropped as ties."""

    pairs: list[tuple[int, int]] = field(default_factory=list)
    ties: int = 0


def select_pairs(
    rewards: torch.Tensor,
    *,
    mode: str = "reward_gap",
    pairs_per_prompt: int | None = None,
    generator: torch.Generator | None = None,
    tie_tolerance: float = 0.0,
    sides: list[int] | None = None,
    positions: list[int] | None = None,
) -> PairSelection:
    """Preference pairs from one prompt's K team candidates, ``rewards`` (K,).

    Candidates: every (i, j) with rewards[i] - rewards[j] > tie_tolerance (i chosen, j rejected); two candidates
    with |r_i - r_j| <= tie_tolerance are a tie, never paired, and counted once in ``ties``.
    ``mode``: 'all': every candidate, ordered by (i, j); 'reward_gap': largest gap first, ties of gaps broken by
    (i, j); 'random': a uniform random subset (torch.randperm with ``generator``), ordered by (i, j);
    'comparator_reward' (the reference library's iterative default): the pairs whose comparator-side candidate (side
    > 0) has the highest reward first, then the largest gap (without sides: as 'reward_gap').
    At most ``pairs_per_prompt`` pairs are kept (None: all). ``sides`` (K,): which team made each candidate (the
    team being trained and a comparator): only candidates of different sides are paired or counted as ties.
    ``positions`` (K,): each candidate's index within its side; only candidates of the same index are paired or
    counted as ties (the reference library's iterative MADPO: the team's i-th answer against the comparator's i-th).
    """
    if mode not in PAIR_MODES:
        raise ValueError(f"unknown pair selection mode '{mode}'; valid: {', '.join(PAIR_MODES)}")
    if rewards.dim() != 1:
        raise ValueError(f"rewards must have shape (K,), got {tuple(rewards.shape)}")
    if not torch.isfinite(rewards).all():
        raise ValueError(f"rewards must be finite, got {rewards.tolist()}")
    if pairs_per_prompt is not None and pairs_per_prompt < 1:
        raise ValueError(f"pairs_per_prompt must be >= 1 or None, got {pairs_per_prompt}")
    if tie_tolerance < 0:
        raise ValueError(f"tie_tolerance must be >= 0, got {tie_tolerance}")
    r = rewards.tolist()
    k = len(r)
    if sides is not None and len(sides) != k:
        raise ValueError(f"sides must give one side per candidate ({k}), got {len(sides)}")
    if positions is not None and len(positions) != k:
        raise ValueError(f"positions must give one index per candidate ({k}), got {len(positions)}")
    side = sides or list(range(k))  # no sides: every candidate its own, so every pair is across
    pos = positions or [0] * k

    def across(i: int, j: int) -> bool:
        return side[i] != side[j] and pos[i] == pos[j]

    ties = sum(1 for i in range(k) for j in range(i + 1, k) if across(i, j) and abs(r[i] - r[j]) <= tie_tolerance)
    # ordered by (i, j)
    pairs = [(i, j) for i in range(k) for j in range(k) if across(i, j) and r[i] - r[j] > tie_tolerance]
    cap = len(pairs) if pairs_per_prompt is None else min(pairs_per_prompt, len(pairs))
    if mode == "reward_gap" or mode == "comparator_reward" and sides is None:
        pairs = sorted(pairs, key=lambda p: (-(r[p[0]] - r[p[1]]), p))[:cap]
    elif mode == "comparator_reward":
        other = [max(i, j, key=lambda c: side[c]) for i, j in pairs]  # the candidate from the comparator's side
        order = sorted(range(len(pairs)), key=lambda n: (-r[other[n]], -(r[pairs[n][0]] - r[pairs[n][1]]), pairs[n]))
        pairs = [pairs[n] for n in order[:cap]]
    elif mode == "random":
        keep = torch.randperm(len(pairs), generator=generator)[:cap].tolist()
        pairs = [pairs[i] for i in sorted(keep)]
    else:
        pairs = pairs[:cap]
    return PairSelection(pairs, ties)


REPLAY_MODES = ("current", "last_k", "all", "decay")


def replay_weights(ages: torch.Tensor, mode: str, k: int | None = None, decay: float | None = None) -> torch.Tensor:
    """Weight of each stored pair by its age in rounds (0 = made this round); ``ages`` long, any shape -> float.

    current: 1 for age 0, else 0. last_k: 1 for age < k (k >= 1; k = 1 is 'current'). all: 1. decay: decay**age,
    0 < decay <= 1 (decay = 1 is 'all').
    """
    if mode not in REPLAY_MODES:
        raise ValueError(f"unknown replay mode '{mode}'; valid: {', '.join(REPLAY_MODES)}")
    if ages.is_floating_point() or (ages < 0).any():
        raise ValueError(f"ages must be integer rounds >= 0, got {ages.tolist()}")
    if mode == "current":
        return (ages == 0).float()
    if mode == "last_k":
        if k is None or k < 1:
            raise ValueError(f"replay mode 'last_k' needs k >= 1, got k={k}")
        return (ages < k).float()
    if mode == "decay":
        if decay is None or not 0.0 < decay <= 1.0:
            raise ValueError(f"replay mode 'decay' needs 0 < decay <= 1, got decay={decay}")
        return torch.full(ages.shape, float(decay)) ** ages.float()
    return torch.ones(ages.shape)  # all


def replay_sample(
    weights: torch.Tensor, fresh: torch.Tensor, slots: int, generator: torch.Generator | None = None
) -> list[int]:
    """Which stored pairs a round trains on: ``slots`` indices into the pool, fresh ones first.

    ``weights`` (P,) >= 0: each stored pair's replay weight (:func:`replay_weights`); ``fresh`` (P,) bool: the
    pairs made this round. Every fresh pair is taken once (when there are more than ``slots``, a uniform random
    subset of them, in index order); each remaining slot is drawn from the whole pool, fresh pairs included, with
    probability w_p / sum(w), independently (with replacement), so a stored pair's expected count is proportional
    to its weight. The weight decides how often a pair trains; each drawn pair then counts once in the loss.
    Randomness from ``generator`` only (a seeded one gives the same sample).
    """
    if weights.dim() != 1 or fresh.shape != weights.shape:
        raise ValueError(f"weights and fresh must both be (P,), got {tuple(weights.shape)} and {tuple(fresh.shape)}")
    if (weights < 0).any() or not torch.isfinite(weights).all():
        raise ValueError(f"weights must be finite and >= 0, got {weights.tolist()}")
    if slots < 1:
        raise ValueError(f"slots must be >= 1, got {slots}")
    w = weights.double()
    new = [i for i in range(len(w)) if fresh[i] and w[i] > 0]
    if len(new) >= slots:
        keep = torch.randperm(len(new), generator=generator)[:slots].tolist()
        return sorted(new[k] for k in keep)
    if not (w > 0).any():
        raise ValueError("no pair to train: every weight is 0")
    drawn = torch.multinomial(w, slots - len(new), replacement=True, generator=generator).tolist()
    return new + drawn


# an opening or closing role tag; the index is checked against 1..N by its exact spelling (so <agent_01> is wrong)
_ROLE_TAG = re.compile(r"<(/?)agent_(\d+)>")


def split_roles(text: str, num_agents: int) -> tuple[list[str], bool]:
    """The N role outputs of a centralized completion ``<agent_1>...</agent_1> ... <agent_N>...</agent_N>``.

    Tags are 1-based and may come in any order; each output is its content with surrounding whitespace stripped.
    Text outside the tags (a preamble, separators, a trailing remark) is ignored. Any of: a role tag missing,
    duplicated, unclosed, closed without being opened, nested inside another, or naming no role in 1..N (including
    spellings such as ``<agent_01>``) gives ok=False and N empty outputs; the caller counts parse failures.
    Returns (outputs, ok).
    """
    if num_agents < 1:
        raise ValueError(f"num_agents must be >= 1, got {num_agents}")
    failed: tuple[list[str], bool] = ([""] * num_agents, False)
    names = {str(i + 1): i for i in range(num_agents)}
    outputs: list[str | None] = [None] * num_agents
    open_role: int | None = None
    content_start = 0
    for m in _ROLE_TAG.finditer(text):
        closing, name = m.group(1) == "/", m.group(2)
        if name not in names:
            return failed
        role = names[name]
        if not closing:
            if open_role is not None or outputs[role] is not None:  # nested, or duplicated
                return failed
            open_role, content_start = role, m.end()
        else:
            if open_role != role:  # closed without being opened, or closes another role
                return failed
            outputs[role] = text[content_start : m.start()].strip()
            open_role = None
    if open_role is not None or any(o is None for o in outputs):  # unclosed, or missing
        return failed
    return [o for o in outputs if o is not None], True


def join_roles(outputs: list[str]) -> str:
    """The centralized completion for role outputs: ``<agent_i>output_i</agent_i>``, one per line, in order.

    split_roles(join_roles(outputs), len(outputs)) == (outputs, True) for outputs without surrounding whitespace;
    an output that contains a role tag is rejected, since the joined text would not parse back.
    """
    for i, out in enumerate(outputs):
        if _ROLE_TAG.search(out):
            raise ValueError(f"output of agent {i + 1} contains a role tag: {out!r}")
    return "\n".join(f"<agent_{i + 1}>{out}</agent_{i + 1}>" for i, out in enumerate(outputs))


CENTRALIZED_TEMPLATE = (
    "You write the answers of a team of {num_roles} agents, all in one reply. Each agent has its own instructions:"
    "\n\n{roles}\n\n"
    "Write every agent's answer inside that agent's tags, in this format:\n\n{format}\n\n"
    "Put each answer only inside its own tags, and nothing else inside them."
)


def centralized_prompt(role_prompts: list[str], template: str = CENTRALIZED_TEMPLATE) -> str:
    """One model's prompt for the whole team of ``len(role_prompts)`` roles: ``template`` with its fields filled in.

    Fields (``str.format``; write literal braces in a template as ``{{`` and ``}}``): ``{roles}``, each role's prompt
    under an ``[Agent i]`` heading (1-based, as the tags); ``{format}``, the ``<agent_i>...</agent_i>`` skeleton the
    answer must follow (:func:`split_roles` reads it back); ``{num_roles}``. The default explains the tag format.
    """
    if not role_prompts:
        raise ValueError("centralized_prompt needs at least one role prompt")
    roles = "\n\n".join(f"[Agent {i + 1}]\n{p.strip()}" for i, p in enumerate(role_prompts))
    skeleton = "\n".join(
        f"<agent_{i + 1}>\n(agent {i + 1}'s answer)\n</agent_{i + 1}>" for i in range(len(role_prompts))
    )
    return template.format(num_roles=len(role_prompts), roles=roles, format=skeleton)


class CentralizedComparatorAdapter(Protocol):
    """How a centralized comparator is asked for the whole team's answer and how its completion is split (the
    reference library's protocol): ``build_prompt(batch_item, agent_prompts)`` returns one prompt; and
    ``parse_completion(completion, batch_item, num_agents)`` returns one answer per agent, or raises
    :class:`~comlrl.errors.CentralizedComparatorParseError` (MADPO then drops that candidate and counts it)."""

    def build_prompt(self, batch_item: dict[str, Any], agent_prompts: Sequence[str]) -> str: ...

    def parse_completion(self, completion: str, batch_item: dict[str, Any], num_agents: int) -> Sequence[str]: ...


@dataclass(frozen=True)
class TaggedCentralizedComparatorAdapter:
    """The default adapter: :func:`centralized_prompt` with ``template`` and :func:`split_roles`, the
    ``<agent_1>...</agent_1>`` tags of the centralized baseline (1-based; the reference library's are 0-based and
    tolerate a missing role, which here fails the parse)."""

    template: str = CENTRALIZED_TEMPLATE

    def build_prompt(self, batch_item: dict[str, Any], agent_prompts: Sequence[str]) -> str:
        return centralized_prompt(list(agent_prompts), self.template)

    def parse_completion(self, completion: str, batch_item: dict[str, Any], num_agents: int) -> list[str]:
        outputs, ok = split_roles(completion, num_agents)
        if not ok:
            raise CentralizedComparatorParseError(
                f"the completion does not hold each of <agent_1>...<agent_{num_agents}> exactly once, closed and "
                f"not nested: {completion[:200]!r}"
            )
        return outputs
