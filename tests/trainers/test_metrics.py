"""The metric keys a training step and evaluate() emit are the ones docs/metrics.md lists, and the entropy metric is
the mean token entropy of the policy the loss scores."""

import math
import re
from pathlib import Path

import torch
from tiny import tiny_model, tiny_tokenizer

from comlrl.algorithms.losses import token_entropy
from comlrl.configs.policy import MAGRPOConfig
from comlrl.trainers.magrpo import MAGRPOTrainer

DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"
ROWS = [{"prompt": f"Task {i}: say something."} for i in range(4)]
ALWAYS = {"every step": "train", "every evaluation": "eval"}


def documented_keys() -> list[tuple[str, str]]:
    """(key pattern, when it is logged) of every row of the table of keys in docs/metrics.md."""
    rows = []
    for line in DOC.read_text().splitlines():
        m = re.match(r"\| `([^`]+)` \|.*\| ([^|]+) \|$", line)
        if m:
            rows.append((m.group(1), m.group(2).strip()))
    return rows


def pattern(key: str) -> re.Pattern:
    """A documented key as a regex: ``{i}`` and ``{t}`` are numbers, any other placeholder one path segment."""
    parts = re.split(r"(\{[a-z]+\})", key)
    body = "".join((r"\d+" if p in ("{i}", "{t}") else r"[^/]+") if p.startswith("{") else re.escape(p) for p in parts)
    return re.compile(body + "$")


class Levels:
    """A reward reporting a level beside the team reward (as the built-in environments' ``score()``)."""

    def score(self, a, b):
        return [{"reward": float(len(b[0]) - len(a[0])), "level/longer": float(len(b[0]) > len(a[0]))}]

    def __call__(self, a, b):
        return [d["reward"] for d in self.score(a, b)]


def next_prompts(prompts, agent_completions):
    return [f"{p} Again." for p in prompts]


def test_the_documented_table_parses_and_names_each_key_once():
    rows = documented_keys()
    keys = [k for k, _ in rows]
    assert len(rows) > 30 and len(set(keys)) == len(keys), keys
    assert {"every step", "every evaluation"} <= {when for _, when in rows}
    assert "agent/{i}/policy/entropy" in keys and "eval/contribution/agent_{i}/{kind}" in keys


def test_every_emitted_key_is_documented_and_every_always_on_key_is_emitted():
    """One step of a 2-turn run with a KL reference, two passes and a reward reporting levels, then its evaluation
    and a one-turn evaluation with contributions: the table names every key, and the keys logged "every step" / "every evaluation" appear."""
    t = MAGRPOTrainer(
        model=tiny_model(),
        tokenizer=tiny_tokenizer(),
        train_dataset=ROWS,
        eval_dataset=ROWS[:2],
        reward_func=Levels(),
        external_transition=next_prompts,
        args=MAGRPOConfig(
            per_device_train_batch_size=2,
            num_generations=2,
            max_new_tokens=4,
            max_steps=1,
            num_turns=2,
            beta=0.1,
            num_iterations=2,
            logging_steps=0,
            disable_tqdm=True,
            bf16=False,
        ),
    )
    emitted = {"train": set(t.train()["metrics"]), "eval": set(t.evaluate())}
    t.args.num_turns = 1  # contributions are measured on one-turn evaluations
    emitted["eval"] |= set(t.evaluate(contributions=True))
    rows = documented_keys()
    patterns = [pattern(k) for k, _ in rows]
    for where, keys in emitted.items():
        undocumented = sorted(k for k in keys if not any(p.match(k) for p in patterns))
        assert not undocumented, f"{where} keys missing from docs/metrics.md: {undocumented}"
    for key, when in rows:
        if when in ALWAYS:
            assert any(pattern(key).match(k) for k in emitted[ALWAYS[when]]), f"'{key}' ({when}) was not emitted"
    # the conditional keys this run turns on
    train, ev = emitted["train"], emitted["eval"]
    assert {"agent/1/policy/kl", "agent/1/policy/approx_kl_old_last", "reward/turn_2/mean"} <= train
    assert {"reward/level/longer", "eval/reward/level/longer", "eval/reward/turn_2/mean"} <= train | ev
    assert {"eval/contribution/agent_1/empty_high", "eval/contribution/agent_0/untrained"} <= ev
    assert not any("rollout_is" in k for k in train)  # no rollout correction here


def test_entropy_metric_is_the_mean_token_entropy_of_the_tempered_policy():
    """agent/0/policy/entropy: the mean over the step's completion tokens of H(softmax(logits / T)), by hand."""
    t = MAGRPOTrainer(
        model=tiny_model(),
        tokenizer=tiny_tokenizer(),
        train_dataset=ROWS,
        reward_func=lambda a, b: [float(len(b[0]) - len(a[0]))],
        args=MAGRPOConfig(
            per_device_train_batch_size=2,
            num_generations=2,
            max_new_tokens=5,
            temperature=0.5,
            max_steps=1,
            logging_steps=0,
            disable_tqdm=True,
            bf16=False,
        ),
    )
    episode = t.rollout(
        ROWS[:2], [0, 1], settings=t.generation_settings(), num_generations=2, reward_func=t.reward_func, seed=3
    )
    adv = t.compute_advantages(episode, {})
    samples, model = episode.turns[0].samples[0], t.agents[0].model
    with torch.no_grad():
        ids = torch.cat([samples.prompt_ids, samples.completion_ids], dim=1)
        mask = torch.cat([samples.prompt_mask, samples.completion_mask], dim=1)
        logits = model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(1) - 1).clamp(min=0)).logits
        p = samples.prompt_ids.shape[1]
        per_token = token_entropy(logits[:, p - 1 : -1].float() / 0.5)
        c = samples.completion_mask.float()
        want = float((per_token * c).sum() / c.sum())
    got = t.update.optimize([(episode, adv)])["agent/0/policy/entropy"]
    assert 0 < want < math.log(259)
    assert math.isclose(got, want, rel_tol=1e-4), (got, want)
