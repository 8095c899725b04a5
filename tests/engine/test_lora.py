"""LoRA teams: one shared frozen base with an adapter per agent, versus one PEFT model per agent."""

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from tiny import tiny_model, tiny_tokenizer

from comlrl.configs.policy import MAGRPOConfig
from comlrl.rollout.episode import root_nodes
from comlrl.rollout.protocol import GenerationSettings
from comlrl.trainers.base import FrozenLogprobs
from comlrl.trainers.magrpo import MAGRPOTrainer

ROWS = [{"prompt": f"Task {i}: go."} for i in range(4)]


def lora():
    return LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj", "down_proj"])


def trainer(share=True, formatters=None, **kw):
    settings = dict(
        per_device_train_batch_size=2,
        num_generations=2,
        max_new_tokens=5,
        max_steps=2,
        learning_rate=1e-2,
        logging_steps=0,
        disable_tqdm=True,
        share_base=share,
    )
    args = MAGRPOConfig(**{**settings, **kw})
    return MAGRPOTrainer(
        model=tiny_model(),
        num_agents=3,
        tokenizer=tiny_tokenizer(),
        train_dataset=ROWS,
        reward_func=lambda a, b, c: [float(len(c[0]) - len(a[0]))],
        args=args,
        peft_config=lora(),
        formatters=formatters,
    )


def base_state(model):
    return {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" not in n}


def test_shared_base_holds_one_base_and_trains_only_adapters():
    t = trainer()
    assert t.agents[0].model is t.agents[1].model is t.agents[2].model
    assert [a.adapter for a in t.agents] == ["agent_0", "agent_1", "agent_2"]
    n_base = sum(p.numel() for n, p in t.agents[0].model.named_parameters() if "lora_" not in n)
    assert n_base == sum(p.numel() for p in tiny_model().parameters())  # one base, not three
    for a in t.agents:
        assert all(f".{a.adapter}." in n for n, p in a.model.named_parameters() if any(p is q for q in a.params))
    base_before = base_state(t.agents[0].model)
    adapters_before = [[p.detach().clone() for p in a.params] for a in t.agents]
    t.train()
    for n, p in base_state(t.agents[0].model).items():
        assert torch.equal(p, base_before[n]), n
    for a, before in zip(t.agents, adapters_before):
        assert any(not torch.equal(p, q) for p, q in zip(a.params, before)), a.adapter


def test_bf16_lora_team_stores_the_frozen_base_in_bf16_and_adapters_in_fp32():
    t = trainer(bf16=True)
    model = t.agents[0].model
    base = [p for n, p in model.named_parameters() if "lora_" not in n]
    assert base and all(p.dtype == torch.bfloat16 for p in base)
    assert all(p.dtype == torch.float32 and p.requires_grad for a in t.agents for p in a.params)
    before = [[p.detach().clone() for p in a.params] for a in t.agents]
    out = t.train()
    assert all(torch.isfinite(torch.tensor(h["reward/mean"])) for h in out["history"])
    for a, b in zip(t.agents, before):  # fp32 adapters receive the updates (a bf16 weight could round them away)
        assert any(not torch.equal(p, q) for p, q in zip(a.params, b)), a.adapter


def _sync_adapters(src, dst):
    """Give both teams identical, non-trivial adapter weights (B = 0 at init would hide A's gradient)."""
    torch.manual_seed(0)
    for a_src, a_dst in zip(src.agents, dst.agents):
        for p, q in zip(a_src.params, a_dst.params):
            with torch.no_grad():
                p.copy_(torch.randn_like(p) * 0.1)
                q.copy_(p)


def test_shared_and_per_agent_peft_paths_give_same_loss_and_gradients():
    shared, plain = trainer(share=True), trainer(share=False)
    assert plain.agents[0].model is not plain.agents[1].model
    _sync_adapters(shared, plain)
    ep = shared.rollout(
        ROWS[:2], [0, 1], settings=shared.generation_settings(), num_generations=2, reward_func=shared.reward_func
    )
    from comlrl.algorithms.losses import loss_weights
    from comlrl.rollout.episode import episode_advantages

    adv = episode_advantages(ep, 3, 2)
    for i in range(3):
        batches = [(ep.turns[0].samples[i], adv[i][0])]
        w = loss_weights([ep.turns[0].samples[i].completion_mask], "token_mean")
        grads = []
        for t in (shared, plain):
            agent = t.agents[i]
            t.update._accumulate_agent(agent, batches, w, frozen=FrozenLogprobs(), iteration=0)
            grads.append([p.grad.clone() for p in agent.params])
            agent.optimizer.zero_grad()
        for g1, g2 in zip(*grads):
            torch.testing.assert_close(g1, g2, atol=1e-6, rtol=1e-5)
        assert any(g.abs().sum() > 0 for g in grads[0])


def test_mixed_adapter_generation_matches_one_agent_at_a_time():
    shared, plain = trainer(share=True), trainer(share=False)
    _sync_adapters(shared, plain)
    greedy = GenerationSettings(max_new_tokens=6, do_sample=False, logprobs=True)
    nodes = root_nodes(shared.agents, ROWS[:2], [0, 1])
    from comlrl.rollout.episode import generate_team

    together = generate_team(shared.agents, nodes, 1, settings=greedy)
    alone = generate_team(plain.agents, nodes, 1, settings=greedy)
    assert [s.texts for s in together] == [s.texts for s in alone]
    for s, a in zip(together, alone):  # each agent's rows keep their own recorded log-probs
        assert s.rollout_logprobs.shape == s.completion_ids.shape
        torch.testing.assert_close(s.rollout_logprobs, a.rollout_logprobs, atol=1e-5, rtol=0)
    assert together[0].texts != together[1].texts  # adapters really differ per agent


def test_kl_reference_is_the_base_with_adapters_off():
    t = trainer(beta=0.5, max_steps=1)
    assert all(a.ref_model is None for a in t.agents)
    out = t.train()
    assert out["metrics"]["agent/0/policy/kl"] >= 0


def test_lora_save_gives_one_adapter_folder_per_agent(tmp_path):
    t = trainer(max_steps=1)
    t.train()
    paths = t.save_model(str(tmp_path))
    for a, path in zip(t.agents, paths):
        loaded = PeftModel.from_pretrained(tiny_model(), path)
        sd = {n: p for n, p in loaded.named_parameters() if "lora_" in n}
        mine = {
            n.replace(f".{a.adapter}.", ".default."): p for n, p in a.model.named_parameters() if f".{a.adapter}." in n
        }
        assert sd.keys() == mine.keys()
        for n in sd:
            assert torch.equal(sd[n], mine[n])


def test_fused_lora_delta_gradcheck():
    """The fused LoRA op: base_out + s (x A^T) B^T, gradients for x, A, B and the base output match finite differences;
    with two adapters routed over row blocks (and rows no adapter covers), each block gets its own delta."""
    from comlrl.engine.team import _LoRADelta

    torch.manual_seed(0)
    base, x = torch.randn(2, 3, 5, dtype=torch.float64), torch.randn(2, 3, 4, dtype=torch.float64)
    a, b = torch.randn(2, 4, dtype=torch.float64), torch.randn(5, 2, dtype=torch.float64)
    inputs = [t.requires_grad_() for t in (base, x, a, b)]
    one = lambda base, x, a, b: _LoRADelta.apply(base, x, ((0, 2),), (0.5,), torch.float64, a, b)  # noqa: E731
    torch.testing.assert_close(one(*inputs), base + 0.5 * (x @ a.T) @ b.T)
    assert torch.autograd.gradcheck(one, inputs)

    base, x = torch.randn(5, 3, 5, dtype=torch.float64), torch.randn(5, 3, 4, dtype=torch.float64)
    a2, b2 = torch.randn(3, 4, dtype=torch.float64), torch.randn(5, 3, dtype=torch.float64)
    inputs = [t.requires_grad_() for t in (base, x, a, b, a2, b2)]
    two = lambda base, x, a, b, a2, b2: _LoRADelta.apply(  # noqa: E731
        base, x, ((0, 2), (3, 5)), (0.5, 2.0), torch.float64, a, b, a2, b2
    )
    want = torch.cat([base[:2] + 0.5 * (x[:2] @ a.T) @ b.T, base[2:3], base[3:] + 2.0 * (x[3:] @ a2.T) @ b2.T])
    torch.testing.assert_close(two(*inputs), want)
    assert torch.autograd.gradcheck(two, inputs)


def test_fused_lora_forward_is_scoped_and_falls_back():
    """Inside the block LoRA linears under autocast take the fused op (same values as PEFT's); the class is restored
    afterwards; without autocast and under activation checkpointing PEFT's own forward runs."""
    from peft.tuners.lora.layer import Linear

    from comlrl.engine.team import fused_lora_forward

    model = get_peft_model(
        tiny_model(), LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False)
    )
    ids = torch.randint(3, 259, (2, 7))
    original = Linear.forward
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = model(input_ids=ids).logits.float()
        with fused_lora_forward(model):
            assert Linear.forward is not original
            fused = model(input_ids=ids).logits.float()
    assert Linear.forward is original
    torch.testing.assert_close(fused, expected, atol=0.1, rtol=0.05)
    model.get_base_model().gradient_checkpointing_enable()
    with fused_lora_forward(model):
        assert Linear.forward is original


def _relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).norm() / want.norm().clamp(min=1e-12))


def test_team_lora_forward_gives_each_agent_its_own_gradients():
    """A bf16 LoRA team: one routed forward/backward for all agents gives each adapter the gradient and metrics of its
    own agent's pass -- with the same prompt for every agent (rows of different adapters must not be packed together)
    and a longer prompt for one agent (padding)."""
    from comlrl.algorithms.losses import loss_weights
    from comlrl.rollout.episode import episode_advantages

    fmts = [lambda r: r["prompt"], lambda r: "Answer in a few words, please. " + r["prompt"], lambda r: r["prompt"]]
    t = trainer(bf16=True, formatters=fmts, team_lora_forward=True)
    _sync_adapters(t, t)
    assert t.update._update_groups() == [t.agents]
    ep = t.rollout(ROWS[:2], [0, 1], settings=t.generation_settings(), num_generations=2, reward_func=t.reward_func)
    adv = episode_advantages(ep, 3, 2)
    data = {}
    for a in t.agents:
        samples = ep.turns[0].samples[a.index]
        data[a.index] = (
            [(samples, adv[a.index][0])],
            loss_weights([samples.completion_mask], "token_mean"),
            FrozenLogprobs(),
            float(samples.completion_mask.sum()),  # the tokens the entropy is a mean over
        )
    team_sums = t.update._accumulate_team(t.agents, data, 0)
    team = [[p.grad.clone() for p in a.params] for a in t.agents]
    for a in t.agents:
        batches, w, _, _ = data[a.index]
        sums = t.update._accumulate_agent(a, batches, w, frozen=FrozenLogprobs(), iteration=0)
        for k, v in sums.items():
            assert abs(team_sums[a.index][k] - v) <= 1e-2 * max(abs(v), 1e-3), (a.index, k)
        alone = [p.grad for p in a.params]
        assert all(g.abs().sum() > 0 for g in alone)
        for g_team, g_alone in zip(team[a.index], alone):
            assert _relative_error(g_team, g_alone) < 2e-2, a.adapter
    # the agents' gradients really differ, so a mix-up of adapters would show
    assert _relative_error(team[0][0], team[1][0]) > 0.2


def test_team_lora_forward_is_used_only_where_it_routes_exactly():
    t = trainer(bf16=True, team_lora_forward=True)
    assert t.update._update_groups() == [t.agents]
    assert [len(g) for g in trainer(bf16=False, team_lora_forward=True).update._update_groups()] == [
        1,
        1,
        1,
    ]  # no autocast
    pairs = trainer(bf16=True)  # default: 2 agents per pass
    assert [[a.index for a in g] for g in pairs.update._update_groups()] == [[0, 1], [2]]
    for off in (False, 1):
        assert [len(g) for g in trainer(bf16=True, team_lora_forward=off).update._update_groups()] == [1, 1, 1]
    assert [len(g) for g in trainer(bf16=True, team_lora_forward=3).update._update_groups()] == [3]
    import pytest

    from comlrl.errors import ConfigError

    for bad in (0, -2, 1.5, "yes"):
        with pytest.raises(ConfigError, match="team_lora_forward"):
            MAGRPOConfig(team_lora_forward=bad)
    dropout = trainer(bf16=True, team_lora_forward=True)
    for m in dropout.agents[0].model.modules():
        if hasattr(m, "lora_dropout") and "agent_1" in m.lora_dropout:
            m.lora_dropout["agent_1"] = torch.nn.Dropout(0.1)
    assert [len(g) for g in dropout.update._update_groups()] == [1, 1, 1]


def test_routed_forward_refuses_a_layer_it_cannot_compute():
    import pytest

    from comlrl.engine.logprobs import team_completion_logprobs
    from comlrl.engine.team import can_route

    t = trainer(bf16=True)
    model = t.agents[0].model
    for m in model.modules():
        if hasattr(m, "lora_dropout") and "agent_1" in m.lora_dropout:
            m.lora_dropout["agent_1"] = torch.nn.Dropout(0.1)
    assert not can_route(model, ["agent_0", "agent_1"])
    ids, mask = torch.tensor([[5, 6, 7]]), torch.ones(1, 3, dtype=torch.long)
    parts = [(ids, mask, ids, mask)] * 2
    with torch.autocast("cpu", dtype=torch.bfloat16), pytest.raises(RuntimeError, match="cannot route"):
        team_completion_logprobs(model, ["agent_0", "agent_1"], parts)


def test_freed_memory_is_released_between_phases_unless_turned_off(monkeypatch):
    """release_memory (default on) trims the heap twice per update, for full fine-tunes and LoRA teams alike."""
    from comlrl.trainers import base, update

    calls = []
    for module in (base, update):  # after the rollout (the loop), after the last agent's update (the update)
        monkeypatch.setattr(module, "release_freed_memory", lambda: calls.append(1))

    def count(peft, **kw):
        calls.clear()
        settings = dict(
            per_device_train_batch_size=2,
            num_generations=2,
            max_new_tokens=4,
            max_steps=2,
            learning_rate=1e-2,
            logging_steps=0,
            disable_tqdm=True,
            **kw,
        )
        MAGRPOTrainer(
            model=tiny_model(),
            num_agents=2,
            tokenizer=tiny_tokenizer(),
            train_dataset=ROWS,
            reward_func=lambda a, b: [float(len(b[0]) - len(a[0]))],
            args=MAGRPOConfig(**settings),
            peft_config=lora() if peft else None,
        ).train()
        return len(calls)

    assert count(peft=False) == count(peft=True) == 4  # 2 updates
    assert count(peft=True, release_memory=False) == count(peft=False, release_memory=False) == 0


def test_wrapping_a_model_in_lora_prints_no_deprecation_noise():
    import warnings

    from comlrl.engine.team import wrap_lora

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = wrap_lora(tiny_model(), LoraConfig(r=4, target_modules=["q_proj"]), "agent_0")
    assert "agent_0" in model.peft_config
    assert not [w for w in caught if "is_gradient_checkpointing" in str(w.message)]
