"""The one training loop of comlrl. A step reads: rollout -> rewards -> advantages -> loss -> optimizer step.

Here: the loop, its rollouts, evaluation and saving; the team is built by :func:`comlrl.trainers.build.build_team`,
the update (loss and optimizer step) is the trainer's ``update`` component (:class:`comlrl.trainers.update.PolicyUpdate`),
the metrics :mod:`comlrl.trainers.metrics`.
MAGRPO, MAREINFORCE, MARLOO and MAREMAX are this loop with a different baseline (``advantage_mode``).
"""

from __future__ import annotations

import copy
import functools
import inspect
import json
import math
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import torch
from tqdm.auto import tqdm

from ..compat.keywords import callback_metrics, compat_hooks, eval_extras, eval_paths
from ..configs.fields import own_field
from ..configs.policy import MAGRPOConfig
from ..engine.process import release_freed_memory, set_seed
from ..errors import ConfigError
from ..parallel import checkpoint, distributed, sharding
from ..rollout.agent import Agent, apply_formatter
from ..rollout.episode import (
    Episode,
    episode_advantages,
    formatted_transition,
    generate_team,
    root_nodes,
    run_episode,
)
from ..rollout.generation import VLLM, check_engine_available
from ..rollout.protocol import AUTO, GenerationSettings, VLLMOptions
from ..rollout.sampling import derive_seed
from ..tracking import Tracker
from .build import Team, build_formatters, build_team, check_batch_size, check_inputs, team_sources, team_topology
from .contributions import add_contributions, check_contributions, contribution_metrics
from .metrics import episode_metrics, eval_samples, mean_metrics, merge_evaluation
from .update import FrozenLogprobs, PolicyUpdate  # noqa: F401  (FrozenLogprobs re-exported)


class MultiAgentTrainer:
    """Trains a team of causal LMs on a shared team reward with a critic-free multi-agent policy gradient.

    Args:
        model / agent_model: one model (hub id, local path, .gguf, 'embedded', or loaded) copied into every agent.
        agents: one model source per agent (heterogeneous teams); excludes ``model``.
        num_agents: team size when ``model`` is given (default 2, or len(formatters)).
        tokenizer: one tokenizer for all agents or one per agent (default: loaded with each model).
        train_dataset / eval_dataset: a ``datasets.Dataset`` or a list of dict rows.
        reward_func: ``(*agent_completions, **extras) -> list[float]``, see :mod:`comlrl.engine.rewards`.
        reward_processor: float -> float applied to each team reward.
        formatters: one callable per agent (or one shared), dataset row -> prompt str.
        args: the trainer's config dataclass.
        external_transition: next prompts per agent for multi-turn training (contract:
            :func:`comlrl.rollout.transition.transition`).
        topology_prompt: ``(prompt, visible, agent, turn, row) -> str``, an acting agent's prompt from its base prompt
            and the answers it sees under ``args.topology`` (default :func:`comlrl.rollout.topology.compose_prompt`).
        eval_reward_func: reward for evaluate() (default: reward_func).
        **compat_keywords: the reference library's trainer keywords (model_config, wandb_config, eval_logger,
            eval_aggregator, metrics_callback, dataset_type), see :mod:`comlrl.compat.keywords`.

    Construction checks the arguments, builds the team (:func:`comlrl.trainers.build.build_team`) and holds the update
    component ``update`` (an ``update_class``: :class:`comlrl.trainers.update.PolicyUpdate` here).
    """

    config_class = MAGRPOConfig
    accepted_config: type = (
        MAGRPOConfig  # args must be an instance of it (config_class: the default and the name in errors)
    )
    fixed_advantage_mode: str | None = None
    supports_distributed = True  # torchrun placement / data parallelism (comlrl.parallel)
    supports_agent_devices = True  # args.agent_devices: each agent on its own device in one process
    update_class: type = PolicyUpdate  # the update component the trainer holds as ``update``

    def __init__(
        self,
        model: Any = None,
        num_agents: int | None = None,
        tokenizer: Any = None,
        train_dataset: Any = None,
        reward_func: Callable | None = None,
        formatters: Any = None,
        args: MAGRPOConfig | None = None,
        *,
        agent_model: Any = None,
        agents: Sequence | None = None,
        eval_dataset: Any = None,
        reward_processor: Callable | None = None,
        external_transition: Callable | None = None,
        eval_reward_func: Callable | None = None,
        peft_config: Any = None,
        topology_prompt: Callable | None = None,
        **compat_keywords: Any,
    ) -> None:
        # a copy: resolving defaults (bf16) and per-rank settings never changes the caller's config
        self.args = copy.deepcopy(args) if args is not None else self.config_class()
        self._check_args()
        ours = [
            p for c in type(self).__mro__ if "__init__" in c.__dict__ for p in inspect.signature(c.__init__).parameters
        ]
        self.hooks = compat_hooks(type(self).__name__, self.args, compat_keywords, ours)
        check_engine_available(self.rollout_engine)  # before any model loads: use_vllm without vLLM fails here
        model, num_agents = check_inputs(
            self.args,
            model=model,
            agent_model=agent_model,
            num_agents=num_agents,
            reward_func=reward_func,
            reward_required=self.needs_reward_func(),
            external_transition=external_transition,
        )
        set_seed(self.args.seed)
        sources = team_sources(model, agents, num_agents, formatters)
        self.num_agents = len(sources)
        reward_func, eval_reward_func = self.hooks.reward(reward_func), self.hooks.reward(eval_reward_func)
        self.reward_func, self.reward_processor = reward_func, reward_processor
        self.eval_reward_func = eval_reward_func or reward_func
        self.train_dataset, self.eval_dataset = train_dataset, eval_dataset
        # every agent's formatter, also those on other ranks: prompts are built for the whole team
        self.formatters = build_formatters(formatters, self.num_agents)
        self.external_transition = external_transition
        if external_transition is not None and self.args.format_transition_prompts:
            self.external_transition = formatted_transition(external_transition, self.formatters)
        self.topology, self.topology_prompt = team_topology(self.args, self.num_agents, self.hooks), topology_prompt
        self._check_dataset(train_dataset, "train_dataset")  # before any model loads
        if train_dataset is not None:
            check_batch_size(len(train_dataset), self.rows_per_rollout)
        self.total_steps = math.ceil(self._epoch_rollouts() / self.args.gradient_accumulation_steps)  # optimizer steps
        self._team_sources, self._tokenizer_source = sources, tokenizer  # every agent's, also those on other ranks
        team = build_team(
            self.args,
            sources=sources,
            formatters=self.formatters,
            tokenizer=tokenizer,
            peft_config=peft_config,
            updates=self.total_steps * own_field(self.args, "num_iterations", 1),  # optimizer updates of the run
            ref_model=self.needs_ref_model(),
            trainer=type(self).__name__,
            distributed_ok=self.supports_distributed,
            agent_devices_ok=self.supports_agent_devices,
            special_tokens=self.hooks.special_tokens,
            prepare_models=self.prepare_models,
        )
        self.agents, self.dist, self.device = team.agents, team.dist, team.device
        self.agent_devices, self.output_dir_named = team.agent_devices, team.output_dir_named
        self.update = self.update_class(self)
        # step: optimizer steps taken (TRL's global step); rollouts: rollout batches sampled
        self.state = {"step": 0, "rollouts": 0, "epoch": 0, "batch_in_epoch": 0}
        self.history: list[dict] = []
        self.tracker: Tracker | None = None  # metrics.jsonl + report_to sinks, opened by train()
        self._owns_tracker = False
        if not self.dist.is_main:
            self.tracker = distributed.NullTracker()  # metrics are written once, by rank 0
            self.args.disable_tqdm = True  # one progress bar per job (this trainer's copy of the args)

    # ------------------------------------------------------------------ setup helpers
    def prepare_models(self, team: Team, models: list, peft_config: Any) -> None:
        """Hook: called with the placed team (no agents yet) and its loaded models before LoRA wrapping (critics copy
        their bases here)."""

    def needs_reward_func(self) -> bool:
        """Whether the trainer scores rollouts, so that ``reward_func`` is required."""
        return True

    def needs_ref_model(self) -> bool:
        """Whether each agent needs a frozen reference model for the KL term (a copy of its initial model unless it is
        a LoRA adapter)."""
        return self.args.beta > 0

    @property
    def rows_per_rollout(self) -> int:
        """Dataset rows one training rollout takes."""
        return self.args.per_device_train_batch_size

    def _check_args(self) -> None:
        if not isinstance(self.args, self.accepted_config):
            raise ConfigError(
                f"{type(self).__name__} needs args={self.config_class.__name__}(...), got {type(self.args).__name__}."
            )
        fixed = self.fixed_advantage_mode
        if fixed is not None and own_field(self.args, "advantage_mode", fixed) != fixed:
            raise ConfigError(
                f"{type(self).__name__} uses advantage_mode='{fixed}' but args.advantage_mode='{self.args.advantage_mode}'; "
                f"pass {self.config_class.__name__}(...) or use MAGRPOTrainer with advantage_mode set."
            )

    def _check_dataset(self, dataset: Any, name: str) -> None:
        if dataset is None:
            return
        if len(dataset) == 0:
            raise ConfigError(f"{name} is empty.")
        row = dataset[0]
        for i, fmt in enumerate(self.formatters):
            apply_formatter(fmt, row, agent=i, row_id=0, columns=getattr(dataset, "column_names", None))

    @property
    def total_rollouts(self) -> int:
        """Rollout batches of the run: ``total_steps`` optimizer steps of ``gradient_accumulation_steps`` rollouts
        each, or with epochs (``max_steps`` <= 0) the batches of ``num_train_epochs`` passes over the data, the last
        optimizer step taking what is left."""
        if self.args.max_steps > 0:
            return self.total_steps * self.args.gradient_accumulation_steps
        return self._epoch_rollouts()

    def _epoch_rollouts(self) -> int:
        """Rollout batches of ``max_steps`` optimizer steps, or of ``num_train_epochs`` passes over the data."""
        if self.args.max_steps > 0:
            return self.args.max_steps * self.args.gradient_accumulation_steps
        if self.train_dataset is None:
            return 0
        per_epoch = math.ceil(len(self.train_dataset) / self.rows_per_rollout)
        return int(math.ceil(per_epoch * self.args.num_train_epochs))

    @property
    def rollout_engine(self) -> str:
        """Name of the engine rollouts sample with (:func:`comlrl.rollout.generation.select_engine`): ``"vllm"`` with
        ``use_vllm``, else ``"auto"`` (comlrl's decode loop, or transformers' ``generate`` when it cannot run the
        model or ``fast_generation`` is off)."""
        return VLLM if self.args.use_vllm else AUTO

    def generation_settings(self, train: bool = True) -> GenerationSettings:
        """Sampling settings of training rollouts (``temperature``, rollout log-probs when corrected for) or of
        evaluation (greedy unless ``eval_do_sample``, at ``eval_temperature``)."""
        a = self.args
        return GenerationSettings(
            max_new_tokens=a.max_new_tokens,
            do_sample=True if train else a.eval_do_sample,
            temperature=a.temperature if train else a.eval_temperature,
            top_p=a.top_p,
            top_k=a.top_k,
            max_prompt_length=a.max_prompt_length,
            fast=a.fast_generation,
            concurrent=a.concurrent_rollout,
            logprobs=self.corrects_rollout if train else False,
            repetition_penalty=a.repetition_penalty,
            engine=self.rollout_engine,
            vllm=self.vllm_options if a.use_vllm else None,
        )

    @property
    def vllm_options(self) -> VLLMOptions:
        """How this run's vLLM engines are set up (the ``vllm_*`` fields)."""
        a = self.args
        return VLLMOptions(
            mode=a.vllm_mode,
            gpu_memory_utilization=a.vllm_gpu_memory_utilization,
            tensor_parallel_size=a.vllm_tensor_parallel_size,
            enable_sleep_mode=a.vllm_enable_sleep_mode,
            max_model_length=a.vllm_max_model_length,
            server_host=a.vllm_server_host,
            server_port=a.vllm_server_port,
            server_timeout=a.vllm_server_timeout,
            seed=a.seed,
            server_adapter_dir=a.vllm_server_adapter_dir,
        )

    @property
    def rollout_is_cap(self) -> float:
        """Upper bound of the per-token importance weight: ``vllm_importance_sampling_cap`` with vLLM rollouts,
        else ``rollout_is_cap``."""
        return self.args.vllm_importance_sampling_cap if self.args.use_vllm else self.args.rollout_is_cap

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        return torch.bfloat16 if self.args.bf16 else None

    def autocast(self, device: torch.device | None = None) -> torch.autocast:
        """The training forward's autocast context on ``device`` (default the trainer's): bf16 when ``args.bf16``,
        else disabled."""
        device = device or self.device
        return torch.autocast(device.type, dtype=torch.bfloat16, enabled=bool(self.args.bf16))

    @property
    def rollout_dtype(self) -> torch.dtype | None:
        """Compute dtype of generation: ``args.rollout_dtype`` when set, else the training forward's."""
        name = self.args.rollout_dtype
        return getattr(torch, name) if name else self.autocast_dtype

    @property
    def corrects_rollout(self) -> bool:
        """Whether the loss reweights tokens by p_train / p_rollout: with vLLM rollouts when
        ``vllm_importance_sampling_correction`` is on (another engine's kernels), else (``rollout_correction``) only
        when the rollout computes in another dtype than the training forward (None: the model's own)."""
        if self.args.use_vllm:
            return self.args.vllm_importance_sampling_correction
        roll, train = self.rollout_dtype, self.autocast_dtype
        own = {next(a.model.parameters()).dtype for a in self.agents}
        return self.args.rollout_correction is not None and any((roll or d) != (train or d) for d in own)

    # ------------------------------------------------------------------ data
    def _batches(self) -> Iterator[tuple[list[dict], list[int]]]:
        """Rows of each step, resuming from ``self.state`` (epoch, batch_in_epoch); reshuffled per epoch (seeded)."""
        n, bs = len(self.train_dataset), self.rows_per_rollout
        while True:
            epoch = self.state["epoch"]
            if self.args.shuffle:
                order = torch.randperm(n, generator=torch.Generator().manual_seed(self.args.seed + epoch)).tolist()
            else:
                order = list(range(n))
            starts = list(range(0, n, bs))
            for b in range(self.state["batch_in_epoch"], len(starts)):
                ids = order[starts[b] : starts[b] + bs]
                self.state["batch_in_epoch"] = b + 1
                yield [self.train_dataset[i] for i in ids], ids
            self.state["epoch"] += 1
            self.state["batch_in_epoch"] = 0

    # ------------------------------------------------------------------ the loop
    def train(self, resume_from_checkpoint: str | bool | None = None) -> dict[str, Any]:
        """Train for ``max_steps`` optimizer steps (or the epochs given).

        Returns ``{"metrics": the last step's metrics, "history": every step's metrics}``.
        ``resume_from_checkpoint``: a ``checkpoint-<step>`` directory to continue from, or True for the latest
        checkpoint in ``output_dir`` (see :mod:`comlrl.parallel.checkpoint`). The metric sinks the run opened (W&B,
        TensorBoard, metrics.jsonl) are closed when it returns.
        """
        if self.train_dataset is None:
            raise ConfigError("train() needs train_dataset=.")
        if resume_from_checkpoint is True:
            resume_from_checkpoint = checkpoint.latest_checkpoint(self.args.output_dir)
            if resume_from_checkpoint is None:
                raise ConfigError(
                    f"train(resume_from_checkpoint=True): no checkpoint in output_dir '{self.args.output_dir}'."
                    + ("" if self.output_dir_named else " Set output_dir to the folder of the run to continue.")
                )
        resuming = resume_from_checkpoint not in (None, False)
        if resuming:
            self.load_checkpoint(str(resume_from_checkpoint))
        if self.tracker is None:  # before training: a directory holding another run's metrics is refused here
            a = self.args
            self.tracker = Tracker(
                a.output_dir,
                a.report_to,
                config=a.to_dict(),
                trainer=type(self).__name__,
                overwrite=a.overwrite_output_dir,
                resume=resuming or self.state["step"] > 0,
                wandb_init=self.hooks.wandb_init,
            )
            self._owns_tracker = True
        if self.state["step"] == 0:
            set_seed(self.args.seed)
        batches = self._batches()
        bar = tqdm(total=self.total_steps, initial=self.state["step"], desc="train", disable=self.args.disable_tqdm)
        metrics: dict[str, Any] = {}
        while self.state["step"] < self.total_steps:
            metrics = self.training_step(batches)
            self.state["step"] += 1
            metrics["step"] = self.state["step"]
            self.history.append(metrics)
            self.on_step_end(metrics)
            bar.update(1)
            if "reward/mean" in metrics:
                bar.set_postfix(reward=f"{metrics['reward/mean']:.3f}")
        bar.close()
        if self._owns_tracker:  # a tracker set from outside (the CLI's) is its owner's to close
            self.tracker.close()
        return {"metrics": metrics, "history": self.history}

    def on_step_end(self, metrics: dict[str, Any]) -> None:
        """Hook after each step: evaluate, log metrics (metrics.jsonl + report_to sinks), checkpoint."""
        step, a = metrics["step"], self.args  # train() has opened self.tracker
        if a.eval_steps and self.eval_dataset is not None and step % a.eval_steps == 0:
            metrics.update(self.evaluate())
            self.tracker.log_samples(self.last_eval_samples, step)
        if a.logging_steps and step % a.logging_steps == 0:
            self.tracker.log(metrics, step)
        if a.save_steps and step % a.save_steps == 0:
            self.save_checkpoint()

    def save_checkpoint(self, output_dir: str | None = None) -> Path:
        """Write ``checkpoint-<step>`` atomically (weights, optimizer, scheduler, RNG, data position, history)."""
        return self.dist.save_checkpoint(self, output_dir)  # under torchrun rank 0 renames after every rank wrote

    def load_checkpoint(self, path: str) -> None:
        """Continue from a checkpoint written by :meth:`save_checkpoint` (later metric lines are dropped)."""
        self.dist.load_checkpoint(self, path)

    def training_step(self, batches: Iterator[tuple[list[dict], list[int]]]) -> dict[str, Any]:
        """One optimizer step: ``gradient_accumulation_steps`` rollouts of batches from ``batches`` (fewer when the
        run's last rollouts run out), their advantages, then the update. Rollout metrics are averaged over the
        rollouts (timings summed)."""
        a = self.args
        buffer, per_rollout = [], []
        while len(buffer) < a.gradient_accumulation_steps and self.state["rollouts"] < self.total_rollouts:
            rows, ids = next(batches)
            episode = self.rollout(
                rows,
                ids,
                settings=self.generation_settings(train=True),
                num_generations=a.num_generations,
                reward_func=self.reward_func,
                seed=derive_seed(a.seed, "train", self.state["rollouts"]),
            )
            self.state["rollouts"] += 1
            per_rollout.append(self.episode_metrics(episode))
            buffer.append((episode, self.compute_advantages(episode, per_rollout[-1])))
        metrics = mean_metrics(per_rollout)
        # the rollout's freed weight copies and KV cache (~0.3 GB for 2 fp32 agents) would stay resident under the
        # loss pass's peak
        if self.args.release_memory:
            release_freed_memory()
        start = time.perf_counter()
        metrics.update(self.optimize(buffer))
        metrics["time/update"] = time.perf_counter() - start
        return metrics

    def optimize(self, buffer: list[tuple[Episode, list[list[torch.Tensor]]]]) -> dict[str, float]:
        """The step's update over its buffered rollouts and their advantages: ``self.update``'s."""
        return self.update.optimize(buffer)

    def compute_advantages(self, episode: Episode, metrics: dict[str, Any]) -> list[list[torch.Tensor]]:
        """advantages[agent][turn] for one rollout: the baseline of ``advantage_mode`` over sibling returns, grouped by
        ``advantage_grouping``."""
        a = self.args
        return episode_advantages(
            episode,
            self.num_agents,
            a.num_generations,
            joint_mode=a.joint_mode,
            mode=a.advantage_mode,
            scale=a.scale_rewards,
            discount=a.discount,
            reward_clip=a.reward_clip,
            credit=a.cross_credit,
            grouping=a.advantage_grouping,
        )

    def rollout(
        self,
        rows: list[dict],
        row_ids: list[int],
        *,
        settings: GenerationSettings,
        num_generations: int,
        reward_func: Callable,
        dataset: Any = None,
        seed: int | None = None,
        agents: list[Agent] | None = None,
    ) -> Episode:
        """Sample the team's answers for ``rows`` and score them (no gradients); ``agents``: another team to sample
        from (default: this trainer's agents).

        ``seed``: sampling key of the episode (default: from args.seed, the step and the row ids); each row samples
        from its own stream under it, so a run samples the same in one process or under torchrun.
        """
        columns = getattr(dataset if dataset is not None else self.train_dataset, "column_names", None)
        nodes = root_nodes(self.formatters, rows, row_ids, columns)
        if seed is None:
            seed = derive_seed(self.args.seed, "rollout", self.state["step"], *row_ids)
        d = self.dist
        return run_episode(
            agents or self.agents,
            nodes,
            reward_func=reward_func,
            num_generations=num_generations,
            settings=settings,
            joint_mode=own_field(self.args, "joint_mode", "align"),
            num_turns=self.args.num_turns,
            external_transition=self.external_transition,
            termination_threshold=self.args.termination_threshold,
            termination_scope=self.args.termination_scope,
            rollout_expansion=own_field(self.args, "rollout_expansion", "tree"),
            expansion_top_k=own_field(self.args, "expansion_top_k", 2),
            reward_processor=self.reward_processor,
            autocast_dtype=self.rollout_dtype,
            seed=seed,
            generate_fn=functools.partial(d.generate_team, generate_team=generate_team),
            run_once=d.run_once,
            topology=own_field(self.args, "topology", "parallel"),
            topology_prompt=getattr(self, "topology_prompt", None),  # a stand-in trainer without one: the default
        )

    # ------------------------------------------------------------------ metrics
    def episode_metrics(self, episode: Episode, prefix: str = "") -> dict[str, float]:
        """Reward statistics per turn and level, completion lengths, and timings of one rollout
        (:func:`comlrl.trainers.metrics.episode_metrics`), and what a ``metrics_callback`` adds."""
        return {
            **episode_metrics(episode, self.num_agents, prefix),
            **callback_metrics(self.hooks, episode, self.num_agents, prefix),
        }

    # ------------------------------------------------------------------ evaluation and saving
    @torch.no_grad()
    def evaluate(
        self,
        eval_dataset: Any = None,
        *,
        do_sample: bool | None = None,
        num_generations: int | None = None,
        max_rows: int | None = None,
        batch_size: int | None = None,
        dataset: Any = None,
        contributions: bool | None = None,
    ) -> dict[str, float]:
        """Team reward on ``eval_dataset`` (default: the trainer's eval_dataset), greedy unless eval_do_sample /
        ``do_sample`` says so, ``batch_size`` rows per rollout (default ``per_device_eval_batch_size``).
        ``contributions`` (default ``eval_contributions``): also each agent's contribution to the team reward
        (:mod:`comlrl.trainers.contributions`). ``dataset``: the former name of ``eval_dataset``."""
        if eval_dataset is not None and dataset is not None and eval_dataset is not dataset:
            raise ConfigError("evaluate(): eval_dataset= and dataset= are the same argument; pass only one.")
        dataset = next((d for d in (eval_dataset, dataset, self.eval_dataset) if d is not None), None)
        if dataset is None:
            raise ConfigError("evaluate() needs eval_dataset= (here or at construction).")
        if self.eval_reward_func is None:
            raise ConfigError("evaluate() scores the team's answers: pass eval_reward_func= (or reward_func=).")
        batch_size = batch_size or self.args.per_device_eval_batch_size
        settings = self.generation_settings(train=False)
        if do_sample is not None:
            settings.do_sample = do_sample
        g = num_generations or self.args.eval_num_generations
        limit = min(len(dataset), max_rows or self.args.eval_max_rows or len(dataset))
        if contributions is None:
            contributions = own_field(self.args, "eval_contributions", False)
        if contributions:
            if not self.topology.is_parallel:
                raise ConfigError(
                    f"evaluate(contributions=True): contributions replace one agent's answer of a turn that every "
                    f"agent plays at once, and topology={self.args.topology!r} shows answers to other agents."
                )
            check_contributions(self)
        episodes, samples_out = [], []
        bar = tqdm(range(0, limit, batch_size), desc="eval", disable=self.args.disable_tqdm, leave=False)
        for lo in bar:
            ids = list(range(lo, min(lo + batch_size, limit)))
            seed = derive_seed(self.args.seed, "eval", self.state["step"], lo)
            ep = self.rollout(
                [dataset[i] for i in ids],
                ids,
                settings=settings,
                num_generations=g,
                reward_func=self.eval_reward_func,
                dataset=dataset,
                seed=seed,
            )
            episodes.append(ep)
            bar.set_postfix(
                reward=f"{float(torch.cat([e.scored[0].rewards.reshape(-1) for e in episodes]).mean()):.3f}"
            )
            samples_out.extend(eval_samples(ep, self.num_agents, g))
            if contributions:
                add_contributions(
                    self, ep, settings=settings, g=g, seed=seed, samples=samples_out[-len(ep.turns[0].nodes) :]
                )
        self.last_eval_samples = samples_out
        self.last_eval_episodes = episodes  # every sample, reward and level of the evaluation (comlrl.compare)
        extras = {}
        if self.topology.is_parallel:  # the reference's eval_logger reads turns every agent plays (see team_topology)
            extras = eval_extras(self.hooks, *eval_paths(episodes, self.num_agents), num_turns=self.args.num_turns)
        extras = {**self.hooks.turn_metrics(episodes, self.args.num_turns), **extras}
        if contributions:
            extras.update(contribution_metrics([s["contribution"] for s in samples_out]))
        return {**self._merge_evaluation(episodes), **extras}

    def _merge_evaluation(self, episodes: list[Episode]) -> dict[str, float]:
        return merge_evaluation(episodes, [self.episode_metrics(ep, prefix="eval/") for ep in episodes])

    def save_model(self, output_dir: str | None = None, gather_sharded: bool = True) -> list[str]:
        """Save one ``from_pretrained``-loadable folder per agent (adapter folders under LoRA); training can continue.

        Under torchrun every rank calls it and writes the agents it owns (a replicated agent by its replica 0, a
        sharded one by its first rank after gathering it); rank 0 also writes the team config. ``gather_sharded``
        False: a sharded agent's folder gets its config and tokenizer only (checkpoints keep its weights as shards).
        Returns the folders this process wrote.
        """
        root = Path(output_dir or self.args.output_dir)
        paths = []
        for a in self.agents:
            sharded = self.dist.sharded(a)
            full = sharding.full_state_dict(a.model, self.dist.owns(a)) if sharded and gather_sharded else None
            if not self.dist.owns(a):
                continue  # another replica of this agent writes it
            path = root / a.name
            if a.adapter is not None:  # PEFT writes a non-default adapter to root/<adapter name> == path
                a.model.save_pretrained(root, selected_adapters=[a.adapter])
            elif sharded:
                sharding.save_consolidated(a.model, path, full)
            else:
                with distributed.saving_on_this_rank(a.model):  # transformers would write on rank 0 only
                    a.model.save_pretrained(path)
            a.tokenizer.save_pretrained(path)
            paths.append(str(path))
        if self.dist.is_main:
            root.mkdir(parents=True, exist_ok=True)
            (root / "comlrl_config.json").write_text(
                json.dumps(
                    {"trainer": type(self).__name__, "num_agents": self.num_agents, "args": self.args.to_dict()},
                    indent=2,
                    default=str,
                )
            )
        return paths
