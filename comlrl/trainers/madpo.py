"""Multi-agent DPO on the one loop: each optimizer step trains the team on preference pairs of joint answers.

Online (``preferences='online'``), training runs in rounds of collect -> pair -> train: a round samples
``num_generations`` joint candidates per prompt for ``prompts_per_round`` rows in one batched rollout (and as many
from the comparator team), scores them with the team reward, keeps pairs by :func:`select_pairs`, stores them as a
JSONL shard in ``<output_dir>/pairs/`` and takes ``steps_per_round`` optimizer steps over them and the replayed
pairs of earlier rounds. Offline (``preferences='dataset'``), the pairs are a dataset's chosen / rejected columns.

A text comparator (``comparator='api'``, an HTTP endpoint, :mod:`comlrl.engine.api_client`; or ``'model'`` with
``comparator_generation='centralized'``, one completion holding every agent's answer in role tags) is turned into a
rollout's samples (:func:`text_samples`) and scored by the same team reward; its answers are re-tokenized with each
agent's tokenizer, as comparator_model's are. A centralized completion that does not parse is dropped from pairing.

The loss (:func:`comlrl.algorithms.preference.team_dpo_loss`) reads each agent's log-probs of its part of both
joint answers, over every completion token up to and including the stop token (a truncated answer has none), at
temperature 1: summed for DPO, averaged per token for IPO (:func:`~comlrl.algorithms.preference.sequence_logps`,
TRL's reductions). The reference log-probs are computed without dropout (eval mode when dropout is on) and
:meth:`MADPOTrainer.evaluate_pairs` in eval mode.
"""

from __future__ import annotations

import contextlib
import math
import time
from pathlib import Path
from typing import Any, Iterator

import torch

from ..algorithms.preference import (
    CentralizedComparatorAdapter,
    TaggedCentralizedComparatorAdapter,
    agent_margins,
    replay_sample,
    replay_weights,
    team_dpo_loss,
)
from ..configs.preference import MADPOConfig
from ..engine.api_client import Answer, Sampling
from ..engine.models import load_model, load_tokenizer
from ..errors import CentralizedComparatorParseError, ConfigError
from ..rollout.agent import Agent
from ..rollout.episode import Episode, Node, generate_team, root_nodes, run_episode
from ..rollout.protocol import GenerationSettings
from ..rollout.rollout import format_prompt
from ..rollout.sampling import derive_seed
from .base import MultiAgentTrainer
from .comparator import (
    comparator_client,
    drop_snapshots,
    save_snapshot,
    snapshot_path,
    split_roles,
    swapped_parameters,
)
from .dpo_update import DPOUpdate, dpo_loss_options
from .pairs import (
    PAIRS_DIR,
    ROUNDS_FILE,
    add_pair_sums,
    answer_ids,
    candidate_pairs,
    dataset_pairs,
    eval_mode,
    iteration_path,
    pair_metrics,
    read_iteration,
    read_jsonl,
    shard_path,
    snapshot_rounds,
    text_samples,
    write_iteration,
    write_jsonl,
)

COMPARATOR = 1  # the comparator's side of a candidate (the team's is 0)
TEXT_COMPARATORS = ("model", "api")  # comparators whose answers are re-tokenized with each agent's tokenizer


class MADPOTrainer(MultiAgentTrainer):
    """Multi-agent DPO: the team learns the team's preference between joint answers, each agent its own part.

    Arguments as :class:`~comlrl.trainers.base.MultiAgentTrainer`. ``reward_func`` scores the online candidates
    (not needed with ``preferences='dataset'``, where ``train_dataset`` rows carry the chosen / rejected answers,
    one per agent). evaluate() reports the team reward of its answers (greedy unless eval_do_sample), as for every
    trainer.
    ``centralized_comparator_adapter`` (comparator_generation='centralized'): builds the comparator's one prompt
    and splits its completions (:class:`~comlrl.algorithms.preference.CentralizedComparatorAdapter`; default
    :class:`~comlrl.algorithms.preference.TaggedCentralizedComparatorAdapter`, the ``<agent_i>`` tags).
    Runs as one process (torchrun is not supported yet).
    """

    config_class = MADPOConfig
    accepted_config = MADPOConfig
    supports_distributed = False
    supports_agent_devices = False  # its pair batches and comparator live on the trainer device
    update_class = DPOUpdate

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._pairs_by_round: dict[int, list[dict]] = {}  # online: round -> its pairs
        self._round_metrics: dict[str, float] = {}
        self._pool: list[tuple[dict, float]] = []  # this round's (pair, loss weight), in training order
        self._pool_round: int | None = None
        self._snapshots: dict[int, list[list[torch.Tensor]]] = {}  # round -> each agent's parameters at its start
        adapter: CentralizedComparatorAdapter | None = kwargs.pop("centralized_comparator_adapter", None)
        self.comparator_adapter = adapter or TaggedCentralizedComparatorAdapter()
        self._unparsed = ""  # the last centralized completion that did not parse (for the error message)
        super().__init__(*args, **kwargs)
        self._api = comparator_client(self.args) if self.args.comparator == "api" else None
        if self.args.num_turns > 1:
            raise ConfigError("MADPOTrainer trains single-turn pairs; num_turns must be 1.")
        if self.online and self.args.max_steps > 0:
            raise ConfigError(
                "MADPOConfig.max_steps: online training runs num_rounds x steps_per_round optimizer steps; set those "
                "instead (max_steps applies to preferences='dataset')."
            )
        self._offline = self._dataset_pairs(self.train_dataset) if not self.online and self.train_dataset else []

    @property
    def online(self) -> bool:
        return self.args.preferences == "online"

    def needs_reward_func(self) -> bool:
        return self.args.preferences == "online"

    def needs_ref_model(self) -> bool:
        return not self.args.reference_free

    @property
    def rows_per_rollout(self) -> int:
        return self.prompts_per_round if self.online else self.args.per_device_train_batch_size

    @property
    def prompts_per_round(self) -> int:
        """Rows one round collects: ``prompts_per_round``, None meaning every row of train_dataset."""
        n = self.args.prompts_per_round
        return n if n is not None else len(self.train_dataset) if self.train_dataset is not None else 1

    @property
    def steps_per_round(self) -> int:
        """Optimizer steps of a round: ``steps_per_round``, or with None num_train_epochs passes over the round's
        pair slots (at most pairs_per_prompt per prompt; every pair across team and comparator, the aligned ones, or
        every pair within the team)."""
        a = self.args
        if a.steps_per_round is not None:
            return a.steps_per_round
        k, kc = a.num_generations, self.comparator_generations
        if not a.has_comparator_side:
            most = k * (k - 1) // 2
        elif a.comparator_pairing == "aligned":
            most = min(k, kc)
        else:
            most = k * kc
        pairs = min(a.pairs_per_prompt, most) if a.pairs_per_prompt is not None else most
        per_step = a.per_device_train_batch_size * a.gradient_accumulation_steps
        return max(1, math.ceil(a.num_train_epochs * self.prompts_per_round * pairs / per_step))

    @property
    def comparator_generations(self) -> int:
        """Candidates per prompt of the comparator side: ``comparator_num_generations``, or as many as the team's."""
        return self.args.comparator_num_generations or self.args.num_generations

    def _epoch_rollouts(self) -> int:
        """Micro-batches of the run: ``steps_per_round`` optimizer steps per round online, else the epochs (or
        ``max_steps``) over the dataset's pairs."""
        a = self.args
        if self.online:
            return a.num_rounds * self.steps_per_round * a.gradient_accumulation_steps
        return super()._epoch_rollouts()

    # ------------------------------------------------------------------ pairs from a dataset
    def _dataset_pairs(self, dataset: Any) -> list[dict]:
        """Pair records of a labelled dataset, tokenized as the rollout would (each answer ends with EOS)."""
        a = self.args
        records = dataset_pairs(dataset, self.formatters, a.chosen_column, a.rejected_column)
        for record in records:
            record.update(self._encode_pair(record))
        return records

    def _encode_pair(self, record: dict) -> dict:
        """Token ids of a pair's prompts and answers for every agent, as a rollout would have made them."""
        out: dict[str, list] = {"prompt_ids": [], "chosen_ids": [], "rejected_ids": []}
        for agent in self.agents:
            tok, i = agent.tokenizer, agent.index
            prompt = format_prompt(tok, record["prompts"][i], agent.chat)
            if self.args.max_prompt_length:
                prompt = prompt[-self.args.max_prompt_length :]
            out["prompt_ids"].append(prompt)
            for key in ("chosen", "rejected"):
                out[f"{key}_ids"].append(answer_ids(agent, record[key][i]))
        return out

    # ------------------------------------------------------------------ rounds
    def training_step(self, batches: Iterator[tuple[list[dict], list[int]]]) -> dict[str, Any]:
        """One optimizer step on ``gradient_accumulation_steps`` micro-batches of pairs; online, a round's first
        step collects its candidates first."""
        a, step = self.args, self.state["step"]
        metrics: dict[str, Any] = {}
        if self.online:
            round_index, in_round = divmod(step, self.steps_per_round)
            if self._pool_round != round_index:
                metrics.update(self._start_round(round_index, in_round, batches))
            metrics.update(self._round_metrics)
            first = in_round * a.gradient_accumulation_steps
        else:
            if not self._pool:
                self._pool = self._ordered(list(zip(self._offline, [1.0] * len(self._offline))), 0)
            first = step * a.gradient_accumulation_steps
        micro = [self._micro_batch(first + g) for g in range(a.gradient_accumulation_steps)]
        if not self.online:  # the epochs' last step takes the micro-batches left over
            micro = micro[: max(1, self.total_rollouts - first)]
        start = time.perf_counter()
        metrics.update(self.update.optimize(micro))
        metrics["time/update"] = time.perf_counter() - start
        return metrics

    def _micro_batch(self, index: int) -> list[tuple[dict, float]]:
        """Micro-batch ``index`` of the pool: the next per_device_train_batch_size pairs, wrapping around."""
        bs, n = self.args.per_device_train_batch_size, len(self._pool)
        return [self._pool[(index * bs + t) % n] for t in range(min(bs, n))]

    def _ordered(self, pool: list[tuple[dict, float]], round_index: int) -> list[tuple[dict, float]]:
        """The pool in this round's training order (a seeded shuffle, so a resumed run trains the same pairs)."""
        if not self.args.shuffle:
            return pool
        gen = torch.Generator().manual_seed(derive_seed(self.args.seed, "pool", round_index))
        return [pool[i] for i in torch.randperm(len(pool), generator=gen).tolist()]

    def _start_round(self, round_index: int, in_round: int, batches: Iterator) -> dict[str, float]:
        """Collect (or, resuming inside a round, reload) this round's pairs and draw the round's training pairs: the
        round's own pairs, then stored ones by replay weight (:func:`replay_sample`), one per pair slot of the
        round's steps, in a seeded order (a resumed run draws the same)."""
        out_dir = Path(self.args.output_dir)
        metrics: dict[str, float] = {}
        if in_round == 0:
            metrics = self.collect_round(round_index, batches)
        for r in range(round_index + 1):
            if r not in self._pairs_by_round and self._replayed(round_index, r):
                self._pairs_by_round[r] = self._stored_pairs(out_dir, r)
        rounds = sorted(r for r in self._pairs_by_round if r <= round_index)
        ages = torch.tensor([round_index - r for r in rounds], dtype=torch.long)
        a = self.args
        weights = replay_weights(ages, a.replay, a.replay_k, a.replay_decay).tolist() if rounds else []
        stored = [(p, w, r == round_index) for r, w in zip(rounds, weights) if w > 0 for p in self._pairs_by_round[r]]
        if not stored:
            raise ConfigError(
                f"round {round_index}: no preference pairs: every prompt's candidates tied (rewards within "
                f"tie_tolerance={a.tie_tolerance}). Use a denser reward, more num_generations, a higher temperature, "
                "or replay earlier rounds' pairs (replay='last_k' / 'all' / 'decay')."
            )
        slots = self.steps_per_round * a.gradient_accumulation_steps * a.per_device_train_batch_size
        gen = torch.Generator().manual_seed(derive_seed(a.seed, "replay", round_index))
        drawn = replay_sample(
            torch.tensor([w for _, w, _ in stored]), torch.tensor([f for _, _, f in stored]), slots, gen
        )
        self._pool = self._ordered([(stored[i][0], 1.0) for i in drawn], round_index)
        self._pool_round = round_index
        self._round_metrics["pairs/pool"] = float(len(stored))
        self._round_metrics["pairs/replayed"] = float(sum(not stored[i][2] for i in drawn))
        self._round_metrics["round"] = float(round_index)
        return metrics

    def _stored_pairs(self, out_dir: Path, r: int) -> list[dict]:
        """Round r's pairs from disk: its replay_dir file when replay_dir is set (a record without token ids, as the
        reference library writes them, is tokenized as a dataset pair), else its shard under output_dir."""
        path = iteration_path(self.args.replay_dir, r) if self.args.replay_dir else shard_path(out_dir, r)
        if not path.is_file():
            raise ConfigError(f"round {r}: its pairs file {path} is missing, so this run cannot resume.")
        if not self.args.replay_dir:
            return read_jsonl(path)
        records = read_iteration(path, r)
        for record in records:
            if "chosen_ids" not in record:
                record.update(self._encode_pair(record))
        return records

    def _replayed(self, round_index: int, r: int) -> bool:
        ages = torch.tensor([round_index - r])
        return bool(replay_weights(ages, self.args.replay, self.args.replay_k, self.args.replay_decay)[0] > 0)

    @torch.no_grad()
    def collect_round(self, round_index: int, batches: Iterator) -> dict[str, float]:
        """Round ``round_index``'s candidates: one batched rollout of the team (and one of the comparator) over the
        round's rows, scored and paired; the pairs go to a JSONL shard, the rewards to ``pairs/rounds.jsonl``."""
        a = self.args
        rows, ids = next(batches)
        self._snapshot(round_index)
        settings = self.generation_settings(train=True)
        settings.logprobs = False
        start = time.perf_counter()
        episodes = [
            self.rollout(
                rows,
                ids,
                settings=settings,
                num_generations=a.num_generations,
                reward_func=self.reward_func,
                seed=self._round_seed(round_index),
            )
        ]
        parsed = None  # (M, k) bool: which of a centralized comparator's completions parsed
        if a.has_comparator_side:
            seed, k = self._round_seed(round_index, 1), self.comparator_generations
            if a.comparator == "current":  # the current team answers again, apart from its own candidates
                episodes.append(
                    self.rollout(
                        rows, ids, settings=settings, num_generations=k, reward_func=self.reward_func, seed=seed
                    )
                )
            elif a.comparator == "api" or a.comparator_generation != "decentralized":
                episode, parsed = self._text_comparator_episode(rows, ids, settings, seed=seed, round_index=round_index)
                episodes.append(episode)
            elif a.comparator == "model":
                team = self._comparator_team()
                episodes.append(
                    self.rollout(
                        rows,
                        ids,
                        settings=settings,
                        num_generations=k,
                        reward_func=self.reward_func,
                        seed=seed,
                        agents=team,
                    )
                )
            else:
                with self._comparator_weights(round_index):
                    episodes.append(
                        self.rollout(
                            rows, ids, settings=settings, num_generations=k, reward_func=self.reward_func, seed=seed
                        )
                    )
        elapsed = time.perf_counter() - start
        team_ok = torch.ones(len(rows), a.num_generations, dtype=torch.bool)
        valid = None if parsed is None else torch.cat([team_ok, parsed], dim=1)
        aligned = a.comparator_pairing == "aligned"
        records, ties = candidate_pairs(
            episodes,
            round_index=round_index,
            mode=a.pair_selection,
            pairs_per_prompt=a.pairs_per_prompt,
            tie_tolerance=a.tie_tolerance,
            seed=a.seed,
            valid=valid,
            aligned=aligned,
        )
        if a.comparator in TEXT_COMPARATORS:  # the comparator's answers in the team's tokens; a truncated one stays so
            for record in records:
                for key in ("chosen", "rejected"):
                    if record[f"{key}_side"] == COMPARATOR:
                        cut = record[f"{key}_truncated"]
                        record[f"{key}_ids"] = [
                            answer_ids(ag, record[key][ag.index], eos=not cut[ag.index]) for ag in self.agents
                        ]
        write_jsonl(shard_path(a.output_dir, round_index), records)
        if a.replay_dir:
            write_iteration(a.replay_dir, round_index, records)
        self._pairs_by_round[round_index] = records
        team = episodes[0].turns[0].rewards.reshape(-1)
        summary = {"round": round_index, "team_rewards": team.tolist()}
        if len(episodes) > 1:  # the parsed candidates' rewards only
            comparator = episodes[1].turns[0].rewards
            comparator = comparator.reshape(-1) if parsed is None else comparator[parsed]
            summary["comparator_rewards"] = comparator.tolist()
        self._append_round_summary(summary)
        metrics = self.episode_metrics(episodes[0])  # reward/*, completion lengths, time/generate, perf/*
        local = episodes[:1] if a.comparator == "api" else episodes  # tokens generated here
        tokens = sum(int(s.completion_mask.sum()) for ep in local for s in ep.turns[0].samples)
        metrics["perf/rollout_tokens_per_s"] = tokens / max(sum(ep.timings["generate"] for ep in local), 1e-9)
        metrics["time/collect"] = elapsed
        if len(episodes) > 1:
            metrics["comparator/reward/mean"] = float(comparator.mean())
        if parsed is not None and a.comparator_generation != "decentralized":
            metrics["comparator/parse_failures"] = float((~parsed).sum())
        metrics["pairs/count"] = float(len(records))
        metrics["pairs/ties"] = float(ties)
        self._round_metrics = {k: v for k, v in metrics.items() if k.startswith(("reward/", "comparator/", "pairs/"))}
        self._drop_old_rounds(round_index)
        return metrics

    def _round_seed(self, round_index: int, side: int = 0) -> int:
        return derive_seed(self.args.seed, "candidates", round_index, side)

    def _append_round_summary(self, summary: dict) -> None:
        path = Path(self.args.output_dir) / PAIRS_DIR / ROUNDS_FILE
        kept = [s for s in read_jsonl(path) if s["round"] < summary["round"]] if path.is_file() else []
        write_jsonl(path, kept + [summary])  # a resumed round replaces its earlier line

    def _drop_old_rounds(self, round_index: int) -> None:
        """Forget in memory the rounds that replay no longer reads (their shards stay on disk)."""
        for r in [r for r in self._pairs_by_round if not self._replayed(round_index, r)]:
            del self._pairs_by_round[r]

    # ------------------------------------------------------------------ the comparator team
    def _comparator_team(self) -> list[Agent]:
        """comparator='model': one frozen copy of comparator_model answering for every agent (loaded once)."""
        if getattr(self, "_model_team", None) is None:
            model = load_model(self.args.comparator_model).to(self.device).train(False).requires_grad_(False)
            tok = load_tokenizer(self.args.comparator_model)
            self._model_team = [
                Agent(index=a.index, model=model, tokenizer=tok, formatter=a.formatter, chat=a.chat)
                for a in self.agents
            ]
        return self._model_team

    def _text_comparator_episode(
        self, rows: list[dict], ids: list[int], settings: GenerationSettings, *, seed: int, round_index: int
    ) -> tuple[Episode, torch.Tensor]:
        """The comparator's candidates for the rows when they come as text (the API, or a centralized completion
        split by role), scored by the team reward as a rollout's: (episode, parsed (M, G) bool)."""
        parsed: list[bool] = []

        def generate(agents: list[Agent], nodes: list[Node], g: int, *, seed: int | None = None, **_: Any) -> list:
            answers, ok = self._comparator_answers(nodes, g, settings, seed=seed, round_index=round_index)
            parsed.extend(ok)
            return [text_samples(agent, answers[agent.index]) for agent in agents]

        nodes = root_nodes(self.formatters, rows, ids, getattr(self.train_dataset, "column_names", None))
        k = self.comparator_generations
        episode = run_episode(
            self.agents,
            nodes,
            reward_func=self.reward_func,
            num_generations=k,
            settings=settings,
            reward_processor=self.reward_processor,
            seed=seed,
            generate_fn=generate,
        )
        ok = torch.tensor(parsed, dtype=torch.bool).view(len(nodes), k)
        if not ok.any():
            raise CentralizedComparatorParseError(
                f"round {round_index}: none of the centralized comparator's {ok.numel()} completions split into "
                f"{self.num_agents} role answers (e.g. {self._unparsed!r}). Check that the comparator writes every "
                "role's tags, and that max_new_tokens holds all the answers."
            )
        return episode, ok

    def _comparator_answers(
        self, nodes: list[Node], g: int, settings: GenerationSettings, *, seed: int | None, round_index: int
    ) -> tuple[list[list[Answer]], list[bool]]:
        """Each agent's g answers per node (rows = node * g + sample) and whether each joint answer parsed: the API
        asked once per (node, agent) prompt, or the comparator asked once per node for the whole team's answer
        (the API, or comparator_model on the adapter's prompt), split by :func:`split_roles`."""
        n, a = self.num_agents, self.args
        sampling = Sampling(settings.max_new_tokens, settings.temperature, settings.top_p)
        if a.comparator_generation == "decentralized":  # the API; comparator_model rolls out as a team
            where = [f"round {round_index}, row {nd.row_id}, agent {i}" for nd in nodes for i in range(n)]
            got = self._api.complete_all([nd.prompts[i] for nd in nodes for i in range(n)], g, sampling, where)
            answers = [[ans for m in range(len(nodes)) for ans in got[m * n + i]] for i in range(n)]
            return answers, [True] * (len(nodes) * g)
        prompts = [self.comparator_adapter.build_prompt(nd.row, list(nd.prompts)) for nd in nodes]
        if a.comparator == "api":
            where = [f"round {round_index}, row {nd.row_id}, centralized" for nd in nodes]
            joint = [ans for got in self._api.complete_all(prompts, g, sampling, where) for ans in got]
        else:
            one = self._comparator_team()[:1]  # comparator_model, asked as agent 0 (its chat setting)
            central = [
                Node(row=nd.row, row_id=nd.row_id, prompts=[p], prompt_history=[[p]], response_history=[[]])
                for nd, p in zip(nodes, prompts)
            ]
            s = generate_team(one, central, g, settings=settings, autocast_dtype=self.rollout_dtype, seed=seed)[0]
            joint = [Answer(text, bool(cut)) for text, cut in zip(s.texts, s.truncated.tolist())]
        answers: list[list[Answer]] = [[] for _ in range(n)]
        ok = []
        for j, ans in enumerate(joint):
            outputs = split_roles(self.comparator_adapter, ans.text, nodes[j // g].row, n)
            if outputs is None:
                self._unparsed = ans.text[:200]
            ok.append(outputs is not None)
            for i in range(n):  # each role's answer ended inside its tags, truncated or not the completion was
                answers[i].append(Answer(outputs[i] if outputs else ""))
        return answers, ok

    def _comparator_round(self, round_index: int) -> int:
        return 0 if self.args.comparator == "initial" else max(0, round_index - self.args.comparator_lag)

    def _snapshot(self, round_index: int) -> None:
        """Keep the team's trained parameters at the start of a round when a comparator will need them (in memory
        and in ``pairs/team-round-<r>.pt``, so a resumed run has them), and drop the snapshots, in memory and on
        disk, that the comparator can no longer pick (:func:`snapshot_rounds`)."""
        keep = snapshot_rounds(round_index, self.args.comparator, self.args.comparator_lag)
        if not keep:
            return
        folder = Path(self.args.output_dir) / PAIRS_DIR
        if round_index in keep:
            self._snapshots[round_index] = save_snapshot(self.agents, folder, round_index)
        drop_snapshots(self._snapshots, folder, keep)

    @contextlib.contextmanager
    def _comparator_weights(self, round_index: int) -> Iterator[None]:
        """Inside the block every agent's trained parameters are the comparator team's; restored after."""
        r = self._comparator_round(round_index)
        if r not in self._snapshots:
            path = snapshot_path(Path(self.args.output_dir) / PAIRS_DIR, r)
            if not path.is_file():
                raise ConfigError(f"round {round_index}: the comparator team of round {r} ({path}) is missing.")
            self._snapshots[r] = torch.load(path, map_location="cpu", weights_only=True)
        with swapped_parameters(self.agents, self._snapshots[r]):
            yield

    @torch.no_grad()
    def evaluate_pairs(self, dataset: Any, max_rows: int | None = None) -> dict[str, float]:
        """The team's implied preference on labelled pairs (a dataset with the chosen / rejected columns): ``eval/``
        loss, rewards/accuracies, rewards/margins and the per-agent rewards and log-probs, no reward function.
        Scored in eval mode (no dropout), each model's mode restored after. ``last_eval_samples`` hold each pair's
        chosen answers with its implied reward margin as ``reward``."""
        with eval_mode([agent.model for agent in self.agents]):
            return self._evaluate_pairs(dataset, max_rows)

    def _evaluate_pairs(self, dataset: Any, max_rows: int | None) -> dict[str, float]:
        a = self.args
        records = self._dataset_pairs(dataset)[: max_rows or a.eval_max_rows or None]
        sums: dict[str, torch.Tensor] = {}
        samples = []
        for lo in range(0, len(records), a.per_device_eval_batch_size):
            batch = records[lo : lo + a.per_device_eval_batch_size]
            tensors = [self.update.pair_tensors(agent, batch) for agent in self.agents]
            ref_c, ref_r = self.update.reference_logps(batch, tensors)
            values = torch.stack([self.update.sequence_logps(ag, t) for ag, t in zip(self.agents, tensors)])
            b = len(batch)
            _, m = team_dpo_loss(values[:, :b], values[:, b:], ref_c, ref_r, **dpo_loss_options(a))
            add_pair_sums(sums, m, values, b)
            _, h = agent_margins(values[:, :b], values[:, b:], ref_c, ref_r, reference_free=a.reference_free)
            for rec, margin in zip(batch, h.tolist()):  # a sample's reward: the implied reward margin beta * h
                samples.append(
                    {
                        "row": rec["row"],
                        "prompts": rec["prompts"],
                        "reward": a.beta * margin,
                        "completions": rec["chosen"],
                    }
                )
        self.last_eval_samples = samples
        metrics = pair_metrics(sums, len(records), a.beta)
        metrics["pairs/count"] = float(len(records))
        return {f"eval/{k}": v for k, v in sorted(metrics.items())}

    def evaluate(self, eval_dataset: Any = None, **kwargs: Any) -> dict[str, float]:
        """On labelled pairs (the chosen / rejected columns): :meth:`evaluate_pairs`; otherwise the team reward of
        its answers (greedy unless eval_do_sample), as every trainer's evaluate()."""
        dataset = next((d for d in (eval_dataset, kwargs.get("dataset"), self.eval_dataset) if d is not None), None)
        columns = set(getattr(dataset, "column_names", None) or (dataset[0].keys() if dataset else ()))
        if {self.args.chosen_column, self.args.rejected_column} <= columns:
            return self.evaluate_pairs(dataset, kwargs.get("max_rows"))
        return super().evaluate(eval_dataset, **kwargs)
