"""Preference pair records: made from a round's candidate episodes or from a labelled dataset, stored as one JSONL
shard per round under ``<output_dir>/pairs/``, and the sums behind the pair metrics (used by MADPO and MARLHF)."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any, Iterator

import torch

from ..algorithms.preference import select_pairs
from ..engine.api_client import Answer
from ..engine.models import left_pad
from ..errors import ConfigError
from ..rollout.agent import Agent, apply_formatter
from ..rollout.episode import Episode
from ..rollout.rollout import Samples
from ..rollout.sampling import derive_seed

PAIRS_DIR = "pairs"
ROUNDS_FILE = "rounds.jsonl"  # per round: the team's and the comparator's candidate rewards (report histograms)


def shard_path(output_dir: str | os.PathLike, round_index: int) -> Path:
    """Where round ``round_index``'s pairs are stored."""
    return Path(output_dir) / PAIRS_DIR / f"round-{round_index:05d}.jsonl"


def write_jsonl(path: Path, records: list[dict]) -> None:
    """Write ``records`` one JSON object per line, atomically (a reader sees the old file or the whole new one)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_jsonl(path: Path) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def iteration_path(folder: str | os.PathLike, round_index: int) -> Path:
    """Round ``round_index``'s file in a replay_dir: the reference library's ``iteration_<N>.json`` (N from 1)."""
    return Path(folder) / f"iteration_{round_index + 1:04d}.json"


def write_iteration(folder: str | os.PathLike, round_index: int, records: list[dict]) -> Path:
    """Write a round's pairs as the reference library's replay file, atomically: ``{iteration, num_pairs, pairs}``,
    each pair with its fields (prompts, winner_completions, loser_completions, winner_reward, loser_reward,
    candidate_reward_mean, raw_rewards, target_raw_reward, comparator_raw_reward; the rewards after
    reward_processor) and ours (token ids, sides, truncation), from which replay reads it back exactly."""
    path = iteration_path(folder, round_index)
    path.parent.mkdir(parents=True, exist_ok=True)
    pairs = []
    for r in records:
        sides = (r.get("chosen_side", 0), r.get("rejected_side", 0))
        rewards = (r["chosen_reward"], r["rejected_reward"])
        pairs.append(
            {
                "prompts": r["prompts"],
                "winner_completions": r["chosen"],
                "loser_completions": r["rejected"],
                "winner_reward": r["chosen_reward"],
                "loser_reward": r["rejected_reward"],
                "candidate_reward_mean": r.get("candidate_reward_mean", sum(rewards) / 2),
                "raw_rewards": list(rewards),
                "target_raw_reward": rewards[0] if sides[0] == 0 else rewards[1],
                "comparator_raw_reward": rewards[0] if sides[0] else rewards[1] if sides[1] else None,
                **r,
            }
        )
    payload = {"iteration": round_index + 1, "num_pairs": len(pairs), "pairs": pairs}
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(payload, f, ensure_ascii=False)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def read_iteration(path: Path, round_index: int) -> list[dict]:
    """A replay file's pairs as pair records (``chosen`` / ``rejected`` ... from the reference's names where a
    record has only those); token ids stay as stored (absent in a file the reference library wrote)."""
    with open(path, encoding="utf-8") as f:
        payload = json.load(f)
    records = []
    for p in payload.get("pairs", []) if isinstance(payload, dict) else payload:
        record = dict(p)
        record.setdefault("round", round_index)
        record.setdefault("row", -1)
        record.setdefault("chosen", list(p["winner_completions"]))
        record.setdefault("rejected", list(p["loser_completions"]))
        record.setdefault("chosen_reward", float(p.get("winner_reward", 0.0)))
        record.setdefault("rejected_reward", float(p.get("loser_reward", 0.0)))
        records.append(record)
    return records


def snapshot_rounds(round_index: int, comparator: str, lag: int) -> set[int]:
    """The rounds whose team snapshot the comparator can still pick at the start of round ``round_index`` (this
    round's and every later one's): 'initial': {0}; 'history': max(0, r - lag) for r >= round_index, i.e.
    {max(0, round_index - lag), ..., round_index}; 'current' and 'model': none."""
    if comparator == "initial":
        return {0}
    if comparator == "history":
        return set(range(max(0, round_index - lag), round_index + 1))
    return set()


@contextlib.contextmanager
def eval_mode(models: list[torch.nn.Module]) -> Iterator[None]:
    """Inside the block every model is in eval mode (no dropout); each one's train / eval mode is restored after."""
    modes = [m.training for m in models]
    for m in models:
        m.train(False)
    try:
        yield
    finally:
        for m, mode in zip(models, modes):
            m.train(mode)


def _joint_answer(turns: list, side: int, m: int, c: int) -> tuple[list[str], list[list[int]], list[list[int]], list]:
    """Candidate c of node m on ``side`` (0: the team's, 1: the comparator's): each agent's text, prompt ids,
    completion ids (the completion up to and including its stop token) and whether it was truncated (no stop
    token)."""
    turn, k = turns[side], turns[0].rewards.shape[1]
    row = m * turn.rewards.shape[1] + c
    texts, prompt_ids, ids, truncated = [], [], [], []
    for s, team in zip(turn.samples, turns[0].samples):  # prompts as the team tokenized them
        texts.append(s.texts[row])
        prompt_ids.append(team.prompt_ids[m * k][team.prompt_mask[m * k].bool()].tolist())
        ids.append(s.completion_ids[row][s.completion_mask[row].bool()].tolist())
        truncated.append(bool(s.truncated[row]) if s.truncated is not None else False)
    return texts, prompt_ids, ids, truncated


def candidate_pairs(
    episodes: list[Episode],
    *,
    round_index: int,
    mode: str,
    pairs_per_prompt: int | None,
    tie_tolerance: float,
    seed: int,
    valid: torch.Tensor | None = None,
    aligned: bool = False,
) -> tuple[list[dict], int]:
    """Pair records of one round from its candidate episodes (the team's, then the comparator's, if any: the same
    rows in the same order, each with its own number of candidates) and the number of dropped ties. Each record
    holds every agent's prompt, both joint answers' texts, token ids and truncation flags (per agent:
    max_new_tokens reached, no stop token), their team rewards, sides and candidate indices within their side, and
    the mean reward of the prompt's candidates. ``valid`` (M, K_total) bool: candidates that may be paired (None:
    all; a centralized comparator's completion that did not parse is not). ``aligned``: the team's candidate i is
    paired only with the comparator's candidate i."""
    first = [ep.turns[0] for ep in episodes]
    sizes = [t.rewards.shape[1] for t in first]
    sides = [side for side, n in enumerate(sizes) for _ in range(n)]
    index = [c for n in sizes for c in range(n)]  # each candidate's index within its side
    records, ties = [], 0
    for m, node in enumerate(first[0].nodes):
        rewards = torch.cat([t.rewards[m] for t in first])
        keep = list(range(len(rewards))) if valid is None else valid[m].nonzero().flatten().tolist()
        gen = torch.Generator().manual_seed(derive_seed(seed, "pairs", round_index, node.row_id))
        kept_sides = None if len(first) == 1 else [sides[c] for c in keep]
        positions = [index[c] for c in keep] if aligned else None
        sel = select_pairs(
            rewards[keep],
            mode=mode,
            pairs_per_prompt=pairs_per_prompt,
            generator=gen,
            tie_tolerance=tie_tolerance,
            sides=kept_sides,
            positions=positions,
        )
        ties += sel.ties

        for w, lo in ((keep[w], keep[lo]) for w, lo in sel.pairs):
            cw, pids, iw, tw = _joint_answer(first, sides[w], m, index[w])
            cl, _, il, tl = _joint_answer(first, sides[lo], m, index[lo])
            records.append(
                {
                    "round": round_index,
                    "row": node.row_id,
                    "prompts": list(node.prompts),
                    "chosen": cw,
                    "rejected": cl,
                    "chosen_reward": float(rewards[w]),
                    "rejected_reward": float(rewards[lo]),
                    "candidate_reward_mean": float(rewards.mean()),
                    "chosen_side": sides[w],
                    "rejected_side": sides[lo],
                    "chosen_candidate": index[w],
                    "rejected_candidate": index[lo],
                    "prompt_ids": pids,
                    "chosen_ids": iw,
                    "rejected_ids": il,
                    "chosen_truncated": tw,
                    "rejected_truncated": tl,
                }
            )
    return records, ties


def answer_ids(agent: Agent, text: str, eos: bool = True) -> list[int]:
    """An answer text as the agent's completion tokens, ending with its tokenizer's EOS unless ``eos`` is False
    (a truncated answer, which did not stop)."""
    tok = agent.tokenizer
    return tok(text, add_special_tokens=False)["input_ids"] + ([tok.eos_token_id] if eos else [])


def text_samples(agent: Agent, answers: list[Answer]) -> Samples:
    """A text comparator's answers as ``agent``'s samples (rows = node * G + g): each text in the agent's tokens,
    ending with its EOS unless truncated, right-padded; no prompt tokens (pairs take the team's)."""
    ids = [answer_ids(agent, ans.text, eos=not ans.truncated) for ans in answers]
    width = max(max((len(x) for x in ids), default=1), 1)
    c_ids = torch.full((len(ids), width), agent.tokenizer.pad_token_id, dtype=torch.long)
    c_mask = torch.zeros_like(c_ids)
    for k, x in enumerate(ids):
        c_ids[k, : len(x)] = torch.tensor(x, dtype=torch.long)
        c_mask[k, : len(x)] = 1
    empty = torch.zeros((len(ids), 1), dtype=torch.long)
    truncated = torch.tensor([ans.truncated for ans in answers], dtype=torch.bool)
    return Samples(
        prompt_ids=empty,
        prompt_mask=empty.clone(),
        completion_ids=c_ids,
        completion_mask=c_mask,
        texts=[ans.text for ans in answers],
        truncated=truncated,
    )


def dataset_pairs(dataset: Any, formatters: list, chosen_column: str, rejected_column: str) -> list[dict]:
    """Pair records (``row``, ``prompts``, ``chosen``, ``rejected``) of a dataset of labelled joint answers: each
    agent's prompt from its formatter, the answers from the two columns (a list of one answer per agent in each)."""
    n = len(formatters)
    if dataset is None or len(dataset) == 0:
        raise ConfigError("preferences='dataset': the preference dataset is empty or missing.")
    columns = list(getattr(dataset, "column_names", None) or dataset[0].keys())
    for col in (chosen_column, rejected_column):
        if col not in columns:
            raise ConfigError(
                f"preferences='dataset' needs column '{col}' (a list of {n} answers, one per agent) in the "
                f"dataset; its columns: {columns}. Set chosen_column / rejected_column to rename."
            )
    records = []
    for r in range(len(dataset)):
        row = dataset[r]
        record: dict[str, Any] = {"round": 0, "row": r}
        record["prompts"] = [
            apply_formatter(f, row, agent=i, row_id=r, columns=columns) for i, f in enumerate(formatters)
        ]
        for key, col in (("chosen", chosen_column), ("rejected", rejected_column)):
            value = row[col]
            if isinstance(value, str) or not isinstance(value, (list, tuple)) or len(value) != n:
                raise ConfigError(
                    f"dataset row {r}, column '{col}': expected a list of {n} answers (one per agent), got "
                    f"{type(value).__name__} {str(value)[:80]!r}."
                )
            for i, text in enumerate(value):
                if not isinstance(text, str):
                    raise ConfigError(
                        f"dataset row {r}, column '{col}', agent {i}: answers are strings, got {type(text).__name__}."
                    )
            record[key] = list(value)
        records.append(record)
    return records


def add_pair_sums(sums: dict[str, torch.Tensor], m: dict[str, torch.Tensor], values: torch.Tensor, b: int) -> None:
    """Add one batch of b pairs to running sums: team_dpo_loss's metrics ``m`` and the log-probs ``values`` (N, 2B),
    chosen then rejected, each weighted by b."""
    for key, value in m.items():
        sums[key] = sums.get(key, 0) + value * b
    sums["logps_chosen"] = sums.get("logps_chosen", 0) + values[:, :b].mean(dim=1) * b
    sums["logps_rejected"] = sums.get("logps_rejected", 0) + values[:, b:].mean(dim=1) * b


def pair_metrics(sums: dict[str, torch.Tensor], count: int, beta: float) -> dict[str, float]:
    """TRL's DPO metric names from the sums of :func:`add_pair_sums` over ``count`` pairs, per agent where per agent."""
    out = {
        "loss": float(sums["loss"]) / count,
        "rewards/accuracies": float(sums["reward_accuracy"]) / count,
        "rewards/margins": beta * float(sums["margin"]) / count,
    }
    for i in range(len(sums["chosen_rewards"])):
        pre = f"agent/{i}/"
        out[pre + "rewards/chosen"] = float(sums["chosen_rewards"][i]) / count
        out[pre + "rewards/rejected"] = float(sums["rejected_rewards"][i]) / count
        out[pre + "logps/chosen"] = float(sums["logps_chosen"][i]) / count
        out[pre + "logps/rejected"] = float(sums["logps_rejected"][i]) / count
    return out


def pair_tensors(agent: Agent, records: list[dict]) -> list[torch.Tensor]:
    """(prompt ids, prompt mask, completion ids, completion mask) of the agent's chosen answers, then its rejected
    ones: 2B rows, prompts left-padded, completions right-padded, on the CPU."""
    i, pad = agent.index, agent.tokenizer.pad_token_id
    prompts = [r["prompt_ids"][i] for r in records] * 2
    answers = [r["chosen_ids"][i] for r in records] + [r["rejected_ids"][i] for r in records]
    p_ids, p_mask = left_pad(prompts, pad)
    width = max(max(len(s) for s in answers), 1)
    c_ids = torch.full((len(answers), width), pad, dtype=torch.long)
    c_mask = torch.zeros_like(c_ids)
    for k, s in enumerate(answers):
        c_ids[k, : len(s)] = torch.tensor(s, dtype=torch.long)
        c_mask[k, : len(s)] = 1
    return [p_ids, p_mask, c_ids, c_mask]
