"""Actor-critic trainers: IAC (a critic per agent) and MAAC (one centralized critic).

The rollout, rewards, policy loss, logging and checkpoints are the REINFORCE-family loop's; only the
advantage estimate differs: advantage = GAE/TD target - V(h), with V from *before* the critic update.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .. import configs as ours
from ..algorithms.advantages import clip_rewards, normalize, tree_gae
from ..algorithms.losses import value_loss
from ..compat.configs import IACConfig, MAACConfig  # noqa: F401  (the reference's path: its names and defaults)
from ..compat.keywords import (  # noqa: F401  (RolloutSample: the reference's name)
    RolloutSample,
    compat_critic,
    compat_group_reward,
)
from ..configs.actor_critic import ActorCriticConfig
from ..engine.critic import ValueModel, encode_texts, joint_action_text, joint_state_text, save_value_head
from ..engine.models import copy_model, load_model, load_tokenizer
from ..engine.process import seeded
from ..engine.team import active_adapter, wrap_lora
from ..errors import ConfigError
from ..parallel import distributed, sharding
from ..parallel.placement import shard_bounds
from ..rollout.episode import Episode, joint_indices
from ..rollout.sampling import derive_seed
from .base import MultiAgentTrainer
from .build import Team, build_optimizer, build_tokenizers
from .update import OptimizerStep, PolicyUpdate, optimizer_step


@dataclass(kw_only=True)
class Critic:
    """A value model, its tokenizer and optimizer; ``reads`` says whose prompts it sees (agent index or None=all)."""

    model: ValueModel
    tokenizer: Any
    optimizer: torch.optim.Optimizer
    scheduler: Any
    reads: int | None
    adapter: str | None = None  # the actor's adapter to activate when the head sits on a shared LoRA backbone
    device: torch.device | None = None  # where it computes (None: the trainer's device)
    actor_step_coef: float | None = None  # a head on its actor's backbone trained in the actor's step: its loss weight

    @property
    def index(self) -> int:
        """Position in the team's critics (the checkpoint's order and the metric names): agent index or 0."""
        return 0 if self.reads is None else self.reads


@dataclass(kw_only=True)
class CriticBatch:
    """Critic inputs of one rollout with the values before the update and the regression targets."""

    ids: torch.Tensor  # (K, T) left-padded texts: nodes (V) or joint actions (Q)
    mask: torch.Tensor
    old_values: torch.Tensor  # (K,)
    targets: torch.Tensor  # (K, G) for V (one node, G targets) or (K, 1) for Q


class ActorUpdate(PolicyUpdate):
    """The actors' update of the actor-critic trainers (:class:`PolicyUpdate`): an actor whose value head trains in
    its step (``shared_value_loss_coef``) steps together with that head."""

    def _optimizer_step(self, agent: Any) -> OptimizerStep:
        """The actor's optimizer step. A value head on its backbone with ``shared_value_loss_coef`` c first adds the
        gradients of c x mean (V - target)^2 to the actor's and the head's, then both step: one update on actor loss
        + c x value loss, as the reference library's shared critic."""
        t = self.trainer
        c = next((k for k, x in enumerate(t.critics) if x.actor_step_coef is not None and x.reads == agent.index), None)
        if c is None:
            return super()._optimizer_step(agent)
        critic = t.critics[c]
        critic.optimizer.zero_grad(set_to_none=True)
        # value_loss is 0.5 x the squared error; the reference weighs the squared error itself by the coefficient
        loss = t._value_backward(critic, [b[c] for b in t._critic_batches], 2.0 * critic.actor_step_coef)
        t._joint_losses[critic.index] = loss
        step = super()._optimizer_step(agent)
        t._step_critic(critic, critic.model.trainable_parameters())
        return step


class ActorCriticTrainer(MultiAgentTrainer):
    """Shared machinery of IAC and MAAC. Extra arguments: ``critic`` (model source or object for the
    separate critic(s); default: ``critic_model`` or a copy of the actor's initial model) and ``critic_tokenizer``."""

    config_class = ActorCriticConfig
    accepted_config = ActorCriticConfig
    centralized = False
    # Under torchrun, agent i's critic (IAC) lives on agent i's ranks, the centralized one (MAAC) on every rank; each
    # copy values and updates its shard of the rows (values exchanged, gradients summed).
    supports_distributed = True
    update_class = ActorUpdate

    def __init__(self, *args: Any, critic: Any = None, critic_tokenizer: Any = None, **kwargs: Any) -> None:
        """``critic``: one model source for every critic, or (IAC) a list with one per agent."""
        critic = compat_critic(critic, kwargs)  # the reference's critic_model= / critics=
        self._critic_source, self._critic_tokenizer = critic, critic_tokenizer
        self._critic_batches: list[list[CriticBatch]] = []
        super().__init__(*args, **kwargs)
        self._build_optimizers()

    @property
    def num_critics(self) -> int:
        """Critics of the whole team (under torchrun, ``critics`` holds only this rank's)."""
        return 1 if self.centralized else self.num_agents

    # ------------------------------------------------------------------ construction
    def prepare_models(self, team: Team, models: list, peft_config: Any) -> None:
        """Build the critics' backbones from the actors' *initial* models (before any LoRA wrapping)."""
        local = team.local  # agent index of each model
        reads = [None] if self.centralized else local
        self.critics_spec = []
        for r in reads:
            i = 0 if r is None else r
            if not self.args.use_separate_critic:
                self.critics_spec.append((None, None, r))
                continue
            src = self._critic_source if self._critic_source is not None else self.args.critic_model
            if isinstance(src, (list, tuple)):  # one critic source per agent
                if len(src) != self.num_critics:
                    raise ConfigError(f"critic= lists {len(src)} critics for {self.num_critics} critic(s).")
                src = src[i]
            if src is None and i in local:
                backbone, tok_src = copy_model(models[local.index(i)]), team.sources[i]
            elif src is None:  # the centralized critic on a rank without agent 0: from agent 0's source
                tok_src = team.sources[i]
                backbone = copy_model(tok_src) if hasattr(tok_src, "parameters") else load_model(tok_src)
                if peft_config is not None and self.args.bf16:  # stored as the actors' bases are (and agent 0's is)
                    backbone = backbone.to(torch.bfloat16)
            else:
                backbone = copy_model(src) if hasattr(src, "parameters") else load_model(src)
                tok_src = src
            tok = load_tokenizer(self._critic_tokenizer) if self._critic_tokenizer is not None else None
            if tok is None:
                tok = load_tokenizer(tok_src) if isinstance(tok_src, str) else None
            if tok is None and i not in local:  # the actor's tokenizer, as in one process
                tok = build_tokenizers(self._tokenizer_source, team.sources, [i])[0]
            if peft_config is not None:
                with seeded(derive_seed(self.args.seed, "critic lora", i)):  # the same init on every rank
                    backbone = wrap_lora(backbone, copy.deepcopy(peft_config))
            self.critics_spec.append((backbone, tok, r))

    def _build_optimizers(self) -> None:
        self.critics: list[Critic] = []
        updates = self.total_steps  # one critic update per optimizer step
        agents = {a.index: a for a in self.agents}
        coef = self.args.shared_value_loss_coef  # set only with use_separate_critic=False (the config checks it)
        if coef is not None:
            self.dist.require_one_process(
                f"{type(self.args).__name__}.shared_value_loss_coef={coef}: the value loss on the actors' backbones is "
                "built for one process; under torchrun leave it None (the head trains alone on detached features)."
            )
        for backbone, tok, r in self.critics_spec:
            agent = agents.get(0 if r is None else r)  # None: the centralized critic on a rank without agent 0
            joint = backbone is None and coef is not None
            with seeded(derive_seed(self.args.seed, "critic head", 0 if r is None else r)):  # as in one process
                if backbone is None:
                    model = ValueModel(agent.model, detach_backbone=not joint, shared_backbone=joint)
                else:
                    model = ValueModel(backbone)
            # a head on an actor's backbone sits with that actor; IAC's own backbone with its agent; MAAC's on device
            device = self.device if backbone is not None and r is None else self.agent_devices[0 if r is None else r]
            model.to(device)
            if backbone is not None:  # with fsdp: sharded like the agent it serves
                self.dist.shard_critic(model.backbone, r, bool(self.args.bf16))
            tok = load_tokenizer(tok) if tok is not None else agent.tokenizer
            # trained in the actor's step, the head takes the actor's learning rate: AdamW's update is per parameter,
            # so the two optimizers stepped together are one AdamW over actor and head (the reference's)
            lr = self.args.learning_rate if joint else self.args.critic_learning_rate
            opt, sched = build_optimizer(model.trainable_parameters(), self.args, lr=lr, total_updates=updates)
            adapter = agent.adapter if backbone is None else None
            critic = Critic(
                model=model,
                tokenizer=tok,
                optimizer=opt,
                scheduler=sched,
                reads=r,
                adapter=adapter,
                device=device,
                actor_step_coef=coef if joint else None,
            )
            self.critics.append(critic)
        del self.critics_spec

    def rollout(
        self,
        rows: list[dict],
        row_ids: list[int],
        *,
        settings: Any,
        num_generations: int,
        reward_func: Any,
        **kwargs: Any,
    ) -> Episode:
        """:meth:`MultiAgentTrainer.rollout`; in a compat-style run the reward is called as the reference's IAC /
        MAAC call it: once per row with each agent's whole group (:func:`compat_group_reward`)."""
        fn = getattr(reward_func, "compat_fn", None)
        if fn is not None:
            reward_func = compat_group_reward(fn, num_generations)
        return super().rollout(
            rows, row_ids, settings=settings, num_generations=num_generations, reward_func=reward_func, **kwargs
        )

    # ------------------------------------------------------------------ advantages
    def compute_advantages(self, episode: Episode, metrics: dict[str, Any]) -> list[list[torch.Tensor]]:
        """advantages[agent][turn] = GAE target - V(h), from each agent's critic (IAC) or the shared one (MAAC)."""
        a = self.args
        rewards = clip_rewards([t.rewards for t in episode.turns], a.reward_clip)
        children = [t.children for t in episode.turns]
        discounts = [a.discount if t.scored else 1.0 for t in episode.turns]  # 1 between the stages of a turn
        per_critic, batches = {}, []
        for critic, (node_values, batch) in zip(self.critics, self._values(episode)):
            adv, targets = tree_gae(rewards, node_values, children, discount=discounts, lam=a.gae_lambda)
            per_critic[critic.index] = [x.reshape(-1) for x in adv]
            q = a.critic_type == "q"
            batch.targets = torch.cat([t.reshape(-1, 1) if q else t for t in targets])
            batches.append(batch)
            metrics[f"critic/{critic.index}/value_mean"] = float(batch.old_values.mean())
            metrics[f"critic/{critic.index}/target_mean"] = float(batch.targets.mean())
        self._critic_batches.append(batches)
        # rank 0 writes the metrics: every critic's, wherever it lives
        metrics.update(self.dist.merge_metrics({k: v for k, v in metrics.items() if k.startswith("critic/")}))
        out = []
        for i in range(self.num_agents):
            adv = per_critic.get(0 if self.centralized else i)
            if adv is None:  # under torchrun: an agent (and its critic) on another rank
                out.append([])
                continue
            acted = [t.acts(i) for t in episode.turns]  # a stage the agent did not act in: no advantages
            adv = [x for x, on in zip(adv, acted) if on]
            if a.normalize_advantages and adv:
                flat = normalize(torch.cat(adv))
                adv = list(torch.split(flat, [x.numel() for x in adv]))
            mine = iter(adv)
            out.append([next(mine) if on else torch.zeros(0) for on in acted])
        return out

    def _critic_texts(self, critic: Critic, episode: Episode) -> list[list[str]]:
        """Texts per stage: one per node (V) or one per joint action (Q). A centralized critic reads the acting
        agents' prompts (and answers) at each stage, an agent's critic its agent's prompt at every node."""
        g = self.args.num_generations
        texts = []
        for turn in episode.turns:
            acting = turn.agents(self.num_agents)
            if self.args.critic_type == "q":
                combos = joint_indices(len(acting), g, "align")
                texts.append(
                    [
                        joint_action_text(
                            [nd.prompts[i] for i in acting],
                            [turn.samples[i].texts[m * g + c[p]] for p, i in enumerate(acting)],
                            acting,
                        )
                        for m, nd in enumerate(turn.nodes)
                        for c in combos
                    ]
                )
            elif critic.reads is None:
                texts.append([joint_state_text([nd.prompts[i] for i in acting], acting) for nd in turn.nodes])
            else:
                texts.append([nd.prompts[critic.reads] for nd in turn.nodes])
        return texts

    @torch.no_grad()
    def _values(self, episode: Episode) -> list[tuple[list[torch.Tensor], CriticBatch]]:
        """Per critic on this process: V(node) per turn (mean of Q over the node's joint actions for a Q critic) and
        the critic's batch. Under torchrun each copy of a critic values its shard of the rows (the rows it updates
        on) and the copies exchange their values."""
        encoded, mine = [], {}
        for critic in self.critics:
            texts = self._critic_texts(critic, episode)
            flat = [t for turn in texts for t in turn]
            ids, mask = encode_texts(critic.tokenizer, flat, self.args.max_prompt_length)
            shard, shards = self._critic_shard(critic)[:2]
            lo, hi = shard_bounds(len(flat), shards)[shard]
            chunk = self.args.forward_batch_size or max(hi - lo, 1)
            self._idle_passes(critic, -(-(hi - lo) // chunk), backward=False)
            values = self._forward_values(critic, ids[lo:hi], mask[lo:hi]).cpu() if hi > lo else torch.empty(0)
            mine[critic.index] = {shard: values}
            encoded.append((texts, ids, mask))
        if self.centralized or self.dist.placement.replicas > 1:  # the same on every rank
            for part in self.dist.all_gather(mine, "exchange critic values"):
                for index, shards in part.items():
                    if index in mine:
                        mine[index].update(shards)
        out = []
        for critic, (texts, ids, mask) in zip(self.critics, encoded):
            values = torch.cat([v for _, v in sorted(mine[critic.index].items())])
            per_turn = list(torch.split(values, [len(t) for t in texts]))
            if self.args.critic_type == "q":
                per_turn = [v.view(-1, self.args.num_generations).mean(dim=-1) for v in per_turn]
            out.append((per_turn, CriticBatch(ids=ids, mask=mask, old_values=values, targets=torch.empty(0))))
        return out

    def _idle_passes(self, critic: Critic, passes: int, backward: bool) -> None:
        """Under fsdp, the zero-weight one-token passes that bring this rank's count of ``critic`` forwards (and
        backwards) to the most any rank of its mesh runs (each is a collective there)."""
        for _ in range(self.dist.lockstep_critic_passes(critic.reads, passes) - passes):
            ids = torch.ones(1, 1, dtype=torch.long)
            if backward:
                (self._forward_values(critic, ids, ids).sum() * 0.0).backward()
            else:
                with torch.no_grad():
                    self._forward_values(critic, ids, ids)

    def _critic_shard(self, critic: Critic) -> tuple[int, int, Any, Any]:
        """(shard, shard count, gradient group, object group) of a critic's rows: see DistTeam.critic_shard."""
        return self.dist.critic_shard(critic.reads)

    def _forward_values(self, critic: Critic, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        chunk = self.args.forward_batch_size or ids.shape[0]
        device = critic.device or self.device
        outs = []
        with active_adapter(critic.model.backbone, critic.adapter):
            for lo in range(0, ids.shape[0], chunk):
                with self.autocast(device):
                    outs.append(critic.model(ids[lo : lo + chunk].to(device), mask[lo : lo + chunk].to(device)))
        return torch.cat(outs)

    # ------------------------------------------------------------------ saving
    def save_model(self, output_dir: str | None = None, gather_sharded: bool = True) -> list[str]:
        """The agents' folders (:meth:`MultiAgentTrainer.save_model`) and the critics', in the reference library's
        layout: IAC's critic i in ``agent_<i>/critic/``, MAAC's in ``critic/`` (a backbone folder, its tokenizer and
        ``value_head.pt``); a value head on an actor's backbone as ``agent_<i>/value_head.pt`` (MAAC's: ``critic/``
        naming ``agent_0``). :func:`comlrl.engine.critic.load_critic` reloads each. ``gather_sharded`` False (a
        checkpoint, which keeps the critics in critics.pt) writes no critic folders."""
        paths = super().save_model(output_dir, gather_sharded)
        if not gather_sharded:
            return paths
        root = Path(output_dir or self.args.output_dir)
        names = {a.index: a.name for a in self.agents}
        for critic in self.critics:
            owner = names.get(0 if critic.reads is None else critic.reads, f"agent_{critic.index}")
            own = not (critic.model.detach_backbone or critic.model.shared_backbone)  # else on the actor's backbone
            folder = root / ("critic" if self.centralized else owner + ("/critic" if own else ""))
            backbone = critic.model.backbone
            sharded = own and sharding.is_sharded(backbone) and not hasattr(backbone, "peft_config")
            full = sharding.full_state_dict(backbone, self.dist.owns_critic(critic.reads)) if sharded else None
            if not self.dist.owns_critic(critic.reads):
                continue  # another copy of this critic writes it
            if not own:
                save_value_head(critic.model, folder, None if folder.name == owner else f"../{owner}")
            elif sharded:
                sharding.save_consolidated(backbone, folder, full)
            else:
                with distributed.saving_on_this_rank(backbone):
                    backbone.save_pretrained(folder)
            if own:
                critic.tokenizer.save_pretrained(folder)
                save_value_head(critic.model, folder)
            paths.append(str(folder))
        return paths

    # ------------------------------------------------------------------ update
    def optimize(self, buffer: list) -> dict[str, float]:
        """Actor updates (the shared loop, in which a head trained with its actor takes its step), then one update
        per other critic over the buffered rollouts."""
        self._joint_losses: dict[int, float] = {}
        metrics = super().optimize(buffer)
        start = time.perf_counter()
        critic_metrics = {f"critic/{i}/value_loss": v for i, v in self._joint_losses.items()}
        for c, critic in enumerate(self.critics):
            if critic.actor_step_coef is not None:
                continue
            batches = [b[c] for b in self._critic_batches]
            critic_metrics[f"critic/{critic.index}/value_loss"] = self._update_critic(critic, batches)
        critic_metrics["time/critic_update"] = time.perf_counter() - start
        self._critic_batches = []
        return {**metrics, **self.dist.merge_metrics(critic_metrics)}

    def _value_backward(self, critic: Critic, batches: list[CriticBatch], scale: float = 1.0) -> float:
        """Backward of ``scale`` x the MSE (optionally clipped) between V and the targets over this process's rows
        (the idle passes of a sharded critic included); returns the loss before ``scale``."""
        if not critic.model.training:
            critic.model.train()
        total = sum(b.ids.shape[0] for b in batches)  # the whole step's rows: each shard's loss keeps this normalizer
        shard, shards = self._critic_shard(critic)[:2]
        chunk = self.args.forward_batch_size or max(total, 1)
        loss_sum = 0.0
        bounds = [shard_bounds(b.ids.shape[0], shards)[shard] for b in batches]
        self._idle_passes(critic, sum(-(-(end - first) // chunk) for first, end in bounds), backward=True)
        for b in batches:
            first, end = shard_bounds(b.ids.shape[0], shards)[shard]  # this copy's rows (all of them in one process)
            for lo in range(first, end, chunk):
                sl = slice(lo, min(lo + chunk, end))
                v = self._forward_values(critic, b.ids[sl], b.mask[sl])
                old, tgt = b.old_values[sl].to(v.device).unsqueeze(-1), b.targets[sl].to(v.device)
                loss = value_loss(v.unsqueeze(-1), old, tgt, self.args.value_clip) * (v.shape[0] / total)
                (loss * scale).backward()
                loss_sum += float(loss.detach())
        return loss_sum

    def _update_critic(self, critic: Critic, batches: list[CriticBatch]) -> float:
        """One optimizer step on the MSE (optionally clipped) between V and the targets; returns the mean loss."""
        critic.optimizer.zero_grad(set_to_none=True)
        group, object_group = self._critic_shard(critic)[2:]
        loss_sum = self._value_backward(critic, batches)
        params = critic.model.trainable_parameters()
        whole = [p for p in params if not sharding.is_shard(p)]  # sharded ones were reduced (averaged) by FSDP
        if len(whole) < len(params):
            sharding.scale_gradients(
                [p for p in params if sharding.is_shard(p)], self.dist.critic_mesh(critic.reads).size()
            )
        if group is not None:  # the sum of the shards' gradients is the full-batch gradient
            loss_sum = self.dist.sum_gradients(
                whole, {"loss": loss_sum}, group=group, object_group=object_group, what=f"critic {critic.index}"
            )["loss"]
        self._step_critic(critic, params)
        return loss_sum

    def _step_critic(self, critic: Critic, params: list) -> None:
        """Clip (``critic_max_grad_norm``) and apply the critic's gradients, then its schedule."""
        optimizer_step(
            optimizer=critic.optimizer,
            params=params,
            max_grad_norm=self.args.critic_max_grad_norm,
            scheduler=critic.scheduler,
        )


class IACTrainer(ActorCriticTrainer):
    """Independent actor-critic: agent i's critic reads agent i's prompt only."""

    config_class = accepted_config = ours.IACConfig
    centralized = False


class MAACTrainer(ActorCriticTrainer):
    """Multi-agent actor-critic: one centralized critic reads every agent's prompt (V) or prompts + joint action (Q)."""

    config_class = accepted_config = ours.MAACConfig
    centralized = True


ActorCriticTrainerBase = ActorCriticTrainer  # the reference library's name of the shared actor-critic machinery
