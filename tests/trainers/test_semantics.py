"""What the trainer optimizes, and TRL's names and semantics: the tempered policy, metrics over PPO iterations, joint
modes, step counting with gradient accumulation, loss normalizations, turn weighting, and no side effects."""

import math

import pytest
import torch
from tiny import tiny_model, tiny_tokenizer

import comlrl
from comlrl.accel.fastgen import fast_generate, penalize_repetitions
from comlrl.algorithms.advantages import joint_mode_name
from comlrl.algorithms.losses import loss_weights, policy_loss
from comlrl.configs.policy import MAGRPOConfig
from comlrl.engine.logprobs import completion_logprobs
from comlrl.errors import ConfigError
from comlrl.rollout.episode import Episode, Turn, episode_advantages, joint_indices
from comlrl.rollout.protocol import GenerationSettings
from comlrl.rollout.rollout import generate
from comlrl.trainers.base import FrozenLogprobs
from comlrl.trainers.magrpo import MAGRPOTrainer

ROWS = [{"prompt": f"Task {i}: say something."} for i in range(5)]


def cfg(**kw):
    base = dict(
        per_device_train_batch_size=2,
        num_generations=2,
        max_new_tokens=6,
        max_steps=1,
        learning_rate=1e-2,
        logging_steps=0,
        disable_tqdm=True,
        bf16=False,
    )
    base.update(kw)
    return MAGRPOConfig(**base)


def length_reward(a, b):
    return [float(len(b[0]) - len(a[0]))]


def make(rows=ROWS, reward=length_reward, **kw):
    return MAGRPOTrainer(
        model=tiny_model(), tokenizer=tiny_tokenizer(), train_dataset=rows, reward_func=reward, args=cfg(**kw)
    )


# ----------------------------------------------------------------------------------------------- temperature
def test_temperature_loss_gradient_is_reinforce_of_the_tempered_policy():
    """With temperature 0.5 the loss's gradient is -sum_t w_t A grad log softmax(logits / 0.5)[token], by hand."""
    t = make(temperature=0.5, max_new_tokens=5)
    episode = t.rollout(
        ROWS[:2], [0, 1], settings=t.generation_settings(), num_generations=2, reward_func=length_reward, seed=3
    )
    adv = t.compute_advantages(episode, {})
    agent = t.agents[0]
    samples, a0 = episode.turns[0].samples[0], adv[0][0]
    assert a0.abs().sum() > 0
    weights = t.update.token_weights([(episode, adv)], [samples])
    t.update._accumulate_agent(agent, [(samples, a0)], weights, frozen=FrozenLogprobs(), iteration=0)
    got = [p.grad.clone() for p in agent.params]

    model = agent.model
    ids = torch.cat([samples.prompt_ids, samples.completion_ids], dim=1)
    mask = torch.cat([samples.prompt_mask, samples.completion_mask], dim=1)
    positions = (mask.cumsum(1) - 1).clamp(min=0)
    logits = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits.float()
    p = samples.prompt_ids.shape[1]
    logp = torch.log_softmax(logits[:, p - 1 : -1] / 0.5, dim=-1).gather(-1, samples.completion_ids[..., None])[..., 0]
    loss = -(weights[0] * a0[:, None] * logp).sum()
    want = torch.autograd.grad(loss, agent.params, allow_unused=True, retain_graph=True)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, torch.zeros_like(g) if w is None else w, atol=2e-6, rtol=1e-4)
    # and it is not the temperature-1 policy's gradient
    logp1 = torch.log_softmax(logits[:, p - 1 : -1], dim=-1).gather(-1, samples.completion_ids[..., None])[..., 0]
    at_one = torch.autograd.grad(-(weights[0] * a0[:, None] * logp1).sum(), agent.params, allow_unused=True)
    assert any(w is not None and not torch.allclose(g, w, atol=1e-5) for g, w in zip(got, at_one))


@pytest.mark.parametrize("fast", [True, False])
def test_temperature_rollout_logprobs_are_the_tempered_policy(fast):
    """The rollout records log-probs of softmax(logits / T): what completion_logprobs scores at T."""
    model, tok = tiny_model(seed=2), tiny_tokenizer()
    settings = GenerationSettings(max_new_tokens=6, temperature=0.5, fast=fast, logprobs=True)
    s = generate(model, tok, ["Hello there", "Hi"], num_generations=2, settings=settings, row_seeds=[1, 2, 3, 4])
    with torch.no_grad():
        scored = completion_logprobs(
            model, s.prompt_ids, s.prompt_mask, s.completion_ids, s.completion_mask, temperature=0.5
        )
        at_one = completion_logprobs(model, s.prompt_ids, s.prompt_mask, s.completion_ids, s.completion_mask)
    torch.testing.assert_close(s.rollout_logprobs, scored, atol=1e-4, rtol=1e-4)
    assert not torch.allclose(s.rollout_logprobs, at_one, atol=1e-3)


def test_temperature_reaches_the_reference_and_old_logprobs(monkeypatch):
    """Every scoring pass of the loss (policy, old, KL reference) runs at the rollout's temperature."""
    seen = []
    import comlrl.trainers.update as update

    real = update.completion_logprobs

    def spy(*args, temperature=1.0, **kw):
        seen.append(temperature)
        return real(*args, temperature=temperature, **kw)

    monkeypatch.setattr(update, "completion_logprobs", spy)
    make(temperature=0.8, beta=0.1, num_iterations=2).train()
    assert seen and set(seen) == {0.8}


# ----------------------------------------------------------------------------------------------- iterations
def test_metrics_are_averaged_over_iterations_so_a_clipping_run_shows_clip_frac():
    out = make(num_iterations=4, epsilon=0.01, learning_rate=5e-2, max_steps=2).train()
    m = out["history"][-1]
    assert m["agent/0/policy/clip_frac"] > 0 and m["agent/1/policy/clip_frac"] > 0
    assert m["agent/0/policy/approx_kl_old_last"] != 0
    assert m["agent/0/policy/grad_norm"] > 0


# ----------------------------------------------------------------------------------------------- joint modes
def test_joint_mode_goes_through_one_table_and_unknown_values_raise():
    assert joint_mode_name("aligned") == joint_mode_name("align") == "align"
    assert joint_indices(2, 2, "aligned") == [(0, 0), (1, 1)]
    assert len(joint_indices(2, 2, "cross")) == 4
    with pytest.raises(ValueError, match="crossed"):
        joint_indices(2, 2, "crossed")
    rewards = torch.tensor([[1.0, 0.0]])
    episode = Episode([Turn(nodes=[], samples=[], rewards=rewards, children=torch.full((1, 2), -1))])
    with pytest.raises(ValueError, match="bogus"):
        episode_advantages(episode, 2, 2, joint_mode="bogus")
    aligned = episode_advantages(episode, 2, 2, joint_mode="aligned")
    assert torch.equal(aligned[0][0], torch.tensor([0.5, -0.5]))


# ----------------------------------------------------------------------------------------------- step counting
def count_updates(trainer):
    calls = []
    for agent in trainer.agents:
        agent.optimizer.register_step_post_hook(lambda opt, args, kwargs, _i=agent.index: calls.append(_i))
    return calls


def test_max_steps_counts_optimizer_steps_with_gradient_accumulation():
    t = make(max_steps=2, gradient_accumulation_steps=2)
    calls = count_updates(t)
    out = t.train()
    assert t.state == {"step": 2, "rollouts": 4, "epoch": 1, "batch_in_epoch": 1}  # 3 batches per epoch
    assert calls.count(0) == 2 and len(out["history"]) == 2
    assert all("agent/0/policy/pg_loss" in m for m in out["history"])


def test_every_rollout_of_an_epoch_reaches_an_update():
    """5 rows, 1 per rollout, 2 rollouts per update: the 5th rollout is trained on in a 3rd, smaller update, and the
    scheduler counts the same 3 updates."""
    t = make(
        per_device_train_batch_size=1,
        max_steps=-1,
        num_train_epochs=1,
        gradient_accumulation_steps=2,
        lr_scheduler_type="linear",
    )
    calls = count_updates(t)
    t.train()
    assert t.state["rollouts"] == 5 and t.state["step"] == 3
    assert calls.count(0) == 3
    assert t.agents[0].scheduler.get_last_lr()[0] == 0.0  # linear decay reached its end: the counts agree


# ----------------------------------------------------------------------------------------------- loss types
def test_loss_types_trl_names_and_hand_computed_normalizations():
    a = torch.tensor([[1, 1, 0]])
    b = torch.tensor([[1, 1, 1], [1, 0, 0]])
    masks = [a, b]
    w = loss_weights(masks, "dapo")
    assert all(torch.equal(x, y) for x, y in zip(w, loss_weights(masks, "token_mean")))
    assert float(w[0][0, 0]) == pytest.approx(1 / 6)
    g = loss_weights(masks, "grpo")
    assert float(g[0][0, 0]) == pytest.approx(1 / (2 * 3)) and float(g[1][1, 0]) == pytest.approx(1 / 3)
    d = loss_weights(masks, "dr_grpo", max_completion_length=8)
    assert float(d[1][0, 2]) == pytest.approx(1 / (3 * 8))
    # bnpo: token mean within each group (rollout), groups averaged: a has 2 tokens, b has 4
    n = loss_weights(masks, "bnpo", groups=[0, 1])
    assert float(n[0][0, 0]) == pytest.approx(0.5 / 2) and float(n[1][0, 0]) == pytest.approx(0.5 / 4)
    with pytest.raises(ValueError, match="groups"):
        loss_weights(masks, "bnpo")
    for name in ("grpo", "dr_grpo", "dapo", "bnpo"):
        assert MAGRPOConfig(loss_type=name).loss_type == name
    with pytest.raises(ConfigError, match="Did you mean 'dr_grpo'"):
        MAGRPOConfig(loss_type="dr_grp")


def ord_reward(a, b):
    return [float(sum(map(ord, a[0])) % 7 - sum(map(ord, b[0])) % 5)]


def test_trl_loss_types_give_their_hand_computed_losses_on_one_step():
    """Two rollouts of 4 completions cut to different lengths, REINFORCE advantages (not zero-sum): the step's
    pg_loss (ratio 1) is -sum_b A_b * (b's share of the loss weight). grpo: 1/n per sequence; dr_grpo:
    len_b / (n * max_new_tokens); bnpo: len_b / (tokens of b's rollout), the rollouts averaged. The three differ, and
    each step moves the agent's parameters."""
    got, want = {}, {}
    for loss_type in ("grpo", "dr_grpo", "bnpo"):
        t = make(loss_type=loss_type, advantage_mode="none", mask_truncated_completions=False, max_new_tokens=6)
        buffer = []
        for r in range(2):
            ep = t.rollout(
                ROWS[2 * r : 2 * r + 2],
                [2 * r, 2 * r + 1],
                settings=t.generation_settings(),
                num_generations=2,
                reward_func=ord_reward,
                seed=r,
            )
            for s in ep.turns[0].samples:  # lengths 1..4 (2..5 in the second rollout) where the answers are longer
                cut = torch.arange(s.completion_mask.shape[1])[None] < torch.arange(1 + r, 5 + r)[:, None]
                s.completion_mask = s.completion_mask * cut
            buffer.append((ep, t.compute_advantages(ep, {})))
        adv = [a[0][0] for _, a in buffer]  # agent 0, turn 1, per rollout
        lengths = [ep.turns[0].samples[0].completion_mask.sum(dim=1).float() for ep, _ in buffer]
        n = sum(len(a) for a in adv)
        assert all(float(a.abs().sum()) > 0 for a in adv) and len(set(torch.cat(lengths).tolist())) > 2
        want[loss_type] = {
            "grpo": -float(sum(a.sum() for a in adv)) / n,
            "dr_grpo": -float(sum((a * ln).sum() for a, ln in zip(adv, lengths))) / (n * 6),
            "bnpo": -sum(float((a * ln).sum() / ln.sum()) for a, ln in zip(adv, lengths)) / 2,
        }[loss_type]
        before = [p.detach().clone() for p in t.agents[0].params]
        got[loss_type] = t.update.optimize(buffer)["agent/0/policy/pg_loss"]
        assert any(not torch.equal(p, q) for p, q in zip(t.agents[0].params, before))
    assert got == pytest.approx(want, rel=1e-5, abs=1e-7)
    assert len({round(v, 6) for v in want.values()}) == 3, want


def test_turn_weighting_turns_weighs_each_turn_alike():
    turn1 = torch.tensor([[1, 1]])  # 1 node: 2 tokens
    turn2 = torch.tensor([[1, 1, 1], [1, 0, 0]])  # 2 nodes: 4 tokens
    samples = loss_weights([turn1, turn2], "token_mean")
    assert float(samples[0][0, 0]) == float(samples[1][0, 0]) == pytest.approx(1 / 6)  # turn 2 weighs 2/3
    turns = loss_weights([turn1, turn2], "token_mean", groups=[0, 1])
    assert float(turns[0].sum()) == pytest.approx(0.5) and float(turns[1].sum()) == pytest.approx(0.5)
    with pytest.raises(ConfigError, match="turn_weighting"):
        MAGRPOConfig(turn_weighting="nodes")


def test_turn_weighting_reaches_the_trainer_weights():
    def transition(prompts, agent_completions):
        return [p + " more" for p in prompts]

    t = MAGRPOTrainer(
        model=tiny_model(),
        tokenizer=tiny_tokenizer(),
        train_dataset=ROWS,
        reward_func=length_reward,
        external_transition=transition,
        args=cfg(num_turns=2, turn_weighting="turns"),
    )
    episode = t.rollout(
        ROWS[:1], [0], settings=t.generation_settings(), num_generations=2, reward_func=length_reward, seed=1
    )
    adv = t.compute_advantages(episode, {})
    w = t.update.token_weights([(episode, adv)], [turn.samples[0] for turn in episode.turns])
    assert [round(float(x.sum()), 6) for x in w] == [0.5, 0.5]


def test_scale_rewards_accepts_trl_booleans():
    assert MAGRPOConfig(scale_rewards=True).scale_rewards == "group"
    assert MAGRPOConfig(scale_rewards=False).scale_rewards == "none"


def test_epsilon_high_clips_the_ratio_asymmetrically():
    logp = torch.tensor([[math.log(1.3)]], requires_grad=True)
    old, adv, w = torch.zeros(1, 1), torch.ones(1), torch.ones(1, 1)
    loss, m = policy_loss(logp, old, adv, weights=w, epsilon=0.2)
    (grad,) = torch.autograd.grad(loss, logp)
    assert float(grad) == 0.0 and float(m["clip_frac"]) == 1.0  # 1.3 > 1 + 0.2: clipped
    loss, m = policy_loss(logp, old, adv, weights=w, epsilon=0.2, epsilon_high=0.4)
    (grad,) = torch.autograd.grad(loss, logp)
    assert float(grad) == pytest.approx(-1.3) and float(m["clip_frac"]) == 0.0
    with pytest.raises(ConfigError, match="epsilon_high"):
        MAGRPOConfig(epsilon_high=-0.1)


def test_mask_truncated_completions_weighs_truncated_rows_zero():
    t = make(mask_truncated_completions=True, max_new_tokens=2)  # 2 tokens: most rows are truncated
    episode = t.rollout(
        ROWS[:2], [0, 1], settings=t.generation_settings(), num_generations=2, reward_func=length_reward, seed=3
    )
    samples = episode.turns[0].samples[0]
    assert samples.truncated.any()
    (w,) = t.update.token_weights([(episode, None)], [samples])
    assert float(w[samples.truncated].abs().sum()) == 0.0
    assert bool((w[~samples.truncated].sum(1) > 0).all())


def test_repetition_penalty_follows_transformers():
    logits = torch.tensor([[2.0, -1.0, 0.5]])
    seen = torch.tensor([[True, True, False]])
    assert torch.equal(penalize_repetitions(logits, seen, 2.0), torch.tensor([[1.0, -2.0, 0.5]]))
    model, tok = tiny_model(seed=3), tiny_tokenizer()
    prompt_ids = torch.tensor([tok("aaaa")["input_ids"]])
    mask = torch.ones_like(prompt_ids)
    stop = [tok.eos_token_id]
    ours = fast_generate(
        model,
        prompt_ids,
        mask,
        max_new_tokens=8,
        eos_token_ids=stop,
        pad_token_id=0,
        do_sample=False,
        repetition_penalty=3.0,
    )
    plain = fast_generate(
        model, prompt_ids, mask, max_new_tokens=8, eos_token_ids=stop, pad_token_id=0, do_sample=False
    )
    hf = model.generate(
        input_ids=prompt_ids,
        attention_mask=mask,
        max_new_tokens=8,
        do_sample=False,
        repetition_penalty=3.0,
        eos_token_id=stop,
        pad_token_id=0,
    )[:, prompt_ids.shape[1] :]
    assert torch.equal(ours, hf[:, : ours.shape[1]])
    assert not torch.equal(ours, plain)
    assert MAGRPOConfig(repetition_penalty=1.2).repetition_penalty == 1.2


# ----------------------------------------------------------------------------------------------- TRL surface
def test_every_trainer_and_config_imports_from_the_top_level():
    for name in (
        "MAGRPOTrainer",
        "MAGRPOConfig",
        "MAREINFORCETrainer",
        "MAREINFORCEConfig",
        "MARLOOTrainer",
        "MARLOOConfig",
        "MAREMAXTrainer",
        "MAREMAXConfig",
        "MAReMaxTrainer",
        "MAReMaxConfig",
        "IACTrainer",
        "IACConfig",
        "MAACTrainer",
        "MAACConfig",
    ):
        assert getattr(comlrl, name) is not None, name
    assert comlrl.MAREMAXTrainer is comlrl.MAReMaxTrainer
    with pytest.raises(AttributeError):
        comlrl.MAGRPOTrainerr  # noqa: B018


def test_evaluate_takes_eval_dataset_and_per_device_eval_batch_size(monkeypatch):
    t = make(per_device_eval_batch_size=2)
    sizes = []
    real = t.rollout
    monkeypatch.setattr(t, "rollout", lambda rows, *a, **k: sizes.append(len(rows)) or real(rows, *a, **k))
    out = t.evaluate(eval_dataset=ROWS)
    assert sizes == [2, 2, 1] and "eval/reward/mean" in out
    with pytest.raises(ConfigError, match="eval_dataset"):
        make().evaluate()


def test_resume_from_checkpoint_true_takes_the_latest(tmp_path):
    first = make(output_dir=str(tmp_path), max_steps=2, save_steps=1, logging_steps=1)
    first.train()
    second = make(output_dir=str(tmp_path), max_steps=3, save_steps=1, logging_steps=1)
    second.train(resume_from_checkpoint=True)
    assert second.state["step"] == 3 and len(second.history) == 3
    with pytest.raises(ConfigError, match="no checkpoint"):
        make(output_dir=str(tmp_path / "empty")).train(resume_from_checkpoint=True)


def test_disable_dropout_zeroes_every_dropout():
    model = tiny_model()
    model.model.layers[0].mlp.act_fn = torch.nn.Sequential(torch.nn.SiLU(), torch.nn.Dropout(0.3))
    t = MAGRPOTrainer(
        model=model,
        tokenizer=tiny_tokenizer(),
        train_dataset=ROWS,
        reward_func=length_reward,
        args=cfg(disable_dropout=True),
    )
    drops = [m for a in t.agents for m in a.model.modules() if isinstance(m, torch.nn.Dropout)]
    assert drops and all(d.p == 0.0 for d in drops)


# ----------------------------------------------------------------------------------------------- bf16 default
def test_bf16_default_is_detected_once_and_logged(monkeypatch, caplog):
    import comlrl.trainers.build as build

    monkeypatch.delenv("COMLRL_BF16", raising=False)
    args = cfg(bf16=None)
    for native in (True, False):
        monkeypatch.setattr(build, "native_bf16", lambda device, _n=native: _n)
        monkeypatch.setattr(build, "default_bf16", lambda device, _n=native: _n)
        with caplog.at_level("INFO", logger="comlrl"):
            t = MAGRPOTrainer(
                model=tiny_model(), tokenizer=tiny_tokenizer(), train_dataset=ROWS, reward_func=length_reward, args=args
            )
        assert t.args.bf16 is native and t.autocast_dtype == (torch.bfloat16 if native else None)
        assert "bf16=None" in caplog.text
    assert args.bf16 is None  # the caller's config is not changed
    assert MAGRPOConfig().bf16 is None


def test_native_bf16_detection(monkeypatch):
    from comlrl.engine import process as setup

    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False, raising=False)
    assert setup.native_bf16(torch.device("cpu")) is False
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True, raising=False)
    assert setup.native_bf16(torch.device("cpu")) is True
    monkeypatch.setenv("COMLRL_BF16", "0")
    assert setup.default_bf16(torch.device("cpu")) is False
    monkeypatch.setenv("COMLRL_BF16", "yes")
    with pytest.raises(ConfigError, match="COMLRL_BF16"):
        setup.default_bf16(torch.device("cpu"))


# ----------------------------------------------------------------------------------------------- side effects
def test_no_side_effects_on_the_callers_args_tokenizer_and_tracker(tmp_path, monkeypatch):
    tok = tiny_tokenizer()
    tok.pad_token = None
    assert tok.pad_token_id is None
    args = cfg(output_dir=str(tmp_path), logging_steps=1, disable_tqdm=False)
    before = args.to_dict()
    closed = []
    import comlrl.tracking as tracking

    monkeypatch.setattr(tracking.Tracker, "close", lambda self: closed.append(self.dir))
    t = MAGRPOTrainer(model=tiny_model(), tokenizer=tok, train_dataset=ROWS, reward_func=length_reward, args=args)
    t.train()
    assert args.to_dict() == before
    assert tok.pad_token_id is None  # the trainer padded a copy
    assert t.agents[0].tokenizer.pad_token_id is not None
    assert closed == [tmp_path]


# ----------------------------------------------------------------------------------------------- aliases
def test_two_different_values_for_one_setting_raise_even_when_one_is_the_default():
    with pytest.raises(ConfigError, match="max_completion_length=256 contradicts max_new_tokens=128"):
        MAGRPOConfig(max_new_tokens=128, max_completion_length=256)
    with pytest.raises(ConfigError, match="agent_learning_rate"):
        MAGRPOConfig(learning_rate=1e-5, agent_learning_rate=1e-4)
    assert MAGRPOConfig(max_completion_length=256).max_new_tokens == 256
    assert MAGRPOConfig(max_new_tokens=64, max_completion_length=64).max_new_tokens == 64
    again = MAGRPOConfig.from_dict(MAGRPOConfig(max_completion_length=32).to_dict())  # a saved config reloads
    assert again.max_new_tokens == 32
