"""Behaviour of the training loop on tiny models: quick start, seeding, multi-turn, cross mode, eval, saving."""

import dataclasses
import json
import logging
from pathlib import Path

import pytest
import torch
from tiny import tiny_model, tiny_tokenizer
from tiny_team import ROWS, cfg, length_reward, weights
from transformers import AutoModelForCausalLM

from comlrl.configs.policy import MAGRPOConfig
from comlrl.errors import ConfigError
from comlrl.trainers.base import FrozenLogprobs
from comlrl.trainers.magrpo import MAGRPOTrainer


def test_quickstart_runs_unchanged_apart_from_model_and_dataset(tiny_dir, shared_data, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    model_id = tiny_dir
    # --- spec §1 quick start; only the model id and the dataset are swapped for local ones ---
    from datasets import load_dataset
    from transformers import AutoTokenizer

    from comlrl.trainers.magrpo import MAGRPOConfig, MAGRPOTrainer

    tokenizer = AutoTokenizer.from_pretrained(model_id)
    dataset = load_dataset("json", data_files=str(shared_data / "tldr_sample.jsonl"), split="train").select(range(2))
    trainer = MAGRPOTrainer(
        model=model_id,
        num_agents=2,
        tokenizer=tokenizer,
        train_dataset=dataset,
        reward_func=lambda a, b: [abs(max(len(b[0]), 1) / max(len(a[0]), 1) - 3.0)],
        formatters=[lambda example: example["prompt"]] * 2,
        args=MAGRPOConfig(per_device_train_batch_size=1),
    )
    trainer.train()
    # ---
    assert trainer.state["step"] == 2
    run_dir = Path(trainer.args.output_dir)  # no output_dir named: a fresh output/magrpo-<time>
    assert run_dir.parent == Path("output") and run_dir.name.startswith("magrpo-")
    lines = (tmp_path / run_dir / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 2 and "reward/mean" in json.loads(lines[0])


def test_runs_without_a_named_output_dir_get_fresh_folders(tiny_dir, tmp_path, monkeypatch, caplog):
    """Two trainers in one script (or the same quick start run twice) without output_dir: each its own folder, named
    in the log; a named folder that holds another run is still refused; resuming asks for the folder by name."""
    monkeypatch.chdir(tmp_path)
    args = MAGRPOConfig(
        max_steps=1, per_device_train_batch_size=2, num_generations=2, max_new_tokens=4, disable_tqdm=True
    )
    folders = []
    for _ in range(2):
        with caplog.at_level(logging.INFO, logger="comlrl.trainers.build"):
            t = MAGRPOTrainer(
                agent_model=tiny_dir, num_agents=2, train_dataset=ROWS, reward_func=length_reward, args=args
            )
        t.train()
        folders.append(Path(t.args.output_dir))
        assert f"this run writes to {t.args.output_dir}" in caplog.text
        assert (folders[-1] / "metrics.jsonl").is_file()
    assert folders[0] != folders[1] and {f.parent for f in folders} == {Path("output")}
    assert args.output_dir is None  # the caller's config is left as given
    named = dataclasses.replace(args, output_dir=str(folders[0]))
    with pytest.raises(ConfigError, match="already holds metrics.jsonl"):
        MAGRPOTrainer(
            agent_model=tiny_dir, num_agents=2, train_dataset=ROWS, reward_func=length_reward, args=named
        ).train()
    fresh = MAGRPOTrainer(agent_model=tiny_dir, num_agents=2, train_dataset=ROWS, reward_func=length_reward, args=args)
    with pytest.raises(ConfigError, match="Set output_dir to the folder of the run to continue"):
        fresh.train(resume_from_checkpoint=True)


def test_agent_model_spelling_and_default_prompt_column(tiny_dir):
    t = MAGRPOTrainer(
        agent_model=tiny_dir, num_agents=2, train_dataset=ROWS, reward_func=length_reward, args=cfg(max_steps=1)
    )
    t.train()
    assert t.num_agents == 2 and t.state["step"] == 1
    # agents are independent copies
    assert t.agents[0].model is not t.agents[1].model


def run(seed=1, trainer_cls=MAGRPOTrainer, **kw):
    args = (
        cfg(seed=seed, **kw)
        if trainer_cls is MAGRPOTrainer
        else trainer_cls.config_class(
            **{k: v for k, v in cfg(seed=seed, **kw).to_dict().items() if k != "advantage_mode"}
        )
    )
    t = trainer_cls(
        model=tiny_model(),
        tokenizer=tiny_tokenizer(),
        train_dataset=ROWS,
        reward_func=length_reward,
        formatters=[lambda e: e["prompt"], lambda e: e["prompt"] + " More detail:"],
        args=args,
    )
    before = weights(t)
    out = t.train()
    return t, before, out


def test_same_seed_same_run_different_seed_different_run():
    a, before, out_a = run(seed=3)
    b, _, out_b = run(seed=3)
    c, _, _ = run(seed=4)
    for wa, wb, wc, w0 in zip(weights(a), weights(b), weights(c), before):
        assert torch.equal(wa, wb)
        assert not torch.equal(wa, wc)
        assert not torch.equal(wa, w0)  # training changed the weights

    def strip(hs):
        return [{k: v for k, v in h.items() if not k.startswith(("time/", "perf/"))} for h in hs]

    assert strip(out_a["history"]) == strip(out_b["history"])


def test_four_variants_make_different_updates_from_the_same_rollout():
    # Compare gradients, not weights after Adam: Adam's first step is invariant to the gradient's scale, and
    # MARLOO's advantages are exactly G/(G-1) x MAGRPO's, so their *gradients* differ while Adam steps may not.
    from comlrl.algorithms.losses import loss_weights
    from comlrl.rollout.episode import episode_advantages

    t = MAGRPOTrainer(
        model=tiny_model(),
        tokenizer=tiny_tokenizer(),
        train_dataset=ROWS,
        reward_func=length_reward,
        args=cfg(num_generations=4, max_new_tokens=12),
    )
    ep = t.rollout(ROWS[:2], [0, 1], settings=t.generation_settings(), num_generations=4, reward_func=length_reward)
    assert ep.turns[0].rewards.std() > 0
    agent = t.agents[0]
    samples = ep.turns[0].samples[0]
    w = loss_weights([samples.completion_mask], "token_mean")
    grads = {}
    for mode in ("none", "mean", "loo", "max"):
        adv = episode_advantages(ep, 2, 4, mode=mode)
        t.update._accumulate_agent(agent, [(samples, adv[0][0])], w, frozen=FrozenLogprobs(), iteration=0)
        grads[mode] = torch.cat([p.grad.flatten() for p in agent.params])
        agent.optimizer.zero_grad()
    modes = list(grads)
    for i in range(4):
        for j in range(i + 1, 4):
            assert not torch.allclose(grads[modes[i]], grads[modes[j]]), (modes[i], modes[j])


@pytest.mark.parametrize("fast", [True, False])
def test_generation_is_batched_one_call_per_agent_per_turn(monkeypatch, fast):
    import comlrl.rollout.generation as generation

    calls = []
    t = MAGRPOTrainer(
        model=tiny_model(),
        tokenizer=tiny_tokenizer(),
        train_dataset=ROWS,
        reward_func=length_reward,
        args=cfg(per_device_train_batch_size=3, num_generations=4, max_steps=1, fast_generation=fast),
    )
    if fast:
        orig = generation.fast_generate

        def spy(model, input_ids, *args, **kw):
            calls.append(input_ids.shape[0])
            return orig(model, input_ids, *args, **kw)

        monkeypatch.setattr(generation, "fast_generate", spy)
    else:
        for a in t.agents:

            def spy(*args, _orig=a.model.generate, **kw):
                calls.append(kw["input_ids"].shape[0])
                return _orig(*args, **kw)

            monkeypatch.setattr(a.model, "generate", spy)
    t.train()
    assert calls == [12, 12]  # 3 prompts x 4 samples, one call per agent


def test_multi_turn_tree_transition_and_discounted_returns():
    seen = []

    def transition(agent_completions, prompt_history_per_agent, response_history_per_agent, turn, batch_item):
        seen.append((turn, [len(h) for h in prompt_history_per_agent], [len(h) for h in response_history_per_agent]))
        return [f"Revise: {c}" for c in agent_completions]

    turn_rewards = []

    def reward(a, b, turn):
        turn_rewards.append(turn)
        return [float(turn)]

    t = MAGRPOTrainer(
        model=tiny_model(),
        tokenizer=tiny_tokenizer(),
        train_dataset=ROWS,
        reward_func=reward,
        external_transition=transition,
        args=cfg(per_device_train_batch_size=2, num_generations=3, num_turns=2, discount=0.5, max_steps=1),
    )
    ep = t.rollout(ROWS[:2], [0, 1], settings=t.generation_settings(), num_generations=3, reward_func=reward)
    assert len(ep.turns) == 2
    assert ep.turns[1].rewards.shape == (6, 3)  # every turn-1 joint action expanded: early termination is off
    assert ep.turns[1].nodes[0].prompts[0].startswith("Revise: ")
    assert seen[0] == (1, [1, 1], [1, 1])
    assert turn_rewards.count(1) == 6 and turn_rewards.count(2) == 18
    from comlrl.algorithms.advantages import tree_returns

    returns = tree_returns([tu.rewards for tu in ep.turns], [tu.children for tu in ep.turns], 0.5)
    assert torch.allclose(returns[0], torch.full((2, 3), 1.0 + 0.5 * 2.0))
    t.train()
    assert "reward/turn_2/mean" in t.history[-1]


def test_early_termination_stops_branches_when_asked():
    t = MAGRPOTrainer(
        model=tiny_model(),
        tokenizer=tiny_tokenizer(),
        train_dataset=ROWS,
        reward_func=lambda a, b: [1.0],
        external_transition=lambda agent_completions: list(agent_completions),
        args=cfg(num_turns=3, termination_threshold=0.5, max_steps=1),
    )
    ep = t.rollout(ROWS[:2], [0, 1], settings=t.generation_settings(), num_generations=2, reward_func=t.reward_func)
    assert len(ep.turns) == 1  # every branch reached the threshold


def test_cross_mode_scores_every_combination():
    calls = []

    def reward(a, b):
        calls.append((a[0], b[0]))
        return [float(len(a[0]) + 10 * len(b[0]))]

    t = MAGRPOTrainer(
        model=tiny_model(),
        tokenizer=tiny_tokenizer(),
        train_dataset=ROWS,
        reward_func=reward,
        args=cfg(per_device_train_batch_size=1, num_generations=3, joint_mode="cross", max_steps=1),
    )
    t.train()
    assert len(calls) == 9  # G^N = 3^2 joint actions for one prompt


def test_cross_mode_multi_turn_expands_every_joint_action():
    t = MAGRPOTrainer(
        model=tiny_model(),
        tokenizer=tiny_tokenizer(),
        train_dataset=ROWS,
        reward_func=lambda a, b: [float(len(a[0]) - len(b[0]))],
        external_transition=lambda agent_completions: [f"Revise: {c}" for c in agent_completions],
        args=cfg(per_device_train_batch_size=2, num_generations=2, joint_mode="cross", num_turns=2, max_steps=1),
    )
    ep = t.rollout(ROWS[:2], [0, 1], settings=t.generation_settings(), num_generations=2, reward_func=t.reward_func)
    first, second = ep.turns
    assert first.rewards.shape == (2, 4) and first.children.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert second.rewards.shape == (8, 4) and len(second.samples[0].texts) == 16
    combos = [(0, 0), (0, 1), (1, 0), (1, 1)]
    for m in range(2):
        for k, combo in enumerate(combos):  # the child of a joint action continues from exactly that joint action
            child = second.nodes[m * 4 + k]
            answers = [first.samples[i].texts[m * 2 + combo[i]] for i in range(2)]
            assert [h[-1] for h in child.response_history] == answers
            assert child.prompts == [f"Revise: {a}" for a in answers]
    adv = t.compute_advantages(ep, {})
    assert [[a.shape[0] for a in per_agent] for per_agent in adv] == [[4, 16], [4, 16]]
    t.train()
    assert "reward/turn_2/mean" in t.history[-1]


def test_evaluate_greedy_by_default_and_sampling_when_asked():
    t = MAGRPOTrainer(
        model=tiny_model(),
        tokenizer=tiny_tokenizer(),
        train_dataset=ROWS,
        eval_dataset=ROWS,
        reward_func=length_reward,
        args=cfg(max_new_tokens=12),
    )
    first = t.evaluate()
    texts_first = [s["completions"] for s in t.last_eval_samples]
    second = t.evaluate()
    assert first == second and texts_first == [s["completions"] for s in t.last_eval_samples]
    assert set(first) >= {"eval/reward/mean", "eval/reward/std", "eval/agent/0/completion/mean_length"}
    torch.manual_seed(0)
    t.evaluate(do_sample=True)
    sampled = [s["completions"] for s in t.last_eval_samples]
    assert sampled != texts_first


def test_save_model_is_loadable_and_training_continues(tmp_path):
    t = MAGRPOTrainer(
        model=tiny_model(),
        tokenizer=tiny_tokenizer(),
        train_dataset=ROWS,
        reward_func=length_reward,
        args=cfg(max_steps=2),
    )
    t.train()
    paths = t.save_model(str(tmp_path / "final"))
    for agent, path in zip(t.agents, paths):
        loaded = AutoModelForCausalLM.from_pretrained(path)
        for (n, p), (_, q) in zip(agent.model.named_parameters(), loaded.named_parameters()):
            assert torch.equal(p, q), n
    t.total_steps = 3
    t.train()  # saving did not end the run
    assert t.state["step"] == 3


def test_heterogeneous_team_with_different_tokenizers():
    small = tiny_model(layers=1, hidden=16, seed=1)
    t = MAGRPOTrainer(
        agents=[tiny_model(), small],
        tokenizer=[tiny_tokenizer(), tiny_tokenizer(pad_is_eos=True)],
        train_dataset=ROWS,
        reward_func=length_reward,
        args=cfg(max_steps=1, apply_chat_template=[False, True]),
    )
    t.train()
    assert t.agents[1].model.config.hidden_size == 16
    assert t.agents[1].chat and not t.agents[0].chat


def test_kl_ratio_clipping_and_accumulation_paths():
    t, _, out = run(beta=0.1, num_iterations=2, gradient_accumulation_steps=2, max_steps=2, forward_batch_size=1)
    m = out["history"][-1]
    assert "agent/0/policy/kl" in m and m["agent/0/policy/grad_norm"] > 0
    assert t.state["rollouts"] == 4  # max_steps counts optimizer steps: 2 rollouts each
    assert all("agent/0/policy/pg_loss" in h for h in out["history"])


def test_forward_batch_size_does_not_change_the_update():
    a, _, _ = run(seed=7, max_steps=1)
    b, _, _ = run(seed=7, max_steps=1, forward_batch_size=1)
    # Adam divides by sqrt(v): coordinates with near-zero gradient amplify float-summation-order noise,
    # so compare at 1% of one step (lr = 1e-2)
    for wa, wb in zip(weights(a), weights(b)):
        torch.testing.assert_close(wa, wb, atol=1e-4, rtol=0)


def test_gradient_checkpointing_does_not_change_the_update():
    """The trainer turns on activation checkpointing when asked (no deprecation warning); the update is the same."""
    import warnings

    from comlrl.engine.models import is_checkpointing

    a, _, _ = run(seed=7, max_steps=1)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*gradient_checkpointing_enable.*is deprecated")
        b, _, _ = run(seed=7, max_steps=1, gradient_checkpointing=True)
    assert all(is_checkpointing(agent.model) for agent in b.agents)
    assert not any(is_checkpointing(agent.model) for agent in a.agents)
    for wa, wb in zip(weights(a), weights(b)):
        torch.testing.assert_close(wa, wb, atol=1e-4, rtol=0)


def test_heap_fragmentation_setting_is_applied_and_checked(monkeypatch):
    """The trainer sets glibc's mmap threshold from the config (None leaves malloc alone); bad values name the field."""
    from comlrl.engine import process as setup
    from comlrl.errors import ConfigError
    from comlrl.trainers import build

    calls = []
    monkeypatch.setattr(build, "limit_heap_fragmentation", lambda kb: calls.append(kb))
    MAGRPOTrainer(
        model=tiny_model(),
        tokenizer=tiny_tokenizer(),
        train_dataset=ROWS,
        reward_func=length_reward,
        args=cfg(malloc_mmap_threshold_kb=512),
    )
    assert calls == [512]
    with pytest.raises(ConfigError, match="malloc_mmap_threshold_kb"):
        cfg(malloc_mmap_threshold_kb=0)
    assert setup.limit_heap_fragmentation(None) is False
    if setup._MALLOPT is not None:  # glibc: the call is accepted; then back to glibc's largest default threshold
        assert setup.limit_heap_fragmentation(256) is True
        assert setup.limit_heap_fragmentation(32 * 1024) is True


def test_bf16_rollout_of_fp32_training_is_importance_corrected():
    """rollout_dtype='bfloat16' with fp32 training: the loss weighs tokens by min(p_fp32 / p_bf16, cap) (metrics
    near 1, a small KL), which changes the gradient against no correction on the same rollouts; rollouts in the
    training dtype record nothing."""

    def history(**kw):
        t = MAGRPOTrainer(
            model=tiny_model(),
            tokenizer=tiny_tokenizer(),
            train_dataset=ROWS,
            args=cfg(seed=5, max_steps=1, **kw),
            reward_func=lambda a, b: [float(sum(map(ord, a[0] + b[0])) % 7)],
        )
        return t.train()["history"][-1]

    m = history(rollout_dtype="bfloat16")
    for i in range(2):
        assert 0.8 < m[f"agent/{i}/policy/rollout_is_weight"] < 1.25
        assert 0 <= m[f"agent/{i}/policy/rollout_is_capped"] < 0.2
        assert abs(m[f"agent/{i}/policy/rollout_kl"]) < 0.05
    # top-k, top-p and a repetition penalty: the rollout and the trainer score the filtered, renormalized policy alike
    filtered = history(rollout_dtype="bfloat16", top_p=0.6, top_k=50, repetition_penalty=1.2)
    for i in range(2):
        assert 0.9 < filtered[f"agent/{i}/policy/rollout_is_weight"] < 1.1
        assert abs(filtered[f"agent/{i}/policy/rollout_kl"]) < 0.05
        assert 0 <= filtered[f"agent/{i}/policy/rollout_is_filtered"] < 0.05
    plain, same_dtype = history(rollout_dtype="bfloat16", rollout_correction=None), history(rollout_dtype="float32")
    for h in (plain, same_dtype):
        assert not any("rollout_is" in k for k in h)
    assert plain["reward/mean"] == m["reward/mean"]  # same rollouts
    for i in range(2):  # Adam's first step is ~lr * sign(g): compare the gradients, not the weights
        assert 0 < m[f"agent/{i}/policy/grad_norm"] != plain[f"agent/{i}/policy/grad_norm"]
    with pytest.raises(Exception, match="rollout_correction"):
        cfg(rollout_correction="ppo")
