"""The update of MADPO (:class:`comlrl.trainers.madpo.MADPOTrainer` holds it as ``update``): the team DPO loss over a
step's micro-batches of preference pairs, each agent's gradient through its own log-ratio term, then each agent's
optimizer step (:func:`comlrl.trainers.update.optimizer_step`). The loss math is
:func:`comlrl.algorithms.preference.team_dpo_loss`.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from ..algorithms.preference import sequence_logps, team_dpo_loss
from ..engine.logprobs import completion_logprobs
from ..engine.team import active_adapter, reference_mode
from ..rollout.agent import Agent
from .pairs import add_pair_sums, eval_mode, pair_metrics, pair_tensors
from .update import optimizer_step


def dpo_loss_options(args: Any) -> dict[str, Any]:
    """The keyword options of :func:`~comlrl.algorithms.preference.team_dpo_loss` a preference config sets."""
    return {
        "beta": args.beta,
        "loss_type": args.loss_type,
        "label_smoothing": args.label_smoothing,
        "reference_free": args.reference_free,
    }


class DPOUpdate:
    """MADPO's update: ``trainer.update.optimize(micro)``; it reads the trainer's config and agents when it runs."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer

    @property
    def args(self) -> Any:
        """The trainer's config."""
        return self.trainer.args

    @property
    def agents(self) -> list[Agent]:
        """The team's agents."""
        return self.trainer.agents

    def optimize(self, micro: list[list[tuple[dict, float]]]) -> dict[str, float]:
        """One optimizer step per agent over the micro-batches of (pair, loss weight): each agent's gradient of the
        team DPO loss through its own log-ratio term (the other agents' terms enter as values)."""
        a = self.args
        for agent in self.agents:
            if not agent.model.training:
                agent.model.train()
            agent.optimizer.zero_grad(set_to_none=True)
        sums: dict[str, torch.Tensor] = {}
        count = 0
        for batch in micro:
            records = [p for p, _ in batch]
            weights = torch.tensor([w for _, w in batch])
            tensors = [self.pair_tensors(agent, records) for agent in self.agents]
            ref_c, ref_r = self.reference_logps(records, tensors)
            with torch.no_grad():
                values = torch.stack([self.sequence_logps(ag, t) for ag, t in zip(self.agents, tensors)])  # (N, 2B)
            b = len(records)
            for i, (agent, t) in enumerate(zip(self.agents, tensors)):
                # forward and backward with the agent's adapter active: PEFT freezes the inactive adapters
                with active_adapter(agent.model, agent.adapter):
                    live = torch.cat([values[:i], self.sequence_logps(agent, t, grad=True)[None], values[i + 1 :]])
                    loss, m = team_dpo_loss(
                        live[:, :b], live[:, b:], ref_c, ref_r, **dpo_loss_options(a), pair_weights=weights
                    )
                    (loss / len(micro)).backward()
            add_pair_sums(sums, m, values, b)
            count += b
        metrics = pair_metrics(sums, count, a.beta)
        metrics["pairs/trained"] = float(count)
        for agent in self.agents:
            step = optimizer_step(
                optimizer=agent.optimizer, params=agent.params, max_grad_norm=a.max_grad_norm, scheduler=agent.scheduler
            )
            metrics[f"agent/{agent.index}/grad_norm"] = step.grad_norm
            metrics[f"agent/{agent.index}/lr"] = step.lr
        return metrics

    def pair_tensors(self, agent: Agent, records: list[dict]) -> list[torch.Tensor]:
        """(prompt ids, prompt mask, completion ids, completion mask) of the agent's chosen answers, then its
        rejected ones: 2B rows, prompts left-padded, completions right-padded."""
        return [x.to(self.trainer.device) for x in pair_tensors(agent, records)]

    def sequence_logps(self, agent: Agent, tensors: list[torch.Tensor], grad: bool = False) -> torch.Tensor:
        """(2B,) log-probs of the rows' completions under the agent's current policy, reduced as ``loss_type``
        reads them (:func:`sequence_logps`: summed, or averaged per token for IPO)."""
        ctx = contextlib.nullcontext() if grad else torch.no_grad()
        with ctx, active_adapter(agent.model, agent.adapter), self.trainer.autocast():
            tokens = completion_logprobs(agent.model, *tensors)
            return sequence_logps(tokens, tensors[3], self.args.loss_type)

    def reference_logps(
        self, records: list[dict], tensors: list[list[torch.Tensor]]
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """(N, B) reference log-probs of the chosen and rejected answers (reduced as :meth:`sequence_logps`),
        computed once per pair without dropout (eval mode when dropout is on; else the train-mode forward the policy
        uses) and kept in it."""
        if self.args.reference_free:
            return None, None
        missing = [k for k, r in enumerate(records) if "ref_chosen" not in r]
        if missing:
            for agent, t in zip(self.agents, tensors):
                model = agent.model if agent.adapter is not None else agent.ref_model
                ctx = reference_mode(agent.model) if agent.adapter is not None else contextlib.nullcontext()
                # Dropout on: the reference is the model without it (eval mode). Dropout off: the same math in
                # either mode, and the train-mode forward is the one the policy's log-probs come from.
                quiet = eval_mode([model]) if not self.args.disable_dropout else contextlib.nullcontext()
                with torch.no_grad(), quiet, ctx, self.trainer.autocast():
                    logps = sequence_logps(completion_logprobs(model, *t), t[3], self.args.loss_type).tolist()
                b = len(records)
                for k in missing:
                    r = records[k]
                    r.setdefault("ref_chosen", [0.0] * self.trainer.num_agents)[agent.index] = logps[k]
                    r.setdefault("ref_rejected", [0.0] * self.trainer.num_agents)[agent.index] = logps[b + k]
        device = self.trainer.device
        ref_c = torch.tensor([r["ref_chosen"] for r in records]).T.to(device)
        ref_r = torch.tensor([r["ref_rejected"] for r in records]).T.to(device)
        return ref_c, ref_r
