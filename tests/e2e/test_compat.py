"""Scripts written for the reference library (PyPI comlrl 1.4.3) run here: its import paths, config fields and
trainer keywords map onto ours with its meaning, and the aliases cannot drift from their targets."""

import dataclasses
import importlib
import json
import logging
from pathlib import Path

import pytest
import torch

import comlrl
from comlrl import configs as ours
from comlrl.compat import fields as compat_fields
from comlrl.compat.configs import is_compat_style
from comlrl.compat.keywords import compat_hooks
from comlrl.errors import ConfigError

# The reference's public names by import path, and its config fields, as its 1.4.3 sources define them.
REFERENCE_EXPORTS = {
    "comlrl.trainers": [
        "ActorCriticTrainerBase", "IACConfig", "IACTrainer", "MAACConfig", "MAACTrainer", "MAGRPOConfig",
        "MAGRPOTrainer", "MADPOConfig", "MADPOTrainer", "MARLHFConfig", "MARLHFTrainer", "JointRewardModel",
        "MAREINFORCEConfig", "MAREINFORCETrainer", "MAReMaxConfig", "MAReMaxTrainer", "MARLOOConfig", "MARLOOTrainer",
    ],
    "comlrl.trainers.reinforce": [
        "MAGRPOConfig", "MAGRPOTrainer", "CentralizedMAGRPOConfig", "CentralizedMAGRPOTrainer", "MAREINFORCEConfig",
        "MAREINFORCETrainer", "MAReMaxConfig", "MAReMaxTrainer", "MARLOOConfig", "MARLOOTrainer",
    ],
    "comlrl.trainers.actor_critic": [
        "ActorCriticTrainerBase", "IACConfig", "IACTrainer", "RolloutSample", "MAACConfig", "MAACTrainer",
    ],
    "comlrl.trainers.preference": [
        "MADPOConfig", "MADPOTrainer", "CentralizedComparatorAdapter", "CentralizedComparatorParseError",
        "TaggedCentralizedComparatorAdapter", "MADPOIterConfig", "MADPOIterTrainer", "MARLHFConfig", "MARLHFTrainer",
        "MARLHFIterConfig", "MARLHFIterTrainer", "JointRewardModel",
    ],
    "comlrl.utils": ["RewardProcessors"],
    "comlrl.utils.reward_processor": ["RewardProcessors"],
}  # fmt: skip
_MAGRPO_FIELDS = {
    "num_train_epochs", "agent_learning_rate", "logging_steps", "num_agents", "parallel_training", "agent_devices",
    "num_generations", "max_new_tokens", "temperature", "top_p", "top_k", "num_turns", "discount", "joint_mode",
    "early_termination_threshold", "external_prompt_passthrough", "eval_interval", "eval_num_samples",
    "eval_batch_size", "rollout_buffer_size", "train_batch_size", "advantage_normalization", "advantage_mode",
    "reference_kl_enabled", "reference_kl_coef", "reference_devices",
}  # fmt: skip
_AC_FIELDS = {
    "agent_learning_rate", "critic_learning_rate", "rollout_buffer_size", "train_batch_size", "value_loss_coef",
    "advantage_normalization", "max_new_tokens", "temperature", "top_p", "top_k", "num_train_epochs", "num_agents",
    "num_generations", "num_turns", "parallel_training", "agent_devices", "critic_devices",
    "external_prompt_passthrough", "discount", "critic_type", "early_termination_threshold", "eval_interval",
    "eval_num_samples", "eval_batch_size", "logging_steps", "reference_kl_enabled", "reference_kl_coef",
    "reference_devices", "use_separate_critic",
}  # fmt: skip
_MADPO_FIELDS = (_MAGRPO_FIELDS - {"num_generations"}) | {
    "collaboration_mode", "preference_num_candidates", "preference_pairs_per_sample",
    "pair_selection", "dpo_beta", "use_environment_step", "environment_steps_per_pair",
}  # fmt: skip
_MARLHF_FIELDS = _MADPO_FIELDS | {
    "rl_algorithm", "num_generations", "reward_model_name", "reward_model_device", "reward_learning_rate", "reward_num_train_epochs",
    "reward_train_batch_size", "reward_max_length", "reward_freeze_backbone", "critic_model_name",
    "critic_learning_rate", "critic_devices", "use_separate_critic", "critic_type", "value_loss_coef",
    "value_clip_range", "critic_value_head_hidden_dim", "value_head_hidden_dim",
}  # fmt: skip
_ITERATIVE_FIELDS = {
    "num_iterations", "preference_replay_mode", "preference_replay_k", "preference_replay_lambda",
    "preference_replay_sample_size", "preference_replay_dir", "log_reward_distribution", "policy_checkpoint_dir",
    "comparator_policy", "comparator_generation_mode", "comparator_centralized_agent_index", "comparator_model_name",
    "comparator_agents", "comparator_devices", "comparator_num_candidates", "comparator_history_k",
    "comparator_api_url", "comparator_api_format", "comparator_api_model", "comparator_api_max_n_per_request",
    "comparator_api_timeout", "comparator_api_headers", "comparator_api_key", "comparator_api_key_env",
    "comparator_api_key_header", "comparator_api_key_prefix", "comparator_api_response_field",
    "comparator_api_extra_body",
}  # fmt: skip
REFERENCE_FIELDS = {
    "MADPOConfig": _MADPO_FIELDS,
    "MARLHFConfig": _MARLHF_FIELDS,
    "MADPOIterConfig": _MADPO_FIELDS | _ITERATIVE_FIELDS,
    "MAGRPOConfig": _MAGRPO_FIELDS,
    "MAREINFORCEConfig": _MAGRPO_FIELDS,
    "MAReMaxConfig": _MAGRPO_FIELDS,
    "MARLOOConfig": _MAGRPO_FIELDS,
    "CentralizedMAGRPOConfig": _MAGRPO_FIELDS | {"collaboration_mode"},
    "IACConfig": _AC_FIELDS | {"value_clip_range", "value_head_hidden_dim", "critic_value_head_hidden_dim"},
    "MAACConfig": _AC_FIELDS,
}
OUR_CONFIG = {  # the reference class -> our config it builds
    "MAGRPOConfig": ours.MAGRPOConfig,
    "MAREINFORCEConfig": ours.MAREINFORCEConfig,
    "MAReMaxConfig": ours.MAReMaxConfig,
    "MARLOOConfig": ours.MARLOOConfig,
    "CentralizedMAGRPOConfig": ours.CentralizedMAGRPOConfig,
    "IACConfig": ours.IACConfig,
    "MAACConfig": ours.MAACConfig,
    "MADPOConfig": ours.MADPOConfig,
    "MARLHFConfig": ours.MARLHFConfig,
    "MADPOIterConfig": importlib.import_module("comlrl.trainers.preference").MADPOIterConfig,
}


def _fields(cls):
    return {f.name for f in dataclasses.fields(cls)}


def test_reference_names_are_our_classes_and_the_tables_cover_its_fields():
    for module, names in REFERENCE_EXPORTS.items():
        mod = importlib.import_module(module)
        for name in names:
            assert hasattr(mod, name), f"{module}.{name}"
    reinforce = importlib.import_module("comlrl.trainers.reinforce")
    actor_critic = importlib.import_module("comlrl.trainers.actor_critic")
    for name in ("MAGRPOTrainer", "MAREINFORCETrainer", "MAReMaxTrainer", "MARLOOTrainer", "CentralizedMAGRPOTrainer"):
        assert getattr(reinforce, name) is getattr(comlrl, name)  # one trainer, not a copy
    assert actor_critic.ActorCriticTrainerBase is actor_critic.ActorCriticTrainer
    assert actor_critic.IACTrainer is comlrl.IACTrainer
    preference = importlib.import_module("comlrl.trainers.preference")
    assert preference.MADPOIterTrainer is preference.MADPOTrainer is comlrl.MADPOTrainer
    assert preference.MARLHFTrainer is comlrl.MARLHFTrainer
    assert issubclass(preference.MADPOIterConfig, ours.MADPOConfig) and preference.MADPOIterConfig.compat_style
    with pytest.raises(ConfigError, match="iterative MARLHF is not built"):
        preference.MARLHFIterConfig(num_iterations=2)
    for name, target in OUR_CONFIG.items():
        # each reference path's config: a reference-style subclass of ours that adds no field of its own
        for path in (reinforce, actor_critic, preference):
            if hasattr(path, name):
                alias = getattr(path, name)
                assert issubclass(alias, target) and alias.compat_style and _fields(alias) == _fields(target)
        if name in comlrl.__all__:  # our top-level names stay ours
            assert getattr(comlrl, name) is target and not getattr(target, "compat_style", False)
        assert _fields(target) == _fields(ours.MADPOConfig) or not name.startswith("MADPOIter")
        rules, _ = compat_fields.rules_for(target)
        defaults = compat_fields.compat_defaults(target)
        assert set(defaults) == REFERENCE_FIELDS[name], name  # the reference's defaults: its whole field list
        for field in defaults:  # every reference field is translated or is a field of ours with its name
            assert field in rules or field in _fields(target), (name, field)
        for field, rule in rules.items():  # and every translation sets fields that exist
            assert set(rule.sets) <= _fields(target), (name, field, rule.sets)


def test_reference_fields_take_the_reference_meaning():
    reinforce = importlib.import_module("comlrl.trainers.reinforce")
    actor_critic = importlib.import_module("comlrl.trainers.actor_critic")
    # rows per optimizer step: the reference counts tree nodes (2 turns, G = 3 aligned: 1 + 3 nodes per row)
    c = reinforce.MAGRPOConfig(rollout_buffer_size=8, num_turns=1, num_generations=3)
    assert c.per_device_train_batch_size == 8
    c = reinforce.MAGRPOConfig(rollout_buffer_size=8, train_batch_size=8, num_turns=2, num_generations=3)
    assert c.per_device_train_batch_size == 2
    # its advantage_normalization re-centres after the baseline, so raw returns standardize too
    c = reinforce.MAGRPOConfig(advantage_normalization=True, advantage_mode="raw", num_turns=1)
    assert (c.advantage_mode, c.scale_rewards) == ("none", "standardize")
    c = reinforce.MAGRPOConfig(advantage_normalization=False, advantage_mode="rloo", num_turns=1)
    assert (c.advantage_mode, c.scale_rewards) == ("loo", "none")
    c = reinforce.MAGRPOConfig(early_termination_threshold=0.5, external_prompt_passthrough=True, num_turns=1)
    assert (c.termination_threshold, c.termination_scope, c.format_transition_prompts) == (0.5, "node", False)
    c = reinforce.MAGRPOConfig(reference_kl_enabled=True, reference_kl_coef=0.05, num_turns=1)
    assert c.beta == 0.05
    assert reinforce.MAGRPOConfig(reference_kl_coef=0.05, num_turns=1).beta == 0.0  # off unless enabled, as there
    c = reinforce.MAGRPOConfig(parallel_training="mp", agent_devices=["cpu", "cpu"], num_turns=1)
    assert c.agent_devices == ["cpu", "cpu"]
    assert reinforce.MAGRPOConfig(parallel_training="none", agent_devices=["cpu"], num_turns=1).device == "cpu"
    # unset fields take the reference's defaults, its loss and optimizer; fields of ours given win
    c = reinforce.MAGRPOConfig(rollout_buffer_size=2, learning_rate=3e-4, temperature=0.9)
    assert (c.learning_rate, c.temperature, c.top_p, c.top_k, c.num_turns, c.discount) == (3e-4, 0.9, 0.6, 50, 2, 1.0)
    assert (c.loss_type, c.max_grad_norm, c.weight_decay, c.termination_threshold) == ("seq_sum", 0.0, 0.01, -0.2)
    assert ours.MAGRPOConfig().temperature == 1.0  # our own names only: our defaults
    assert reinforce.MAGRPOConfig().temperature == 0.6  # the reference's import path: its defaults
    assert reinforce.MAREINFORCEConfig(num_turns=1).advantage_mode == "none"
    # actor-critic: TD(0) targets, value clipping only on a head sharing the actor, critic lr None = the actor's
    c = actor_critic.IACConfig(rollout_buffer_size=4, num_turns=1, use_separate_critic=False, critic_learning_rate=None)
    assert (c.per_device_train_batch_size, c.value_clip, c.gae_lambda, c.num_generations) == (4, 0.2, 0.0, 1)
    assert c.critic_learning_rate == c.learning_rate == 5e-6
    assert actor_critic.MAACConfig(rollout_buffer_size=4, num_turns=1).value_clip is None


def test_reference_preference_fields_take_the_reference_meaning():
    preference = importlib.import_module("comlrl.trainers.preference")
    c = preference.MADPOConfig(
        preference_num_candidates=4, preference_pairs_per_sample=3, dpo_beta=0.3, train_batch_size=5
    )
    assert (c.num_generations, c.pairs_per_prompt, c.beta, c.per_device_train_batch_size) == (4, 3, 0.3, 5)
    assert (c.reference_free, c.num_rounds, c.prompts_per_round, c.steps_per_round) == (True, 1, None, None)
    m = preference.MARLHFConfig(rl_algorithm="maac", reward_freeze_backbone=False, critic_type="q", num_turns=1)
    assert m.reward_model_training == "full" and m.rl_args["critic_type"] == "q" and m.rl_args["gae_lambda"] == 0.0
    m = preference.MARLHFConfig(reward_max_length=None, rl_args={"beta": 0.5, "advantage_mode": "loo"})
    assert m.rl_args["beta"] == 0.5 and m.rl_args["advantage_mode"] == "loo"  # the caller's rl_args win, key by key
    assert m.rl_args["scale_rewards"] == "standardize" and m.reward_model_max_length == 1024
    it = preference.MADPOIterConfig(preference_replay_mode="lambda_decay", preference_replay_lambda=0.25)
    assert (it.replay, it.replay_decay, it.num_rounds, it.comparator) == ("decay", 0.25, 6, "current")
    it = preference.MADPOIterConfig(
        comparator_policy="model", comparator_agents=["m", "m"], comparator_generation_mode="centralized"
    )
    assert (it.comparator, it.comparator_model, it.comparator_generation) == ("model", "m", "centralized")
    with pytest.raises(ConfigError, match="comparator_api_key="):
        preference.MADPOIterConfig(comparator_api_key="sk-123")
    with pytest.raises(ConfigError, match="collaboration_mode='centralized'"):
        preference.MADPOConfig(collaboration_mode="centralized")
    with pytest.raises(ConfigError, match="comparator_agents=.*one source"):
        preference.MADPOIterConfig(comparator_policy="model", comparator_agents=["a", "b"])


def test_reference_field_errors_name_the_field():
    reinforce = importlib.import_module("comlrl.trainers.reinforce")
    actor_critic = importlib.import_module("comlrl.trainers.actor_critic")
    with pytest.raises(ConfigError, match="per_device_train_batch_size=3 is given too"):
        reinforce.MAGRPOConfig(rollout_buffer_size=4, per_device_train_batch_size=3)
    with pytest.raises(ConfigError, match="Did you mean 'rollout_buffer_size'"):
        reinforce.MAGRPOConfig(rollout_bufer_size=4)
    with pytest.raises(ConfigError, match="parallel_training='mp' needs agent_devices"):
        reinforce.MAGRPOConfig(parallel_training="mp", num_turns=1)
    with pytest.raises(ConfigError, match="parallel_training='dp'"):
        reinforce.MAGRPOConfig(parallel_training="dp", num_turns=1)
    with pytest.raises(ConfigError, match="value_head_hidden_dim=64: comlrl's value head is one linear layer"):
        actor_critic.IACConfig(value_head_hidden_dim=64, num_turns=1)
    with pytest.raises(ConfigError, match="rollout_buffer_size=0"):
        reinforce.MAGRPOConfig(rollout_buffer_size=0)


def test_a_native_config_refuses_reference_fields_naming_the_path_that_takes_them():
    with pytest.raises(
        ConfigError,
        match=r"^MAGRPOConfig: rollout_buffer_size is a field of the reference library's MAGRPOConfig: import it from "
        r"comlrl.trainers.reinforce, or use our per_device_train_batch_size",
    ):
        comlrl.MAGRPOConfig(rollout_buffer_size=8)
    cases = [
        (ours.MAReMaxConfig, {"advantage_normalization": False}, "MAReMaxConfig: import it from comlrl.trainers.reinforce"),
        (ours.IACConfig, {"value_clip_range": 0.2}, "IACConfig: import it from comlrl.trainers.actor_critic, or use our value_clip"),
        (ours.MAACConfig, {"eval_interval": 4}, "MAACConfig: import it from comlrl.trainers.actor_critic, or use our eval_steps"),
        (ours.MADPOConfig, {"dpo_beta": 0.2}, "MADPOConfig: import it from comlrl.trainers.preference, or use our beta"),
        (ours.MADPOConfig, {"num_iterations": 3}, "MADPOIterConfig: import it from comlrl.trainers.preference, or use our num_rounds"),
        (ours.MARLHFConfig, {"reward_learning_rate": 1e-4}, "use our reward_model_learning_rate"),
        (ours.MAGRPOConfig, {"reference_devices": "cpu"}, "import it from comlrl.trainers.reinforce .*has no effect here"),
    ]  # fmt: skip
    for cls, kwargs, message in cases:
        with pytest.raises(ConfigError, match=message):
            cls(**kwargs)
    # a native config keeps its meaning: our defaults, our reward call, no reference field to read back
    c = comlrl.MAGRPOConfig(num_turns=1)
    assert c.temperature == 1.0 and c.loss_type != "seq_sum" and not is_compat_style(c)
    assert not hasattr(c, "rollout_buffer_size")
    with pytest.raises(ConfigError, match="unknown field 'rolout_buffer_size'"):
        comlrl.MAGRPOConfig(rolout_buffer_size=8)


def test_the_core_configs_do_not_import_the_compat_layer():
    import grimp

    graph = grimp.build_graph("comlrl")
    chain = graph.find_shortest_chain(importer="comlrl.configs.fields", imported="comlrl.compat.fields")
    assert chain is None, f"the core configs reach the compat layer: {' -> '.join(chain)}"
    assert not graph.chain_exists(importer="comlrl.configs", imported="comlrl.compat", as_packages=True)


def test_a_native_config_refuses_reference_fields_with_only_the_configs_imported():
    import subprocess
    import sys

    script = (
        "from comlrl.configs import IACConfig\n"
        "from comlrl.errors import ConfigError\n"
        "try:\n"
        "    IACConfig(value_clip_range=0.2)\n"
        "except ConfigError as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    assert "import it from comlrl.trainers.actor_critic, or use our value_clip" in out, out


def test_only_a_compat_style_config_changes_the_reward_call_and_eval_keys_and_marlhf_carries_it():
    from types import SimpleNamespace

    from comlrl.trainers.marlhf import rl_config

    reinforce = importlib.import_module("comlrl.trainers.reinforce")
    preference = importlib.import_module("comlrl.trainers.preference")

    def reward(*completions, prompts=None):
        return [len(prompts)] * len(completions[0])

    episode = SimpleNamespace(turns=[SimpleNamespace(rewards=torch.tensor([[1.0]]), children=torch.tensor([[-1]]))])
    for config, compat in ((reinforce.MAGRPOConfig(num_turns=1), True), (ours.MAGRPOConfig(num_turns=1), False)):
        hooks = compat_hooks("MAGRPOTrainer", config, {}, ["model"])
        assert hooks.compat_style is compat and hooks.reward(None) is None
        # the reference passes agent 0's prompts (2 rows), ours every agent's prompt list (3 agents here)
        assert hooks.reward(reward)(["a", "b"], prompts=[["p", "q"]] * 3) == ([2, 2] if compat else [3, 3])
        assert ("eval/turn_1/reward_mean" in hooks.turn_metrics([episode], 1)) is compat
    marlhf = dict(rl_algorithm="magrpo", num_turns=1)
    assert is_compat_style(rl_config(preference.MARLHFConfig(**marlhf)))
    assert not is_compat_style(rl_config(ours.MARLHFConfig(**marlhf)))


def test_reference_path_defaults_and_critic_learning_rate_none():
    actor_critic = importlib.import_module("comlrl.trainers.actor_critic")
    preference = importlib.import_module("comlrl.trainers.preference")
    iac = actor_critic.IACConfig(critic_learning_rate=None, agent_learning_rate=3e-4)  # None: the agents' rate
    assert iac.critic_learning_rate == iac.learning_rate == 3e-4 and is_compat_style(iac)
    assert (iac.num_turns, iac.num_generations, iac.num_train_epochs, iac.gae_lambda) == (2, 1, 40, 0.0)
    maac = actor_critic.MAACConfig()
    assert (maac.num_turns, maac.num_generations, maac.temperature) == (2, 1, 0.6)
    assert preference.MADPOConfig().num_train_epochs == 20 and preference.MARLHFConfig().num_train_epochs == 20
    assert (comlrl.IACConfig().num_turns, comlrl.MADPOConfig().num_train_epochs) == (1, 1)  # ours: our defaults


def test_reference_fields_read_back_as_given_or_defaulted():
    import copy
    import pickle

    from comlrl.configs.fields import own_field

    reinforce = importlib.import_module("comlrl.trainers.reinforce")
    actor_critic = importlib.import_module("comlrl.trainers.actor_critic")
    preference = importlib.import_module("comlrl.trainers.preference")
    c = reinforce.MAGRPOConfig(rollout_buffer_size=8, advantage_normalization=False, top_k=None, num_turns=1)
    assert (c.rollout_buffer_size, c.train_batch_size, c.advantage_normalization) == (8, None, False)
    assert c.eval_interval == 16  # unset: the reference's default
    assert c.top_k == 0 and c.num_turns == 1  # a reference name that is a field of ours too reads ours
    d = preference.MADPOConfig(dpo_beta=0.3)
    assert (d.dpo_beta, d.beta, d.preference_num_candidates, d.use_environment_step) == (0.3, 0.3, 80, True)
    it = preference.MADPOIterConfig(num_iterations=3)
    assert (it.num_iterations, it.num_rounds, it.preference_replay_dir, it.comparator_policy) == (3, 3, None, "current")
    # the loop reads only fields of ours: here num_iterations is the reference's rounds, not our optimizer passes
    assert own_field(it, "num_iterations", 1) == 1 and own_field(c, "joint_mode", None) == "align"
    iac = actor_critic.IACConfig(value_clip_range=0.1)
    assert (iac.value_clip_range, iac.critic_devices, iac.rollout_buffer_size) == (0.1, None, 8)
    assert copy.deepcopy(c).rollout_buffer_size == 8 and pickle.loads(pickle.dumps(it)).num_iterations == 3
    with pytest.raises(AttributeError, match="rollout_bufer_size"):
        c.rollout_bufer_size  # noqa: B018  (the attribute read is what raises)


def test_reference_eval_keys_average_each_turn_and_the_return_from_it():
    from types import SimpleNamespace

    from comlrl.compat.keywords import compat_turn_metrics

    def episode(*turns):
        return SimpleNamespace(
            turns=[SimpleNamespace(rewards=torch.tensor(r), children=torch.tensor(c)) for r, c in turns]
        )

    # two rows, one joint action each; row 2's episode ends after turn 1 (its later turns count 0 in the return)
    ended = episode(([[1.0], [2.0]], [[0], [-1]]), ([[3.0]], [[-1]]))
    # one row, two joint actions, each with its own next turn: each weighs half of the row
    split = episode(([[1.0, 3.0]], [[0, 1]]), ([[2.0], [4.0]], [[-1], [-1]]))
    assert compat_turn_metrics([ended], 2) == {
        "eval/turn_1/reward_mean": 1.5,
        "eval/turn_1/expected_return": 3.0,
        "eval/turn_2/reward_mean": 3.0,
        "eval/turn_2/expected_return": 1.5,
    }
    m = compat_turn_metrics([split], 3)
    assert (m["eval/turn_1/reward_mean"], m["eval/turn_1/expected_return"]) == (2.0, 5.0)
    assert (m["eval/turn_2/reward_mean"], m["eval/turn_2/expected_return"]) == (3.0, 3.0)
    assert (m["eval/turn_3/reward_mean"], m["eval/turn_3/expected_return"]) == (0.0, 0.0)  # no turn 3 played
    both = compat_turn_metrics([ended, split], 2)  # batches merge per row
    assert both["eval/turn_1/expected_return"] == pytest.approx((3.0 * 2 + 5.0) / 3)


def test_each_translation_logs_one_line_on_first_use(caplog):
    compat_fields._logged.clear()
    reinforce = importlib.import_module("comlrl.trainers.reinforce")
    with caplog.at_level(logging.INFO, logger="comlrl.compat"):
        reinforce.MARLOOConfig(eval_interval=3, num_turns=1)
        reinforce.MARLOOConfig(eval_interval=5, num_turns=1)
    lines = [r.getMessage() for r in caplog.records if "eval_interval" in r.getMessage() and "->" in r.getMessage()]
    assert len(lines) == 1 and "eval_interval=3" in lines[0] and "eval_steps" in lines[0]
    assert sum("in the style of comlrl 1.4.3" in r.getMessage() for r in caplog.records) == 1


def test_reference_trainer_keywords_translate_or_fail_clearly():
    args = ours.MAGRPOConfig(num_turns=1, report_to=[])
    hooks = compat_hooks(
        "MAGRPOTrainer",
        args,
        {
            "model_config": {"torch_dtype": "bfloat16", "special_tokens": {"pad_token": "<pad>"}},
            "wandb_config": {"project": "p", "run_name": "r", "tags": ["a"], "config_sections": {"dataset": {"x": 1}}},
            "dataset_type": "humaneval",
        },
        ["model"],
    )
    assert args.bf16 is True and args.report_to == ["wandb"] and hooks.special_tokens == {"pad_token": "<pad>"}
    assert hooks.wandb_init == {"project": "p", "name": "r", "tags": ["a"], "config": {"dataset": {"x": 1}}}
    with pytest.raises(TypeError, match="unexpected keyword argument 'eval_loger'.*Did you mean 'eval_logger'"):
        compat_hooks("MAGRPOTrainer", args, {"eval_loger": print}, ["model"])
    with pytest.raises(ConfigError, match="eval_logger and eval_aggregator work as a pair"):
        compat_hooks("MAGRPOTrainer", args, {"eval_logger": print}, ["model"])
    with pytest.raises(ConfigError, match="torch_dtype='float16'"):
        compat_hooks("MAGRPOTrainer", args, {"model_config": {"torch_dtype": "float16"}}, ["model"])


# ---------------------------------------------------------------- reference-style scripts on a tiny model
ROWS = [{"prompt": f"Task {i}: say something.", "test": f"assert f({i})", "entry_point": "f"} for i in range(3)]


def _moved(trainer, source):
    from transformers import AutoModelForCausalLM

    start = AutoModelForCausalLM.from_pretrained(source).state_dict()
    return all(
        any(not torch.equal(p.detach(), start[n]) for n, p in a.model.named_parameters()) for a in trainer.agents
    )


def _metrics(trainer):
    return [json.loads(line) for line in (Path(trainer.args.output_dir) / "metrics.jsonl").read_text().splitlines()]


def test_reference_magrpo_multi_turn_script(tiny_dir, tmp_path):
    # --- written as for the reference library (its import paths, field names and keywords) ---
    from transformers import AutoTokenizer

    from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer
    from comlrl.utils.reward_processor import RewardProcessors

    seen = []  # the prompt (agent 0's, as the reference passes it) of each joint action the reward scores

    def reward_func(completion1, completion2, batch_items=None, prompts=None):
        assert len(batch_items) == len(prompts) == len(completion1) == 1 and isinstance(prompts[0], str)
        seen.append(prompts[0])
        return [float(len(completion1[0]) % 2)]

    def external_transition(
        prompt, agent_completions, num_agents, prompt_history_per_agent, response_history_per_agent
    ):
        return [f"Improve: {c[:5]}" for c in agent_completions]

    def eval_logger(agent_completions_turns, batch_items, prompts):
        return [
            {"turns": len(agent_completions_turns[0][k]), "row": r["entry_point"]} for k, r in enumerate(batch_items)
        ]

    def eval_aggregator(metrics, num_turns):
        return {"turn_1/rows": len(metrics), "turn_1/turns_seen": sum(m["turns"] for m in metrics) / len(metrics)}

    args = MAGRPOConfig(
        output_dir=str(tmp_path / "run"),
        num_agents=2,
        num_generations=2,
        num_turns=2,
        max_new_tokens=5,
        num_train_epochs=1,
        agent_learning_rate=1e-2,
        rollout_buffer_size=3,
        train_batch_size=3,
        early_termination_threshold=None,
        external_prompt_passthrough=False,
        eval_interval=2,
        eval_num_samples=2,
        eval_batch_size=2,
        logging_steps=1,
    )
    trainer = MAGRPOTrainer(
        agent_model=tiny_dir,
        num_agents=2,
        tokenizer=AutoTokenizer.from_pretrained(tiny_dir),
        model_config={"torch_dtype": "float32"},
        train_dataset=ROWS,
        eval_dataset=ROWS,
        reward_func=reward_func,
        reward_processor=RewardProcessors.shift(10.0),
        formatters=[lambda item: f"A: {item['prompt']}", lambda item: f"B: {item['prompt']}"],
        external_transition=external_transition,
        eval_logger=eval_logger,
        eval_aggregator=eval_aggregator,
        dataset_type="toy",
        args=args,
    )
    trainer.train()
    # --- what each mapped field did ---
    metrics = _metrics(trainer)
    # rollout_buffer_size = train_batch_size = 3 nodes = one row's tree (1 + G nodes): one row per step
    assert trainer.args.per_device_train_batch_size == 1 and trainer.state["step"] == len(ROWS)
    # external_prompt_passthrough=False: the transition's prompt went through the agent's formatter
    later = [p for p in seen if "Improve:" in p]
    assert later and all(p.startswith("A: Improve: ") for p in later)
    # no early termination: every joint action got a second turn (G root joint actions -> G children, G each)
    assert len(later) == len(ROWS) * 2 * 2 + 2  # G x G second-turn joint actions per row, + one eval of 2 paths
    # reward_processor shifted the 0/1 reward; advantage_normalization standardized it; the agents learned
    rewards = [m["reward/mean"] for m in metrics if "reward/mean" in m]
    assert len(rewards) == 3 and all(10.0 <= r <= 11.0 for r in rewards)
    assert trainer.args.scale_rewards == "standardize" and _moved(trainer, tiny_dir)
    # eval_interval=2 steps, eval_num_samples=2 rows: the aggregator's metrics under eval/
    evals = [m for m in metrics if "eval/turn_1/rows" in m]
    assert [m["step"] for m in evals] == [2] and evals[0]["eval/turn_1/rows"] == 2.0
    assert evals[0]["eval/turn_1/turns_seen"] == 2.0  # the evaluated path played both turns
    # the reference's per-turn keys: turn t's mean reward, and the reward sum from turn t on (one path per row)
    e = evals[0]
    turn_1, turn_2 = e["eval/turn_1/reward_mean"], e["eval/turn_2/reward_mean"]
    assert e["eval/turn_1/expected_return"] == pytest.approx(turn_1 + turn_2)
    assert e["eval/turn_2/expected_return"] == pytest.approx(turn_2) and 10.0 <= turn_2 <= 11.0


def test_reference_early_termination_stops_a_node(tiny_dir, tmp_path):
    from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer

    turns = []

    def reward_func(a, b, batch_items=None, prompts=None):
        turns.extend("Next" in p for p in prompts)
        return [0.0] * len(a)

    def run(threshold):
        turns.clear()
        args = MAGRPOConfig(
            output_dir=str(tmp_path / f"run{threshold}"),
            num_generations=2,
            max_new_tokens=4,
            rollout_buffer_size=3,
            num_train_epochs=1,
            early_termination_threshold=threshold,
            external_prompt_passthrough=True,
            eval_interval=0,
        )
        trainer = MAGRPOTrainer(
            agent_model=tiny_dir,
            reward_func=reward_func,
            external_transition=lambda agent_completions, **kw: ["Next"] * 2,
            train_dataset=ROWS[:1],
            args=args,
        )
        trainer.train()
        return sum(turns)

    assert run(-0.2) == 0  # mean reward 0 > -0.2: the root node stops expanding (the reference's default)
    assert run(0.0) == 4  # 0 is not > 0: the G = 2 joint actions each get a child, whose G joint actions are scored


def test_reference_iac_and_maac_scripts(tiny_dir, tmp_path):
    from comlrl.trainers.actor_critic import IACConfig, IACTrainer, MAACConfig, MAACTrainer

    def reward_func(c1, c2):
        return [float(len(a)) / 10 for a in c1]

    calls = []

    def metrics_callback(rollouts):
        calls.append(rollouts)
        return {"mean_completion_chars": sum(len(r.completion) for r in rollouts) / len(rollouts)}

    for config_cls, trainer_cls, extra in (
        (IACConfig, IACTrainer, {"value_clip_range": 0.2, "critic_learning_rate": None}),
        (MAACConfig, MAACTrainer, {"critic_type": "q"}),
    ):
        calls.clear()
        args = config_cls(
            output_dir=str(tmp_path / trainer_cls.__name__),
            num_agents=2,
            num_turns=1,
            num_generations=2,
            max_new_tokens=4,
            num_train_epochs=1,
            rollout_buffer_size=4,
            agent_learning_rate=1e-3,
            use_separate_critic=True,
            eval_interval=0,
            **extra,
        )
        trainer = trainer_cls(
            agent_model=tiny_dir,
            critic_model=tiny_dir,
            reward_func=reward_func,
            formatters=[lambda item: item["prompt"]] * 2,
            args=args,
            train_dataset=ROWS[:2],
            metrics_callback=metrics_callback,
        )
        trainer.train()
        metrics = _metrics(trainer)
        # rollout_buffer_size=4 samples, 2 per row (G = 2, one turn): both rows in one step
        assert trainer.args.per_device_train_batch_size == 2 and trainer.state["step"] == 1
        assert trainer.args.normalize_advantages and trainer.args.gae_lambda == 0.0
        assert len(calls) == 1 and len(calls[0]) == 2 * 2 * 2  # agents x rows x samples, each a RolloutSample
        first = calls[0][0]
        assert first.agent_idx == 0 and first.metadata["turn_idx"] == 0 and isinstance(first.reward, torch.Tensor)
        assert _moved(trainer, tiny_dir)
        assert metrics[0]["mean_completion_chars"] == pytest.approx(
            sum(len(r.completion) for r in calls[0]) / len(calls[0])
        )
        scores = trainer.evaluate(eval_dataset=ROWS[:1])  # the reference's per-turn keys too
        assert scores["eval/turn_1/reward_mean"] == pytest.approx(scores["eval/reward/mean"])
        assert scores["eval/turn_1/expected_return"] == pytest.approx(scores["eval/reward/mean"])


def _len_reward(c1, c2):
    return [float(len(c1[0]) + 2 * len(c2[0]))]


def test_reference_madpo_script(tiny_dir, tmp_path):
    from comlrl.trainers.preference import MADPOConfig, MADPOTrainer, read_jsonl, shard_path

    args = MADPOConfig(
        output_dir=str(tmp_path / "madpo"),
        num_agents=2,
        num_train_epochs=2,
        agent_learning_rate=1e-3,
        max_new_tokens=5,
        preference_num_candidates=3,
        preference_pairs_per_sample=2,
        pair_selection="reward_gap",
        dpo_beta=0.2,
        rollout_buffer_size=2,
        eval_interval=0,
        logging_steps=1,
    )
    trainer = MADPOTrainer(
        agent_model=tiny_dir,
        num_agents=2,
        train_dataset=ROWS,
        reward_func=_len_reward,
        formatters=[lambda item: item["prompt"]] * 2,
        model_config={},
        wandb_config=None,
        args=args,
    )
    trainer.train()
    pairs = read_jsonl(shard_path(args.output_dir, 0))
    # one round over every row, 3 candidates each, at most 2 pairs per prompt, the largest gaps
    assert trainer.args.num_generations == 3 and trainer.args.reference_free and trainer.args.beta == 0.2
    assert {p["row"] for p in pairs} <= set(range(len(ROWS))) and all(
        p["chosen_reward"] > p["rejected_reward"] for p in pairs
    )
    by_row = {r: [p for p in pairs if p["row"] == r] for r in range(len(ROWS))}
    assert all(len(v) <= 2 for v in by_row.values())
    # num_train_epochs=2 passes over 3 rows x 2 pair slots, 2 pairs per step (train_batch_size = the buffer)
    assert trainer.state["step"] == 6 and _moved(trainer, tiny_dir)


def test_reference_marlhf_script(tiny_dir, tmp_path):
    from comlrl.trainers.preference import MARLHFConfig, MARLHFTrainer

    args = MARLHFConfig(
        output_dir=str(tmp_path / "marlhf"),
        num_agents=2,
        rl_algorithm="magrpo",
        num_generations=2,
        preference_num_candidates=3,
        preference_pairs_per_sample=2,
        reward_learning_rate=1e-3,
        reward_num_train_epochs=1,
        reward_train_batch_size=2,
        reward_freeze_backbone=True,
        num_train_epochs=1,
        max_new_tokens=5,
        agent_learning_rate=1e-3,
        eval_interval=0,
        advantage_normalization=True,
    )
    trainer = MARLHFTrainer(agent_model=tiny_dir, num_agents=2, reward_func=_len_reward, train_dataset=ROWS, args=args)
    out = trainer.train()
    a = trainer.args
    assert (a.candidates_per_prompt, a.pairs_per_prompt, a.preference_prompts) == (3, 2, None)
    assert (a.reward_model_training, a.reward_model_learning_rate, a.reward_model_batch_size) == ("head", 1e-3, 2)
    assert a.reward_model_normalize is False  # the reference's stage 3 reads the raw score
    rl = trainer.rl.args  # stage 3: the reference's MAGRPO (standardized advantages, its loss, 2 rows per step)
    assert (rl.scale_rewards, rl.loss_type, rl.per_device_train_batch_size) == ("standardize", "seq_sum", 2)
    assert out["reward_model"]["reward_model/pairs"] + out["reward_model"]["reward_model/eval_pairs"] > 0
    assert trainer.rl.state["step"] == 2 and _moved(trainer.rl, tiny_dir)
    # trainer.reward_model is the reward module, as there; its tokenizer is trainer.reward_tokenizer
    assert isinstance(trainer.reward_model, torch.nn.Module) and "head.weight" in trainer.reward_model.state_dict()
    assert trainer.reward_tokenizer("a joint answer")["input_ids"]


def test_reference_iterative_madpo_script(tiny_dir, tmp_path):
    from comlrl.trainers.preference import MADPOIterConfig, MADPOIterTrainer, read_jsonl, shard_path

    args = MADPOIterConfig(
        output_dir=str(tmp_path / "iter"),
        num_agents=2,
        num_iterations=2,
        num_train_epochs=1,
        agent_learning_rate=1e-3,
        max_new_tokens=5,
        preference_num_candidates=2,
        preference_pairs_per_sample=1,
        comparator_policy="history",
        comparator_history_k=1,
        preference_replay_mode="nearest_k",
        preference_replay_k=2,
        rollout_buffer_size=3,
        eval_interval=0,
    )
    trainer = MADPOIterTrainer(
        agent_model=tiny_dir, num_agents=2, train_dataset=ROWS, reward_func=_len_reward, args=args
    )
    metrics = trainer.train()
    a = trainer.args
    assert (a.num_rounds, a.comparator, a.comparator_lag, a.replay, a.replay_k) == (2, "history", 1, "last_k", 2)
    assert a.pair_selection == "comparator_reward"
    # each round: every row, one pair per prompt across the team and its snapshot, one pass (3 pairs / 3 per step)
    assert trainer.state["step"] == 2
    for r in (0, 1):
        pairs = read_jsonl(shard_path(a.output_dir, r))
        assert 0 < len(pairs) <= len(ROWS)
    rows = trainer.history  # logging_steps=50 (the reference's default) wrote no line in 2 steps
    assert rows[-1]["pairs/pool"] > rows[0]["pairs/pool"]  # round 1 also draws from round 0's pairs (k = 2)
    assert metrics is not None and _moved(trainer, tiny_dir)


def test_reference_wandb_config_reaches_wandb_init(tiny_dir, tmp_path, monkeypatch):
    import sys
    import types

    calls: dict = {"log": []}

    class Run:
        def log(self, metrics, step=None):
            calls["log"].append((step, metrics))

        def finish(self):
            calls["finished"] = True

    stub = types.ModuleType("wandb")
    stub.init = lambda **kw: calls.update(init=kw) or Run()
    monkeypatch.setitem(sys.modules, "wandb", stub)
    from comlrl.trainers.reinforce import MAGRPOTrainer

    trainer = MAGRPOTrainer(
        agent_model=tiny_dir,
        reward_func=_len_reward,
        train_dataset=ROWS[:2],
        wandb_config={"project": "p", "entity": "e", "name": "n", "tags": ["t"], "config_sections": {"data": {"k": 1}}},
        args=ours.MAGRPOConfig(
            output_dir=str(tmp_path / "w"), max_steps=1, num_generations=2, max_new_tokens=3, logging_steps=1
        ),
    )
    trainer.train()
    init = calls["init"]
    assert (init["project"], init["entity"], init["name"], init["tags"]) == ("p", "e", "n", ["t"])
    assert init["config"]["data"] == {"k": 1} and init["config"]["max_steps"] == 1  # its sections and our config
    assert calls["log"] and calls["log"][0][0] == 1 and "reward/mean" in calls["log"][0][1]


# ---------------------------------------------------------------- where a reference-style run differs from ours
def test_reference_style_runs_keep_the_data_order_and_sample_in_evaluation():
    reinforce = importlib.import_module("comlrl.trainers.reinforce")
    actor_critic = importlib.import_module("comlrl.trainers.actor_critic")
    preference = importlib.import_module("comlrl.trainers.preference")
    # the reference's data loaders never shuffle the rows, and evaluate() samples one answer per agent at the run's
    # temperature / top_p / top_k
    for c in (
        reinforce.MAGRPOConfig(num_turns=1),
        actor_critic.IACConfig(rollout_buffer_size=4, num_turns=1),
        actor_critic.MAACConfig(rollout_buffer_size=4, num_turns=1),
        preference.MARLHFConfig(rl_algorithm="magrpo", preference_num_candidates=3),
    ):
        assert c.shuffle is False, type(c).__name__
        assert (c.eval_do_sample, c.eval_temperature, c.eval_num_generations) == (True, 0.6, 1), type(c).__name__
    c = reinforce.MAGRPOConfig(num_turns=1, temperature=0.9)
    assert c.eval_temperature == 0.9  # follows the run's temperature
    assert reinforce.MAGRPOConfig(num_turns=1, temperature=0.9, eval_temperature=0.3).eval_temperature == 0.3
    # MADPO: the reference shuffles its pairs every epoch, which our shuffle does to the pair pool
    c = preference.MADPOConfig(preference_num_candidates=3, rollout_buffer_size=2)
    assert (c.shuffle, c.eval_do_sample, c.eval_temperature) == (True, True, 0.6)
    assert (ours.MAGRPOConfig().shuffle, ours.MAGRPOConfig().eval_do_sample) == (True, False)  # ours: unchanged


def test_reference_style_trainer_reads_rows_in_order_and_evaluates_by_sampling(tiny_dir, tmp_path):
    from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer

    args = MAGRPOConfig(
        output_dir=str(tmp_path / "order"), num_turns=1, num_generations=2, max_new_tokens=3, rollout_buffer_size=1
    )
    trainer = MAGRPOTrainer(agent_model=tiny_dir, reward_func=_len_reward, train_dataset=ROWS, args=args)
    batches = trainer._batches()
    assert [next(batches)[1] for _ in range(2 * len(ROWS))] == [[0], [1], [2]] * 2  # every epoch in dataset order
    s = trainer.generation_settings(train=False)
    assert (s.do_sample, s.temperature, s.top_p, s.top_k) == (True, 0.6, 0.6, 50)


def test_cross_credit_sums_or_averages_the_joint_returns():
    from comlrl.algorithms.advantages import cross_credit
    from comlrl.rollout.episode import Episode, Turn, episode_advantages

    joint = torch.tensor([[[1.0, 2.0], [3.0, 4.0]]])  # one node, G = 2, agent 0 on axis 1, agent 1 on axis 2
    assert cross_credit(joint, 0).tolist() == [[1.5, 3.5]] and cross_credit(joint, 1).tolist() == [[2.0, 3.0]]
    assert cross_credit(joint, 0, "sum").tolist() == [[3.0, 7.0]] and cross_credit(joint, 1, "sum").tolist() == [
        [4.0, 6.0]
    ]
    with pytest.raises(ValueError, match="credit 'max'"):
        cross_credit(joint, 0, "max")
    # joint actions in (agent 0, agent 1) order: (0, 0), (0, 1), (1, 0), (1, 1)
    turn = Turn(nodes=[], samples=[], rewards=torch.tensor([[1.0, 2.0, 3.0, 4.0]]), children=torch.full((1, 4), -1))
    episode = Episode([turn])
    mean = episode_advantages(episode, 2, 2, joint_mode="cross", mode="mean")
    total = episode_advantages(episode, 2, 2, joint_mode="cross", mode="mean", credit="sum")
    assert mean[0][0].tolist() == [-1.0, 1.0] and total[0][0].tolist() == [-2.0, 2.0]  # [3, 7] - 5
    assert mean[1][0].tolist() == [-0.5, 0.5] and total[1][0].tolist() == [-1.0, 1.0]  # [4, 6] - 5
    standardized = episode_advantages(episode, 2, 2, joint_mode="cross", mode="mean", scale="standardize")
    summed = episode_advantages(episode, 2, 2, joint_mode="cross", mode="mean", scale="standardize", credit="sum")
    assert torch.allclose(standardized[0][0], summed[0][0])  # the same under the reference's normalization


def test_reference_cross_mode_sums_credit_and_maps_crossed(tiny_dir, tmp_path):
    reinforce = importlib.import_module("comlrl.trainers.reinforce")
    for spelling in ("cross", "crossed", "Crossed"):
        c = reinforce.MAGRPOConfig(joint_mode=spelling, num_turns=1)
        assert (c.joint_mode, c.cross_credit) == ("cross", "sum"), spelling
    # 'crossed' counts tree nodes as 'cross' does: G^N = 4 children of the root, 5 nodes per row
    c = reinforce.MAGRPOConfig(joint_mode="crossed", num_generations=2, rollout_buffer_size=5)
    assert c.per_device_train_batch_size == 1
    assert ours.MAGRPOConfig(joint_mode="cross").cross_credit == "mean"  # ours: unchanged
    with pytest.raises(ConfigError, match="joint_mode='crossed'"):
        ours.MAGRPOConfig(joint_mode="crossed")
    with pytest.raises(ConfigError, match="cross_credit='max'"):
        ours.MAGRPOConfig(cross_credit="max")
    from comlrl.rollout.episode import Episode, Turn

    trainer = reinforce.MAGRPOTrainer(
        agent_model=tiny_dir,
        reward_func=_len_reward,
        train_dataset=ROWS,
        args=reinforce.MAGRPOConfig(
            output_dir=str(tmp_path / "cross"),
            joint_mode="crossed",
            num_turns=1,
            num_generations=2,
            max_new_tokens=3,
            advantage_normalization=False,
        ),
    )
    turn = Turn(nodes=[], samples=[], rewards=torch.tensor([[1.0, 2.0, 3.0, 4.0]]), children=torch.full((1, 4), -1))
    episode = Episode([turn])
    adv = trainer.compute_advantages(episode, {})
    assert adv[0][0].tolist() == [-2.0, 2.0] and adv[1][0].tolist() == [-1.0, 1.0]  # summed credit, mean baseline


def test_reference_actor_critic_loss_is_a_sequence_sum():
    actor_critic = importlib.import_module("comlrl.trainers.actor_critic")
    preference = importlib.import_module("comlrl.trainers.preference")
    assert actor_critic.IACConfig(rollout_buffer_size=4, num_turns=1).loss_type == "seq_sum"
    assert actor_critic.MAACConfig(rollout_buffer_size=4, num_turns=1).loss_type == "seq_sum"
    marlhf = preference.MARLHFConfig(rl_algorithm="iac", preference_num_candidates=3, num_turns=1)
    assert marlhf.rl_args["loss_type"] == "seq_sum"
    assert ours.IACConfig().loss_type == "token_mean"  # ours: unchanged


def test_reference_shared_critic_trains_the_backbone_with_the_value_loss(tiny_dir, tmp_path):
    from comlrl.trainers.actor_critic import IACConfig, IACTrainer

    c = IACConfig(rollout_buffer_size=2, num_turns=1, use_separate_critic=False, value_loss_coef=0.5)
    assert (c.shared_value_loss_coef, c.value_loss_coef) == (0.5, 0.5)
    c = IACConfig(rollout_buffer_size=2, num_turns=1, use_separate_critic=True)
    assert (c.shared_value_loss_coef, c.value_loss_coef) == (None, 0.6)  # a separate critic: its own AdamW
    assert ours.IACConfig(use_separate_critic=False).shared_value_loss_coef is None  # ours: a head on detached features
    with pytest.raises(ConfigError, match="shared_value_loss_coef=0.5: .*use_separate_critic=False"):
        ours.IACConfig(shared_value_loss_coef=0.5)

    def run(coef):
        args = IACConfig(
            output_dir=str(tmp_path / f"shared{coef}"),
            num_agents=2,
            num_turns=1,
            num_generations=2,
            max_new_tokens=3,
            max_steps=1,
            rollout_buffer_size=2,
            agent_learning_rate=1e-2,
            critic_learning_rate=1e-4,
            use_separate_critic=False,
            value_loss_coef=coef,
            eval_interval=0,
            seed=3,
        )
        trainer = IACTrainer(
            agent_model=tiny_dir,
            reward_func=lambda c1, c2: [float(len(a)) for a in c1],
            train_dataset=ROWS[:1],
            args=args,
        )
        critic = trainer.critics[0]
        head = [p.detach().clone() for p in critic.model.head.parameters()]
        trainer.train()
        moved = any(not torch.equal(a, b) for a, b in zip(head, critic.model.head.parameters()))
        return trainer, critic, moved

    a, critic, moved = run(0.5)
    # the head joins the actor's step at the actor's learning rate (the reference: one AdamW over both)
    assert moved and critic.optimizer.param_groups[0]["lr"] == a.args.learning_rate == 1e-2
    b = run(0.0)[0]
    # coef 0.5 back-propagates the value loss through the actor's backbone: its update differs from coef 0's
    differs = [not torch.equal(p, q) for p, q in zip(a.agents[0].model.parameters(), b.agents[0].model.parameters())]
    assert any(differs)


@pytest.mark.parametrize("name", ["IAC", "MAAC"])
def test_reference_actor_critic_scores_each_group_in_one_call(tiny_dir, tmp_path, name):
    import comlrl.trainers.actor_critic as ac

    calls = []

    def reward_func(c1, c2, prompts=None, batch_items=None):  # each joint answer's rank within its group
        calls.append((list(c1), list(c2), prompts, batch_items))
        return [float(sum(len(b) < len(a) for b in c1)) for a in c1]

    args = getattr(ac, f"{name}Config")(
        output_dir=str(tmp_path / name), num_agents=2, num_turns=1, num_generations=3, max_new_tokens=6,
        rollout_buffer_size=6, eval_interval=0, temperature=1.0, top_k=None,
    )  # fmt: skip
    trainer = getattr(ac, f"{name}Trainer")(
        agent_model=tiny_dir, reward_func=reward_func, formatters=[lambda r: r["prompt"], lambda r: r["prompt"] + "!"],
        args=args, train_dataset=ROWS,
    )  # fmt: skip
    episode = trainer.rollout(
        ROWS[:2],
        [0, 1],
        settings=trainer.generation_settings(train=True),
        num_generations=3,
        reward_func=trainer.reward_func,
    )
    # as the reference's IAC / MAAC: one call per row with each agent's whole group, its prompts and its row
    assert len(calls) == 2 and all(len(c1) == len(c2) == 3 for c1, c2, _, _ in calls)
    for m, (c1, _, prompts, items) in enumerate(calls):
        assert items == [ROWS[m]] and prompts == [ROWS[m]["prompt"], ROWS[m]["prompt"] + "!"]
        assert c1 == episode.turns[0].samples[0].texts[3 * m : 3 * m + 3]
        ranks = [float(sum(len(b) < len(a) for b in c1)) for a in c1]
        assert episode.turns[0].rewards[m].tolist() == ranks
    calls.clear()
    trainer.evaluate(ROWS[:2], num_generations=2)  # evaluation's groups too
    assert len(calls) == 2 and all(len(c1) == 2 for c1, *_ in calls)


def _iterative(tiny_dir, tmp_path, reward, name="iter", **kw):
    from comlrl.trainers.preference import MADPOIterConfig, MADPOIterTrainer

    settings = dict(
        output_dir=str(tmp_path / name), num_agents=2, num_iterations=1, num_train_epochs=1, agent_learning_rate=1e-3,
        max_new_tokens=5, preference_num_candidates=3, rollout_buffer_size=3, eval_interval=0, temperature=1.0,
    )  # fmt: skip
    args = MADPOIterConfig(**{**settings, **kw})
    return MADPOIterTrainer(agent_model=tiny_dir, num_agents=2, train_dataset=ROWS, reward_func=reward, args=args)


def test_reference_iterative_current_comparator_samples_its_own_candidates(tiny_dir, tmp_path):
    from comlrl.trainers.preference import read_jsonl, shard_path

    calls = []

    def reward(c1, c2):
        calls.append((c1, c2))
        return [float(len(c1[0]) + 2 * len(c2[0]))]

    trainer = _iterative(tiny_dir, tmp_path, reward, comparator_policy="current", comparator_num_candidates=2)
    trainer.train()
    # the reference: 3 candidates of the team and 2 more of the current team as the comparator, per row
    assert len(calls) == len(ROWS) * (3 + 2)
    pairs = read_jsonl(shard_path(trainer.args.output_dir, 0))
    assert pairs and all(len([p for p in pairs if p["row"] == r]) <= 2 for r in range(len(ROWS)))
    for p in pairs:  # the team's i-th candidate against the comparator's i-th
        assert {p["chosen_side"], p["rejected_side"]} == {0, 1}
        assert p["chosen_candidate"] == p["rejected_candidate"] < 2 and p["chosen_reward"] > p["rejected_reward"]


def test_reference_preference_replay_dir_files_are_written_and_replayed(tiny_dir, tmp_path):
    from comlrl.trainers.preference import read_jsonl, shard_path

    replay = tmp_path / "replay"
    kw = dict(
        num_iterations=2, preference_replay_dir=str(replay), preference_replay_mode="all_history", save_steps=1,
        preference_pairs_per_sample=1,
    )  # fmt: skip
    first = _iterative(tiny_dir, tmp_path, _len_reward, **kw)
    first.train()
    assert first.steps_per_round == 1  # one step per iteration: checkpoint-1 is the state after iteration 1
    assert sorted(p.name for p in replay.iterdir()) == ["iteration_0001.json", "iteration_0002.json"]
    for r in (0, 1):
        payload = json.loads((replay / f"iteration_{r + 1:04d}.json").read_text())
        pairs = read_jsonl(shard_path(first.args.output_dir, r))
        assert payload["iteration"] == r + 1 and payload["num_pairs"] == len(pairs) == len(payload["pairs"])
        for record, pair in zip(payload["pairs"], pairs):  # the reference's record, read back as ours
            assert record["winner_completions"] == pair["chosen"] and record["loser_completions"] == pair["rejected"]
            assert (record["winner_reward"], record["loser_reward"]) == (pair["chosen_reward"], pair["rejected_reward"])
            assert set(record) >= {"prompts", "candidate_reward_mean", "raw_rewards", "target_raw_reward"}
    # a new trainer, another output_dir, resumed after iteration 1: it replays iteration 1's pairs from the folder
    second = _iterative(tiny_dir, tmp_path, _len_reward, name="second", **kw)
    second.load_checkpoint(str(Path(first.args.output_dir) / "checkpoint-1"))
    second.train()
    assert not shard_path(second.args.output_dir, 0).exists()
    assert second.history[-1]["pairs/pool"] == first.history[-1]["pairs/pool"]
    assert json.loads((replay / "iteration_0002.json").read_text())["num_pairs"] == len(
        read_jsonl(shard_path(second.args.output_dir, 1))
    )
    assert not list(replay.glob("*.tmp"))
    # a file as the reference writes it (texts only) is tokenized on reading, as a dataset pair
    pair = {"prompts": ["Task 0: say something."] * 2, "winner_completions": ["ab", "c"], "loser_completions": ["", "d"]}  # fmt: skip
    (replay / "iteration_0003.json").write_text(json.dumps({"iteration": 3, "num_pairs": 1, "pairs": [pair]}))
    (record,) = second._stored_pairs(Path(second.args.output_dir), 2)
    d = second.agents[1].tokenizer("d", add_special_tokens=False)["input_ids"]
    assert record["chosen"] == ["ab", "c"] and record["rejected_ids"] == [[2], d + [2]]  # each answer ends with EOS
