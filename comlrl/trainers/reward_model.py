"""Stage 2 of multi-agent RLHF: fitting the joint reward model (:mod:`comlrl.engine.reward_model`) to preference pairs
with the Bradley-Terry loss."""

from __future__ import annotations

import math
from typing import Sequence

import torch
from transformers import PreTrainedTokenizerBase

from ..algorithms.preference import bradley_terry_loss, pair_accuracy
from ..engine.reward_model import JointRewardModel, pair_scores, score_pairs
from ..engine.reward_pairs import check_pairs
from ..errors import ConfigError
from .update import optimizer_step


def train_reward_model(
    model: JointRewardModel,
    tokenizer: PreTrainedTokenizerBase,
    pairs: Sequence[dict],
    eval_pairs: Sequence[dict] | None,
    *,
    epochs: int,
    learning_rate: float,
    batch_size: int,
    max_length: int,
    seed: int,
    max_grad_norm: float | None = 1.0,
    disable_tqdm: bool = False,
) -> dict[str, float]:
    """Fit the reward model to preference pairs with the Bradley-Terry loss (AdamW on its trainable parameters, the
    pairs reshuffled every epoch under ``seed``).

    Returns ``reward_model/``: ``train_loss`` and ``train_accuracy`` (means over the last epoch's batches, scored
    before each update), ``pairs``, ``eval_pairs`` and, when ``eval_pairs`` is not empty, ``eval_loss`` and
    ``eval_accuracy`` on them after training (a tie counts as wrong).
    """
    from tqdm.auto import tqdm

    if epochs < 1 or batch_size < 1:
        raise ConfigError(
            f"reward model training needs epochs >= 1 and batch_size >= 1, got {epochs} and {batch_size}."
        )
    if not learning_rate > 0:
        raise ConfigError(f"reward model learning_rate must be > 0, got {learning_rate}.")
    n_agents = check_pairs(pairs, what="pairs")
    eval_pairs = list(eval_pairs or [])
    if eval_pairs:
        check_pairs(eval_pairs, n_agents, what="eval_pairs")
    params = model.trainable_parameters()
    if not params:
        raise ConfigError("the reward model has no trainable parameters (all requires_grad=False).")
    opt = torch.optim.AdamW(params, lr=learning_rate)
    opt.zero_grad(set_to_none=True)
    gen = torch.Generator().manual_seed(seed)
    steps_per_epoch = math.ceil(len(pairs) / batch_size)
    bar = tqdm(total=epochs * steps_per_epoch, desc="reward model", disable=disable_tqdm, leave=False)
    loss_sum = correct = 0.0
    try:
        for _ in range(epochs):
            model.train()
            order = torch.randperm(len(pairs), generator=gen).tolist()
            loss_sum = correct = 0.0
            for lo in range(0, len(order), batch_size):
                batch = [pairs[k] for k in order[lo : lo + batch_size]]
                chosen, rejected = pair_scores(model, tokenizer, batch, num_agents=n_agents, max_length=max_length)
                loss = bradley_terry_loss(chosen, rejected)
                loss.backward()
                optimizer_step(optimizer=opt, params=params, max_grad_norm=max_grad_norm)
                loss_sum += loss.item() * len(batch)  # pair-weighted: the last batch may be smaller
                correct += pair_accuracy(chosen, rejected).item() * len(batch)
                bar.update(1)
                bar.set_postfix(loss=f"{loss.item():.4f}")
    finally:
        bar.close()
    metrics = {
        "reward_model/train_loss": loss_sum / len(pairs),
        "reward_model/train_accuracy": correct / len(pairs),
        "reward_model/pairs": float(len(pairs)),
        "reward_model/eval_pairs": float(len(eval_pairs)),
    }
    if eval_pairs:
        chosen, rejected = score_pairs(
            model, tokenizer, eval_pairs, num_agents=n_agents, batch_size=2 * batch_size, max_length=max_length
        )
        metrics["reward_model/eval_loss"] = bradley_terry_loss(chosen, rejected).item()
        metrics["reward_model/eval_accuracy"] = pair_accuracy(chosen, rejected).item()
    model.eval()
    return metrics
