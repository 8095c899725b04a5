"""MADPOTrainer on tiny models: online rounds, comparators, replay, labelled pairs, per-agent credit, resume."""

import json

import pytest
import torch
from peft import LoraConfig
from tiny import tiny_model, tiny_tokenizer

from comlrl.algorithms.preference import team_dpo_loss
from comlrl.configs.preference import MADPOConfig
from comlrl.engine.logprobs import completion_logprobs
from comlrl.engine.team import reference_mode
from comlrl.errors import ConfigError
from comlrl.trainers import dpo_update
from comlrl.trainers.madpo import MADPOTrainer
from comlrl.trainers.pairs import read_jsonl, shard_path, snapshot_rounds
from comlrl.trainers.update import OptimizerStep

ROWS = [{"prompt": f"Task {i}: say something."} for i in range(8)]
LORA = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")


def length_reward(a, b):
    return [float(len(b[0]) - len(a[0]))]


def cfg(tmp_path, **kw):
    base = dict(
        output_dir=str(tmp_path / "run"),
        num_generations=3,
        max_new_tokens=6,
        num_rounds=2,
        steps_per_round=2,
        prompts_per_round=4,
        per_device_train_batch_size=3,
        learning_rate=1e-2,
        logging_steps=0,
        disable_tqdm=True,
    )
    base.update(kw)
    return MADPOConfig(**base)


def trainer(tmp_path, peft_config=None, reward_func=length_reward, rows=ROWS, **kw):
    return MADPOTrainer(
        model=tiny_model(),
        num_agents=2,
        tokenizer=tiny_tokenizer(),
        train_dataset=rows,
        reward_func=reward_func,
        args=cfg(tmp_path, **kw),
        peft_config=peft_config,
    )


@pytest.mark.parametrize("lora", [False, True])
def test_online_rounds_store_pairs_and_train_every_agent(tmp_path, lora):
    t = trainer(tmp_path, LORA if lora else None)
    before = [[p.detach().clone() for p in a.params] for a in t.agents]
    out = t.train()
    hist = out["history"]
    assert len(hist) == 4  # num_rounds x steps_per_round
    for r in range(2):
        records = read_jsonl(shard_path(tmp_path / "run", r))
        assert records and all(rec["round"] == r for rec in records)
        for rec in records:
            assert rec["chosen_reward"] > rec["rejected_reward"]  # ties never paired
            assert len(rec["chosen_ids"]) == len(rec["rejected_ids"]) == 2
            assert rec["chosen"][0] == t.agents[0].tokenizer.decode(rec["chosen_ids"][0], skip_special_tokens=True)
    first = hist[0]
    for key in ("loss", "rewards/accuracies", "rewards/margins", "pairs/count", "pairs/ties", "reward/mean"):
        assert key in first, key
    assert "perf/rollout_tokens_per_s" in first and "perf/rollout_tokens_per_s" not in hist[1]  # collected once
    assert 0.0 <= first["rewards/accuracies"] <= 1.0
    assert first["loss"] == pytest.approx(0.6931, abs=1e-3)  # policy == reference at the first step: h = 0
    for a, old in zip(t.agents, before):
        assert any(not torch.equal(p, q) for p, q in zip(a.params, old)), f"agent {a.index} did not move"
    summaries = read_jsonl(tmp_path / "run" / "pairs" / "rounds.jsonl")
    assert [s["round"] for s in summaries] == [0, 1] and len(summaries[0]["team_rewards"]) == 4 * 3


def test_each_agent_gradient_equals_the_joint_autograd_gradient(tmp_path, monkeypatch):
    """The trainer's two passes (others' terms as values) give each agent the gradient of the team loss through its
    own term: the same as one autograd pass over both agents' live log-probs, taking agent i's part."""
    t = trainer(tmp_path, num_rounds=1, steps_per_round=1, reference_free=False, beta=0.5)
    grads = {}

    def record(*, optimizer, params, **_):
        agent = next(a for a in t.agents if a.optimizer is optimizer)
        grads[agent.index] = [p.grad.detach().clone() for p in params]
        optimizer.zero_grad(set_to_none=True)
        return OptimizerStep(grad_norm=0.0, lr=0.0)

    monkeypatch.setattr(dpo_update, "optimizer_step", record)
    t.train()
    batch = t._micro_batch(0)
    records = [p for p, _ in batch]
    tensors = [t.update.pair_tensors(a, records) for a in t.agents]
    ref_c, ref_r = t.update.reference_logps(records, tensors)
    for a in t.agents:
        a.model.zero_grad(set_to_none=True)
    logps = torch.stack([t.update.sequence_logps(a, x, grad=True) for a, x in zip(t.agents, tensors)])
    b = len(records)
    # the plain team loss on h (no per-agent split): d loss / d theta_i is the same as agent i's own-term gradient
    h = (logps[:, :b] - ref_c - logps[:, b:] + ref_r).sum(dim=0)
    (-torch.nn.functional.logsigmoid(0.5 * h)).mean().backward()
    for a in t.agents:
        for p, g in zip(a.params, grads[a.index]):
            torch.testing.assert_close(p.grad, g, rtol=1e-4, atol=1e-6)
    # the per-agent form's value: each agent's copy of the team loss, summed; its metric is the team loss itself
    loss, m = team_dpo_loss(logps[:, :b].detach(), logps[:, b:].detach(), ref_c, ref_r, beta=0.5)
    team = (-torch.nn.functional.logsigmoid(0.5 * h.detach())).mean()
    torch.testing.assert_close(m["loss"], team)
    torch.testing.assert_close(loss, len(t.agents) * team)


def test_initial_comparator_pairs_across_teams_and_history_snapshots(tmp_path):
    t = trainer(tmp_path, comparator="history", comparator_lag=1, num_rounds=3, replay="decay", replay_decay=0.5)
    t.train()
    for r in range(3):
        for rec in read_jsonl(shard_path(tmp_path / "run", r)):
            assert rec["chosen_side"] != rec["rejected_side"]
    assert (tmp_path / "run" / "pairs" / "team-round-00001.pt").is_file()
    summaries = read_jsonl(tmp_path / "run" / "pairs" / "rounds.jsonl")
    assert all(len(s["comparator_rewards"]) == len(s["team_rewards"]) for s in summaries)
    # round 2's pool: rounds 0, 1, 2 with weights 0.25, 0.5, 1, drawn by weight; every pair counts once in the loss
    assert {w for _, w in t._pool} == {1.0}
    assert t.history[-1]["pairs/pool"] == sum(len(read_jsonl(shard_path(tmp_path / "run", r))) for r in range(3))


def test_initial_comparator_generates_with_the_starting_weights(tmp_path):
    t = trainer(tmp_path, comparator="initial", num_rounds=2, steps_per_round=1)
    start = [[p.detach().clone() for p in a.params] for a in t.agents]
    seen = []
    original = t.rollout

    def rollout(*args, **kwargs):
        seen.append([torch.equal(t.agents[0].params[0], start[0][0])])
        return original(*args, **kwargs)

    t.rollout = rollout
    t.train()
    # round 0: team (initial) and comparator (initial); round 1: team (trained), comparator (initial weights)
    assert [s[0] for s in seen] == [True, True, False, True]
    assert not torch.equal(t.agents[0].params[0], start[0][0])  # restored to the trained weights after


def test_all_tied_candidates_name_the_round(tmp_path):
    t = trainer(tmp_path, reward_func=lambda a, b: [1.0])
    with pytest.raises(ConfigError, match="round 0: no preference pairs"):
        t.train()


def test_resume_inside_a_round_matches_the_uninterrupted_run(tmp_path):
    whole = trainer(tmp_path / "a", save_steps=1, save_total_limit=None)
    full = whole.train()["history"]
    resumed = trainer(tmp_path / "b")
    resumed.args.output_dir = str(tmp_path / "a" / "run")
    resumed.args.overwrite_output_dir = True
    out = resumed.train(resume_from_checkpoint=str(tmp_path / "a" / "run" / "checkpoint-1"))["history"]
    assert [h["loss"] for h in out] == pytest.approx([h["loss"] for h in full], rel=1e-5)
    for a, b in zip(whole.agents, resumed.agents):
        for p, q in zip(a.params, b.params):
            torch.testing.assert_close(p, q)


def labelled(n=8):
    return [{"prompt": f"Task {i}", "chosen": ["yes yes", "ok ok"], "rejected": ["zq", "qz"]} for i in range(n)]


def test_labelled_pairs_train_without_a_reward(tmp_path):
    t = MADPOTrainer(
        model=tiny_model(),
        num_agents=2,
        tokenizer=tiny_tokenizer(),
        train_dataset=labelled(),
        args=cfg(tmp_path, preferences="dataset", num_train_epochs=6, per_device_train_batch_size=4, beta=1.0),
    )
    hist = t.train()["history"]
    assert len(hist) == 12  # 6 epochs x 8 pairs / 4
    assert hist[0]["rewards/accuracies"] == 0.0  # h = 0 exactly at the reference
    assert hist[-1]["rewards/accuracies"] == 1.0 and hist[-1]["loss"] < hist[0]["loss"] - 0.3
    # every answer ends with the stop token, which is scored
    rec = t._offline[0]
    assert rec["chosen_ids"][0][-1] == t.agents[0].tokenizer.eos_token_id


def test_stop_token_scored_when_pad_is_eos(tmp_path):
    tok = tiny_tokenizer(pad_is_eos=True)
    t = MADPOTrainer(
        model=tiny_model(),
        num_agents=2,
        tokenizer=tok,
        train_dataset=labelled(2),
        args=cfg(tmp_path, preferences="dataset", per_device_train_batch_size=2),
    )
    tensors = t.update.pair_tensors(t.agents[0], t._offline[:2])
    ids, mask = tensors[2], tensors[3]
    last = mask.sum(dim=1) - 1
    assert (ids[torch.arange(len(ids)), last] == tok.eos_token_id).all() and (mask.sum(dim=1) > 1).all()


def test_labelled_pairs_bad_input_names_column_and_row(tmp_path):
    def make(rows):
        return MADPOTrainer(
            model=tiny_model(),
            num_agents=2,
            tokenizer=tiny_tokenizer(),
            train_dataset=rows,
            args=cfg(tmp_path, preferences="dataset", per_device_train_batch_size=2),
        )

    with pytest.raises(ConfigError, match="column 'rejected'"):
        make([{"prompt": "p", "chosen": ["a", "b"]}] * 2)
    rows = labelled(3)
    rows[2] = dict(rows[2], chosen=["only one"])
    with pytest.raises(ConfigError, match="row 2, column 'chosen'"):
        make(rows)
    with pytest.raises(ConfigError, match="reward_func= is required"):
        MADPOTrainer(
            model=tiny_model(), num_agents=2, tokenizer=tiny_tokenizer(), train_dataset=ROWS, args=cfg(tmp_path)
        )


def test_config_checks():
    with pytest.raises(ConfigError, match="comparator"):
        MADPOConfig(comparator="past")
    with pytest.raises(ConfigError, match="label_smoothing"):
        MADPOConfig(loss_type="ipo", label_smoothing=0.1)
    with pytest.raises(ConfigError, match="num_generations"):
        MADPOConfig(num_generations=1)
    assert json.loads(json.dumps(MADPOConfig().to_dict()))["beta"] == 0.1


def test_evaluate_on_labelled_pairs_reports_the_implied_preference(tmp_path):
    t = MADPOTrainer(
        model=tiny_model(),
        num_agents=2,
        tokenizer=tiny_tokenizer(),
        train_dataset=labelled(),
        eval_dataset=labelled(4),
        args=cfg(tmp_path, preferences="dataset", num_train_epochs=4, per_device_train_batch_size=4, beta=1.0),
    )
    before = t.evaluate()
    assert before["eval/rewards/accuracies"] == 0.0 and before["eval/loss"] == pytest.approx(0.6931, abs=1e-4)
    assert before["eval/pairs/count"] == 4.0
    t.train()
    after = t.evaluate()
    assert after["eval/rewards/accuracies"] == 1.0 and after["eval/rewards/margins"] > 0
    assert all(s["reward"] > 0 for s in t.last_eval_samples)  # each pair's implied reward margin


def test_model_comparator_answers_for_every_agent_in_the_teams_tokens(tmp_path):
    """The comparator's answers are re-tokenized by the team's tokenizer; a finished answer keeps its stop token, a
    truncated one (max_new_tokens reached) gets none, so the team is never taught to stop where it was cut."""
    other = tmp_path / "other"
    tiny_model(seed=5).save_pretrained(other)
    tiny_tokenizer().save_pretrained(other)
    t = trainer(tmp_path, comparator="model", comparator_model=str(other), num_rounds=1, steps_per_round=1)
    original = t.rollout

    def rollout(*args, **kwargs):
        episode = original(*args, **kwargs)
        if kwargs.get("agents") is not None:  # the comparator: agent 0's answers truncated, agent 1's finished
            for i, s in enumerate(episode.turns[0].samples):
                s.truncated = torch.full_like(s.truncated, i == 0)
        return episode

    t.rollout = rollout
    t.train()
    records = read_jsonl(shard_path(tmp_path / "run", 0))
    assert records and all(r["chosen_side"] != r["rejected_side"] for r in records)
    eos = t.agents[0].tokenizer.eos_token_id
    seen = 0
    for r in records:
        for key in ("chosen", "rejected"):
            if r[f"{key}_side"] == 1:  # re-tokenized by the team's tokenizer
                seen += 1
                assert r[f"{key}_truncated"] == [True, False]
                truncated_ids, finished_ids = r[f"{key}_ids"]
                assert truncated_ids[-1] != eos and eos not in truncated_ids
                assert finished_ids[-1] == eos
                assert t.agents[0].tokenizer.decode(truncated_ids) == r[key][0]
    assert seen
    assert t._model_team[0].model is t._model_team[1].model  # one comparator model for the team
    with pytest.raises(ConfigError, match="comparator_model"):
        MADPOConfig(comparator="model")
    with pytest.raises(ConfigError, match="comparator_model"):
        MADPOConfig(comparator_model=str(other))


def test_each_round_trains_every_one_of_its_own_pairs(tmp_path):
    """A round's steps train all of the round's own pairs, then replayed ones drawn by weight (loss weight 1)."""
    t = trainer(
        tmp_path,
        num_rounds=3,
        steps_per_round=2,
        per_device_train_batch_size=3,
        pairs_per_prompt=1,
        replay="all",
    )
    trained: list[list[tuple[dict, float]]] = []
    original = t.update.optimize

    def spy(micro):
        trained.append([entry for batch in micro for entry in batch])
        return original(micro)

    t.update.optimize = spy
    t.train()
    for r in range(3):
        fresh = {(rec["row"], tuple(rec["chosen"]), tuple(rec["rejected"])) for rec in t._pairs_by_round[r]}
        steps = trained[2 * r : 2 * r + 2]
        seen = [(p["row"], tuple(p["chosen"]), tuple(p["rejected"])) for step in steps for p, _ in step]
        assert len(seen) == 6  # steps_per_round x per_device_train_batch_size slots
        assert fresh and fresh <= set(seen), f"round {r}: a fresh pair was not trained"
        assert all(w == 1.0 for step in steps for _, w in step)  # the replay weight decides how often, not how much
        replayed = sum(p["round"] < r for step in steps for p, _ in step)
        assert t.history[2 * r]["pairs/replayed"] == replayed  # slots holding an earlier round's pair
    assert t.history[-1]["pairs/pool"] == sum(len(t._pairs_by_round[r]) for r in range(3))


def test_ipo_scores_token_mean_log_probs_as_trl(tmp_path):
    t = MADPOTrainer(
        model=tiny_model(),
        num_agents=2,
        tokenizer=tiny_tokenizer(),
        train_dataset=labelled(4),
        args=cfg(tmp_path, preferences="dataset", loss_type="ipo", per_device_train_batch_size=4),
    )
    records = t._offline[:4]
    tensors = [t.update.pair_tensors(a, records) for a in t.agents]
    agent, x = t.agents[0], tensors[0]
    with torch.no_grad():
        tokens = completion_logprobs(agent.model, *x)
    mean = tokens.sum(dim=1) / x[3].sum(dim=1)
    torch.testing.assert_close(t.update.sequence_logps(agent, x), mean)
    ref_c, ref_r = t.update.reference_logps(records, tensors)  # the reference is the initial model: the same values
    torch.testing.assert_close(ref_c[0], mean[:4], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ref_r[0], mean[4:], rtol=1e-5, atol=1e-6)


def test_dropout_is_off_by_default_and_the_reference_is_scored_in_eval_mode(tmp_path):
    assert MADPOConfig().disable_dropout is True  # TRL's DPOConfig default
    t = MADPOTrainer(
        model=tiny_model(),
        num_agents=2,
        tokenizer=tiny_tokenizer(),
        train_dataset=labelled(4),
        args=cfg(tmp_path, preferences="dataset", disable_dropout=False, per_device_train_batch_size=2),
        peft_config=LORA,
    )
    for agent in t.agents:  # attention dropout is applied in train mode only
        for layer in agent.model.get_base_model().model.layers:
            layer.self_attn.attention_dropout = 0.5
        agent.model.train()
    records = t._offline[:2]
    tensors = [t.update.pair_tensors(a, records) for a in t.agents]
    ref_c, ref_r = t.update.reference_logps(records, tensors)
    assert all(a.model.training for a in t.agents)  # train mode restored
    for agent, x in zip(t.agents, tensors):
        agent.model.eval()
        with torch.no_grad(), reference_mode(agent.model):
            want = completion_logprobs(agent.model, *x).sum(dim=1)
        agent.model.train()
        torch.testing.assert_close(ref_c[agent.index], want[:2])
        torch.testing.assert_close(ref_r[agent.index], want[2:])


def test_evaluate_pairs_scores_in_eval_mode_and_restores_train_mode(tmp_path):
    t = MADPOTrainer(
        model=tiny_model(),
        num_agents=2,
        tokenizer=tiny_tokenizer(),
        train_dataset=labelled(4),
        eval_dataset=labelled(2),
        args=cfg(tmp_path, preferences="dataset", per_device_train_batch_size=2),
    )
    seen = []
    original = t.update.sequence_logps

    def spy(agent, tensors, grad=False):
        seen.append(agent.model.training)
        return original(agent, tensors, grad)

    t.update.sequence_logps = spy
    for a in t.agents:
        a.model.train()
    t.evaluate()
    assert seen and not any(seen)
    assert all(a.model.training for a in t.agents)


def test_history_snapshots_keep_only_what_the_comparator_can_still_pick(tmp_path):
    assert snapshot_rounds(5, "history", 2) == {3, 4, 5}  # round 5 picks 3; rounds 6 and 7 will pick 4 and 5
    assert snapshot_rounds(1, "history", 3) == {0, 1}  # rounds 1..3 pick round 0; round 4 picks 1
    assert snapshot_rounds(4, "initial", 1) == {0}
    assert snapshot_rounds(4, "current", 1) == set() and snapshot_rounds(4, "model", 1) == set()
    t = trainer(tmp_path, comparator="history", comparator_lag=1, num_rounds=4, steps_per_round=1)
    t.train()
    files = sorted(p.name for p in (tmp_path / "run" / "pairs").glob("team-round-*.pt"))
    assert files == ["team-round-00002.pt", "team-round-00003.pt"]
    assert sorted(t._snapshots) == [2, 3]
