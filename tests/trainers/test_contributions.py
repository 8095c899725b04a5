"""Who did what: each agent's contribution to the team reward, by replacing its answer with the untrained model's
answer or an empty one (evaluate(contributions=True), eval_contributions)."""

import json

import pytest
import torch
from peft import LoraConfig
from tiny import tiny_model, tiny_tokenizer

from comlrl import report
from comlrl.algorithms.bootstrap import bootstrap_mean
from comlrl.configs.policy import MAGRPOConfig
from comlrl.errors import ConfigError
from comlrl.trainers.contributions import contribution_metrics, untrained_agents
from comlrl.trainers.magrpo import MAGRPOTrainer

ROWS = [{"prompt": f"Task {i}: say something."} for i in range(5)]
KEYS = [f"agent_{i}/{kind}" for i in range(2) for kind in ("untrained", "empty")]


def agent0_length(a, b):
    """The team reward reads agent 0's answer only (its code points summed, 0 for ''; not its length: the tiny
    model's answers all run to max_new_tokens): agent 1 contributes nothing."""
    return [sum(map(ord, x)) / 1000.0 for x in a]


def cfg(**kw):
    base = dict(
        max_new_tokens=8,
        max_steps=1,
        eval_do_sample=True,  # sampled: the untrained answers must reuse the rollout's seeds to match
        eval_num_generations=2,
        per_device_eval_batch_size=2,  # several batches: each its own seed
        logging_steps=0,
        disable_tqdm=True,
    )
    base.update(kw)
    return MAGRPOConfig(**base)


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("contrib") / "tiny"
    tiny_model().save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return str(path)


def team(path, tmp_path_factory, lora: bool, **kw):
    peft = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"]) if lora else None
    out = tmp_path_factory.mktemp("run")
    return MAGRPOTrainer(
        model=path,
        num_agents=2,
        reward_func=agent0_length,
        eval_dataset=ROWS,
        peft_config=peft,
        args=cfg(output_dir=str(out), **kw),
    )


@pytest.fixture(scope="module")
def lora_team(tiny_path, tmp_path_factory):
    return team(tiny_path, tmp_path_factory, lora=True, eval_contributions=True)


@pytest.fixture(scope="module")
def full_team(tiny_path, tmp_path_factory):
    return team(tiny_path, tmp_path_factory, lora=False)


def perturb(model, name_part: str, seed: int) -> None:
    """'Train' weights whose name contains name_part: random values, as an optimizer step far from the start would."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if name_part in n:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)


def row_contributions(trainer):
    return [s["contribution"] for s in trainer.last_eval_samples]


@pytest.mark.parametrize("which", ["lora_team", "full_team"])
def test_an_untrained_team_contributes_what_its_untrained_self_does(which, request):
    """Same weights, same seeds: replacing an answer by the untrained model's changes nothing, exactly; agent 1
    (unread by the reward) contributes 0 either way; emptying agent 0's answer drops the reward to the reward of '', 0."""
    trainer = request.getfixturevalue(which)
    out = trainer.evaluate(contributions=True)
    rows = row_contributions(trainer)
    assert len(rows) == len(ROWS) and all(set(r) == set(KEYS) for r in rows)
    for s in trainer.last_eval_samples:
        c = s["contribution"]
        assert c["agent_0/untrained"] == 0.0 and c["agent_1/untrained"] == 0.0 and c["agent_1/empty"] == 0.0
        assert s["untrained_completions"] == s["completions"]
    # the row's team reward is the mean over its eval_num_generations joint answers; its mean over rows is eval's
    assert sum(r["agent_0/empty"] for r in rows) / len(rows) == pytest.approx(out["eval/reward/mean"])
    assert out["eval/contribution/agent_0/empty"] == pytest.approx(out["eval/reward/mean"])
    assert out["eval/reward/mean"] > 0
    for i in range(2):
        assert out[f"eval/contribution/agent_{i}/untrained"] == 0.0
    assert out["eval/contribution/agent_1/empty"] == 0.0
    low, high = out["eval/contribution/agent_0/empty_low"], out["eval/contribution/agent_0/empty_high"]
    assert low <= out["eval/contribution/agent_0/empty"] <= high and low < high


def test_a_trained_lora_agent_against_its_base(lora_team, full_team):
    """After agent 0's adapter moves away from the base, its untrained answers are the base's answers (the adapter
    disabled): the same answers the untrained full fine-tune team gives with the same seeds."""
    base = full_team.evaluate(contributions=False)
    assert "eval/contribution/agent_0/untrained" not in base
    untrained = [s["completions"][0] for s in full_team.last_eval_samples]
    model = lora_team.agents[0].model
    saved = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_B.agent_0" in n}
    try:
        perturb(model, "lora_B.agent_0", seed=1)
        out = lora_team.evaluate()  # eval_contributions=True in its config
    finally:
        with torch.no_grad():
            for n, p in model.named_parameters():
                if n in saved:
                    p.copy_(saved[n])
    samples = lora_team.last_eval_samples
    assert [s["untrained_completions"][0] for s in samples] == untrained
    assert any(s["completions"][0] != s["untrained_completions"][0] for s in samples)  # the adapter did move it
    assert out["eval/contribution/agent_0/untrained"] != 0.0
    assert out["eval/contribution/agent_1/untrained"] == 0.0 and out["eval/contribution/agent_1/empty"] == 0.0
    # each replaced reward is the reward of an untrained answer: its mean over rows is the untrained team's reward
    assert out["eval/contribution/agent_0/untrained"] == pytest.approx(
        out["eval/reward/mean"] - base["eval/reward/mean"],
        abs=1e-4,  # rewards are float32
    )


def test_a_trained_full_fine_tune_agent_against_its_initial_weights(full_team):
    """A full fine-tune's untrained model is its initial weights, loaded from the source it started from."""
    base = full_team.evaluate(contributions=True)
    model = full_team.agents[0].model
    saved = {n: p.detach().clone() for n, p in model.named_parameters()}
    try:
        perturb(model, "lm_head", seed=2)
        out = full_team.evaluate(contributions=True)
    finally:
        with torch.no_grad():
            for n, p in model.named_parameters():
                p.copy_(saved[n])
    assert untrained_agents(full_team)[0].model is not full_team.agents[0].model
    assert out["eval/contribution/agent_0/untrained"] == pytest.approx(
        out["eval/reward/mean"] - base["eval/reward/mean"],
        abs=1e-4,  # rewards are float32
    )
    assert out["eval/contribution/agent_0/empty"] == pytest.approx(out["eval/reward/mean"])
    assert out["eval/contribution/agent_1/untrained"] == 0.0


def test_a_full_fine_tune_with_a_reference_uses_it(tiny_path, tmp_path_factory):
    trainer = team(tiny_path, tmp_path_factory, lora=False, beta=0.1, eval_contributions=True)
    assert [a.model for a in untrained_agents(trainer)] == [a.ref_model for a in trainer.agents]


def test_a_loaded_model_trained_in_place_is_refused(tmp_path):
    trainer = MAGRPOTrainer(
        model=tiny_model(),
        tokenizer=tiny_tokenizer(),
        num_agents=2,
        reward_func=agent0_length,
        eval_dataset=ROWS,
        args=cfg(output_dir=str(tmp_path / "run")),
    )
    with pytest.raises(ConfigError, match=r"agent 0.*loaded model.*beta"):
        trainer.evaluate(contributions=True)


def test_multi_turn_is_refused():
    with pytest.raises(ConfigError, match="eval_contributions.*num_turns"):
        MAGRPOConfig(num_turns=2, eval_contributions=True)


def test_metrics_are_the_row_means_with_their_bootstrap_intervals():
    rows = [{"agent_0/empty": v, "agent_0/untrained": -v} for v in (0.0, 1.0, 2.0, 3.0, 10.0)]
    out = contribution_metrics(rows)
    expected = bootstrap_mean([0.0, 1.0, 2.0, 3.0, 10.0])
    assert out["eval/contribution/agent_0/empty"] == pytest.approx(3.2)
    assert (out["eval/contribution/agent_0/empty_low"], out["eval/contribution/agent_0/empty_high"]) == (
        expected.low,
        expected.high,
    )
    assert out["eval/contribution/agent_0/untrained"] == pytest.approx(-3.2)
    assert out["eval/contribution/agent_0/untrained_high"] == pytest.approx(-expected.low)
    assert contribution_metrics([]) == {}


def test_a_multi_turn_evaluation_is_refused(tiny_path, tmp_path):
    trainer = MAGRPOTrainer(
        model=tiny_path,
        num_agents=2,
        reward_func=agent0_length,
        eval_dataset=ROWS,
        external_transition=lambda prompts, **kw: prompts,
        args=cfg(output_dir=str(tmp_path / "run"), num_turns=2),
    )
    with pytest.raises(ConfigError, match="num_turns=2.*first turn only"):
        trainer.evaluate(contributions=True)


def test_the_run_report_shows_the_contributions(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward/mean": 0.5}) + "\n")
    after = {"eval/reward/mean": 0.5, **contribution_metrics([{"agent_0/untrained": 0.25, "agent_0/empty": 0.5}] * 3)}
    after.update({"eval/contribution/agent_1/untrained": 0.0, "eval/contribution/agent_1/empty": -0.125})
    (tmp_path / "eval_after.json").write_text(json.dumps(after))
    text = report.write_report(tmp_path)["markdown"].read_text()
    assert "## Who did what" in text
    assert "| agent_0 | 0.250 [0.250, 0.250] | 0.500 [0.500, 0.500] |" in text
    assert "| agent_1 | 0.000 | -0.125 |" in text
    assert report.contribution_table({"eval/reward/mean": 1.0}) == []
