"""The update half of the training loop: each agent's policy loss over a step's rollouts, forward and backward by
chunk (agents of a LoRA team in one routed pass), then its optimizer step; ``num_iterations`` passes per step.

:class:`PolicyUpdate` is the component :class:`comlrl.trainers.base.MultiAgentTrainer` holds as ``update``; the loss
math is :func:`comlrl.algorithms.losses.policy_loss`, the step :func:`optimizer_step`, the one every update
of the package ends with (the critic's, DPO's and the reward model's too).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch

from ..algorithms.losses import loss_weights, policy_loss
from ..engine.logprobs import SamplerSettings, completion_logprobs, team_completion_logprobs
from ..engine.process import release_freed_memory
from ..engine.team import active_adapter, can_route, reference_mode, trainable
from ..parallel import sharding
from ..parallel.job import ProcessTeam
from ..parallel.sharding import is_shard
from ..rollout.agent import Agent
from ..rollout.episode import Episode
from .metrics import iteration_metrics


@dataclass
class FrozenLogprobs:
    """An update's log-probs that do not change during it, by chunk (batch index, first row): ``old``, the policy that
    sampled (recorded on the first iteration, when the parameters are still those), ``ref``, the KL reference, and
    ``sampler``, the old policy as the rollout's sampler processed it (top-k, top-p, repetition penalty), which the
    importance weight compares with the rollout's log-probs."""

    old: dict = field(default_factory=dict)
    ref: dict = field(default_factory=dict)
    sampler: dict = field(default_factory=dict)


class PolicyUpdate:
    """The policy update of a :class:`comlrl.trainers.base.MultiAgentTrainer`: ``trainer.update.optimize(buffer)``.

    It reads the trainer's config, agents and placement when it runs (they are the trainer's: a config changed or a
    checkpoint loaded after construction is what the next update sees).
    """

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer

    @property
    def args(self) -> Any:
        """The trainer's config."""
        return self.trainer.args

    @property
    def agents(self) -> list[Agent]:
        """This process's agents."""
        return self.trainer.agents

    @property
    def dist(self) -> ProcessTeam:
        """This process's part of the team (:class:`comlrl.parallel.job.ProcessTeam`)."""
        return self.trainer.dist

    @property
    def device(self) -> torch.device:
        return self.trainer.device

    @property
    def corrects_rollout(self) -> bool:
        """Whether the loss reweights tokens by p_train / p_rollout."""
        return self.trainer.corrects_rollout

    @property
    def rollout_is_cap(self) -> float:
        """The importance weight's upper bound."""
        return self.trainer.rollout_is_cap

    def autocast(self, device: torch.device | None = None) -> torch.autocast:
        """The training forward's autocast context on ``device`` (the trainer's)."""
        return self.trainer.autocast(device)

    def device_of(self, agent: Agent) -> torch.device:
        """Where ``agent`` computes: its model, reference, loss inputs and autocast."""
        return self.trainer.agent_devices[agent.index]

    def optimize(self, buffer: list[tuple[Episode, list[list[torch.Tensor]]]]) -> dict[str, float]:
        """``num_iterations`` optimizer steps per agent over all buffered rollouts."""
        metrics: dict[str, float] = {"time/loss": 0.0, "time/optimizer": 0.0}
        for group in self._update_groups():
            data = {}  # agent index -> (batches, weights, the chunks' frozen log-probs, tokens the loss weighs)
            for agent in group:
                # the stages the agent acted in: under a topology it samples at one stage of each turn it plays
                acted = [
                    ((r, turn.turn), (turn.samples[agent.index], adv[agent.index][t]))
                    for r, (ep, adv) in enumerate(buffer)
                    for t, turn in enumerate(ep.turns)
                    if turn.acts(agent.index)
                ]
                batches = [b for _, b in acted]
                weights = self.token_weights(buffer, [s for s, _ in batches], keys=[k for k, _ in acted])
                tokens = sum(float((w > 0).sum()) for w in weights)  # the step's, before the replicas split it
                # data parallel: this replica's rows, the whole step's normalizer
                batches, weights = self.dist.local_rows(batches, weights, self.args.num_generations)
                data[agent.index] = (batches, weights, FrozenLogprobs(), tokens)
            per_iteration: list[dict[int, dict[str, float]]] = []
            for it in range(self.args.num_iterations):
                start = time.perf_counter()
                if len(group) > 1 and same_rows([data[a.index][0] for a in group]):
                    metric_sums = self._accumulate_team(group, data, it)
                else:  # one agent, or agents that sampled at different stages (a topology): each alone
                    metric_sums = {
                        a.index: self._accumulate_agent(
                            a, *data[a.index][:2], frozen=data[a.index][2], iteration=it, tokens=data[a.index][3]
                        )
                        for a in group
                    }
                # sum the replicas' gradients: together they are the full-batch gradient
                metric_sums = {a.index: self.dist.reduce_gradients(a, metric_sums[a.index]) for a in group}
                mid = time.perf_counter()
                steps = {a.index: self._optimizer_step(a) for a in group}
                metrics["time/loss"] += mid - start
                metrics["time/optimizer"] += time.perf_counter() - mid
                per_iteration.append({i: dict(metric_sums[i], grad_norm=steps[i].grad_norm) for i in metric_sums})
            for agent in group:
                pre = f"agent/{agent.index}/"
                metrics.update(
                    {
                        pre + "policy/" + k: v
                        for k, v in iteration_metrics([m[agent.index] for m in per_iteration]).items()
                    }
                )
                metrics[pre + "lr"] = steps[agent.index].lr  # the last iteration's
        # once, after the last agent: the next agent's gradients and activations reuse the previous one's freed heap
        # pages, where trimming after every agent made each re-fault them (2 fp32 agents: ~250k page faults and
        # 0.3-0.6 s of loss time per step, peak RSS unchanged)
        if self.args.release_memory:
            release_freed_memory()
        return self.dist.merge_metrics(metrics)  # every agent's metrics on every rank

    def token_weights(
        self, buffer: list[tuple[Episode, Any]], samples: list[Any], keys: list[tuple[int, int]] | None = None
    ) -> list[torch.Tensor]:
        """Loss weights of one agent's batches of a step (one per buffered rollout and turn, in that order): the
        ``loss_type`` normalization, within each turn with ``turn_weighting='turns'``, within each rollout for bnpo;
        truncated completions weigh 0 with ``mask_truncated_completions``. ``keys``: (rollout, turn) of each batch
        (default: every stage of every buffered rollout, its index as the turn)."""
        a = self.args
        if keys is None:
            keys = [(r, t) for r, (ep, _) in enumerate(buffer) for t in range(len(ep.turns))]
        masks = [s.completion_mask for s in samples]
        if a.mask_truncated_completions:
            masks = [m * ~s.truncated[:, None] for m, s in zip(masks, samples)]
        per_turn = a.turn_weighting == "turns"
        by_rollout = a.loss_type == "bnpo"
        groups = None
        if per_turn or by_rollout:
            groups = [((r if by_rollout else None), (t if per_turn else None)) for r, t in keys]
        return loss_weights(masks, a.loss_type, groups, a.max_new_tokens)

    def _update_groups(self) -> list[list[Agent]]:
        """Agents whose losses run in one forward: with ``team_lora_forward``, up to that many agents of a LoRA team on
        one base in bf16, routed row by row (:func:`comlrl.engine.logprobs.team_completion_logprobs`); every other agent
        alone. In agent order."""
        size = self.args.team_lora_forward
        size = (len(self.agents) if size else 1) if isinstance(size, bool) else size
        groups: dict[int, list[Agent]] = {}
        for a in self.agents:
            joint = a.adapter is not None and size > 1 and self.args.bf16 and self.dist.team_forward
            groups.setdefault(id(a.model) if joint else -1 - a.index, []).append(a)
        out = []
        for group in groups.values():
            if len(group) > 1 and can_route(group[0].model, [a.adapter for a in group]):
                out.extend(group[i : i + size] for i in range(0, len(group), size))
            else:
                out.extend([a] for a in group)
        return sorted(out, key=lambda g: g[0].index)

    def _accumulate_agent(
        self,
        agent: Agent,
        batches: list,
        weights: list[torch.Tensor],
        *,
        frozen: FrozenLogprobs,
        iteration: int,
        tokens: float | None = None,
    ) -> dict[str, float]:
        """Forward/backward over every chunk of an agent's samples; returns the weighted metric sums. ``tokens``: the
        step's tokens with a nonzero weight, over which ``entropy`` is a mean (default: those of ``weights``)."""
        if not agent.model.training:  # a full .train() walks every module (~30 ms for a PEFT team)
            agent.model.train()
        agent.optimizer.zero_grad(set_to_none=True)
        # backward must run while the agent's adapter is active: PEFT freezes inactive adapters
        with active_adapter(agent.model, agent.adapter):
            metric_sums: dict[str, float] = {}
            chunks = list(self._chunks(batches))
            # a sharded agent: every rank of its mesh runs as many passes
            for _ in range(self.dist.lockstep_passes(agent, len(chunks)) - len(chunks)):
                self._idle_pass(agent, iteration)
            device = self.device_of(agent)
            sampler = self.rollout_sampler if iteration == 0 else None
            if tokens is None:
                tokens = sum(float((w > 0).sum()) for w in weights)
            for b, lo, sl in chunks:
                tensors = self._chunk_tensors(batches[b][0], sl, device)
                with self.autocast(device):
                    logp, *extra = self._logprobs(agent.model, tensors, sampler, entropy=True)
                if sampler is not None:
                    frozen.sampler[(b, lo)] = extra[0]
                self._chunk_loss(
                    agent,
                    logp,
                    tensors,
                    adv=batches[b][1][sl],
                    weights=weights[b][sl],
                    rollout_logp=self._rollout_logp(batches[b][0], sl, device),
                    frozen=frozen,
                    key=(b, lo),
                    iteration=iteration,
                    metric_sums=metric_sums,
                    entropy=(extra[-1], tokens),
                ).backward()
            return metric_sums

    def _idle_pass(self, agent: Agent, iteration: int) -> None:
        """A forward/backward of zero weight on one token (and the reference's forward where the real chunks run
        one): what a rank with fewer rows runs so that every rank of a sharded agent takes part in each pass."""
        pad, device = agent.tokenizer.pad_token_id or 0, self.device_of(agent)
        tensors = [torch.full((1, 1), pad, device=device), torch.ones(1, 1, dtype=torch.long, device=device)]
        tensors = tensors * 2  # a one-token prompt and a one-token completion
        with self.autocast(device):
            logp = self._logprobs(agent.model, tensors)
        if iteration == 0 and self.args.beta > 0:
            self._ref_logprobs(agent, tensors, FrozenLogprobs(), ("idle",))
        (logp.sum() * 0.0).backward()

    def _accumulate_team(self, group: list[Agent], data: dict, iteration: int) -> dict[int, dict[str, float]]:
        """:meth:`_accumulate_agent` for agents sharing a LoRA base: each chunk of every agent in one routed
        forward and one backward of the summed losses (each adapter's gradient is its own agent's)."""
        model, device = group[0].model, self.device_of(group[0])  # one shared base: one device
        if not model.training:
            model.train()
        for a in group:
            a.optimizer.zero_grad(set_to_none=True)
        metric_sums: dict[int, dict[str, float]] = {a.index: {} for a in group}
        sampler = self.rollout_sampler if iteration == 0 else None
        with trainable([p for a in group for p in a.params]):  # PEFT freezes the adapters that are not active
            for b, lo, sl in self._chunks(data[group[0].index][0]):
                parts = [self._chunk_tensors(data[a.index][0][b][0], sl, device) for a in group]
                with self.autocast(device):
                    scored = team_completion_logprobs(
                        model,
                        [a.adapter for a in group],
                        parts,
                        temperature=self.args.temperature,
                        sampler=sampler,
                        entropy=True,
                    )
                if sampler is not None:
                    for a, (_, sampled, _) in zip(group, scored):
                        data[a.index][2].sampler[(b, lo)] = sampled
                logps, entropies = [x[0] for x in scored], [x[-1] for x in scored]
                total = sum(
                    self._chunk_loss(
                        a,
                        logp,
                        tensors,
                        adv=data[a.index][0][b][1][sl],
                        weights=data[a.index][1][b][sl],
                        rollout_logp=self._rollout_logp(data[a.index][0][b][0], sl, device),
                        frozen=data[a.index][2],
                        key=(b, lo),
                        iteration=iteration,
                        metric_sums=metric_sums[a.index],
                        entropy=(entropy, data[a.index][3]),
                    )
                    for a, logp, tensors, entropy in zip(group, logps, parts, entropies)
                )
                total.backward()
        return metric_sums

    def _chunks(self, batches: list) -> Iterator[tuple[int, int, slice]]:
        """(batch index, first row, row slice) of every forward chunk (``forward_batch_size`` rows at most)."""
        chunk = self.args.forward_batch_size
        for b, (samples, _) in enumerate(batches):
            rows = samples.completion_ids.shape[0]
            for lo in range(0, rows, chunk or rows):
                yield b, lo, slice(lo, lo + (chunk or rows))

    def _logprobs(
        self, model: Any, tensors: list[torch.Tensor], sampler: SamplerSettings | None = None, entropy: bool = False
    ) -> torch.Tensor | tuple[torch.Tensor, ...]:
        """Completion log-probs of one chunk under ``model`` (a sharded model's forward runs inside its FSDP hooks);
        with ``sampler`` and/or ``entropy``, a tuple as :func:`comlrl.engine.logprobs.completion_logprobs` returns it."""
        return sharding.forward(
            model,
            completion_logprobs,
            model,
            *tensors,
            temperature=self.args.temperature,
            sampler=sampler,
            entropy=entropy,
        )

    @property
    def rollout_sampler(self) -> SamplerSettings | None:
        """The rollout's sampler processing, when the importance weight needs the trainer's log-probs under it too.

        Why: the rollout records each token's log-prob under the distribution it drew from (vLLM's
        ``processed_logprobs``, the decode loop alike): after the repetition penalty, renormalized over what top-k /
        top-p keep. The loss's own log-probs stay the full softmax at the temperature (the policy trained, as TRL
        scores it); only the weight compares like with like. None when nothing is corrected, or when the processing
        is the temperature alone (the old log-probs are that already)."""
        a = self.args
        sampler = SamplerSettings(
            temperature=a.temperature, top_k=a.top_k, top_p=a.top_p, repetition_penalty=a.repetition_penalty
        )
        return sampler if self.corrects_rollout and sampler.filters else None

    def _chunk_tensors(self, samples: Any, sl: slice, device: torch.device) -> list[torch.Tensor]:
        """The chunk's (prompt ids, prompt mask, completion ids, completion mask) on the model's ``device``."""
        return [
            x[sl].to(device)
            for x in (samples.prompt_ids, samples.prompt_mask, samples.completion_ids, samples.completion_mask)
        ]

    def _rollout_logp(self, samples: Any, sl: slice, device: torch.device) -> torch.Tensor | None:
        """The chunk's rollout log-probs when the loss corrects for the rollout's policy (``rollout_correction``)."""
        if not self.corrects_rollout:
            return None
        if samples.rollout_logprobs is None:
            raise RuntimeError("rollout_correction is on but the rollout recorded no log-probs")
        return samples.rollout_logprobs[sl].to(device)

    def _chunk_loss(
        self,
        agent: Agent,
        logp: torch.Tensor,
        tensors: list[torch.Tensor],
        *,
        adv: torch.Tensor,
        weights: torch.Tensor,
        rollout_logp: torch.Tensor | None,
        frozen: FrozenLogprobs,
        key: tuple[int, int],
        iteration: int,
        metric_sums: dict[str, float],
        entropy: tuple[torch.Tensor, float] | None = None,
    ) -> torch.Tensor:
        """An agent's policy loss on one chunk (its metrics added to ``metric_sums``); ``rollout_logp``: the log-probs the
        tokens were sampled with, when they are corrected for (see :func:`comlrl.algorithms.losses.policy_loss`).
        ``entropy``: (the chunk's token entropies, the step's tokens with a nonzero weight): adds ``entropy``, this
        chunk's part of the mean token entropy over the tokens the loss weighs (TRL's ``entropy``)."""
        if iteration == 0:  # parameters are still those that sampled: old log-probs are free
            frozen.old[key] = logp.detach()
        ref = self._ref_logprobs(agent, tensors, frozen, key)
        loss, m = policy_loss(
            logp,
            frozen.old[key],
            adv.to(logp.device),
            weights=weights.to(logp.device),
            epsilon=self.args.epsilon,
            ref_logp=ref,
            beta=self.args.beta,
            rollout_logp=rollout_logp,
            is_cap=self.rollout_is_cap,
            epsilon_high=self.args.epsilon_high,
            sampler_logp=frozen.sampler.get(key),
        )
        if entropy is not None:
            values, tokens = entropy
            m["entropy"] = (values.to(weights.device) * (weights > 0)).sum() / max(tokens, 1.0)
        for k, v in m.items():
            metric_sums[k] = metric_sums.get(k, 0.0) + float(v)
        return loss

    def _ref_logprobs(
        self, agent: Agent, tensors: list[torch.Tensor], frozen: FrozenLogprobs, key: tuple
    ) -> torch.Tensor | None:
        """Log-probs under the frozen reference: a copy of the initial model, or the LoRA base with adapters off."""
        if self.args.beta <= 0:
            return None
        if key not in frozen.ref:
            ctx = reference_mode(agent.model) if agent.adapter is not None else contextlib.nullcontext()
            model = agent.model if agent.adapter is not None else agent.ref_model
            with torch.no_grad(), ctx, self.autocast(self.device_of(agent)):
                frozen.ref[key] = self._logprobs(model, tensors)
        return frozen.ref[key]

    def _optimizer_step(self, agent: Agent) -> OptimizerStep:
        """Clip (``max_grad_norm``) and apply the agent's gradients, then its schedule."""
        return optimizer_step(
            optimizer=agent.optimizer,
            params=agent.params,
            max_grad_norm=self.args.max_grad_norm,
            scheduler=agent.scheduler,
        )


@dataclass
class OptimizerStep:
    """What one step reports: the gradients' total 2-norm before clipping and the learning rate of the next step."""

    grad_norm: float
    lr: float


def optimizer_step(
    *,
    optimizer: torch.optim.Optimizer,
    params: list[torch.Tensor],
    max_grad_norm: float | None,
    scheduler: Any = None,
) -> OptimizerStep:
    """Clip the gradients of ``params`` to total norm ``max_grad_norm`` (None, 0 or below: no clipping), step the
    optimizer, then ``scheduler`` (when given), and set the gradients to None.

    FSDP shards (DTensors) count with their whole tensor: a shard's norm is combined over its mesh, and a mix of
    sharded and whole parameters (a sharded critic's value head) is clipped over all of them at once.
    """
    clip = max_grad_norm if max_grad_norm and max_grad_norm > 0 else None
    shards = sum(1 for p in params if is_shard(p))
    if 0 < shards < len(params):  # torch's norm cannot stack a DTensor's norm with a tensor's
        norm = sharding.clip_grad_norm_(params, clip)
    elif clip is not None:
        norm = torch.nn.utils.clip_grad_norm_(params, clip)
    else:
        norm = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
    norm = float(norm.full_tensor() if is_shard(norm) else norm)
    optimizer.step()
    if scheduler is not None:
        scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    lr = scheduler.get_last_lr()[0] if scheduler is not None else optimizer.param_groups[0]["lr"]
    return OptimizerStep(norm, lr)


def same_rows(batches: list[list[tuple[Any, torch.Tensor]]]) -> bool:
    """Whether several agents' batches (one list of (samples, advantages) per agent) have the same number of rows
    batch by batch, so that their chunks can run as one routed forward."""
    rows = [[s.completion_ids.shape[0] for s, _ in b] for b in batches]
    return all(r == rows[0] for r in rows)
