"""comlrl compare: the bootstrap statistics by hand, then conditions on a tiny model scored on the same rows."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import toy_env
import yaml
from tiny import tiny_model, tiny_tokenizer

from comlrl import envs
from comlrl.algorithms.bootstrap import bootstrap_mean, paired_difference, resample_indices, row_values
from comlrl.cli import main
from comlrl.compare import Condition, compare, parse_condition
from comlrl.envs.core import registry
from comlrl.errors import ComlrlError

# --- the statistics ---------------------------------------------------------------------------------------------


def test_row_values_are_the_mean_of_each_rows_samples():
    assert row_values([[1.0, 0.0], [0.5, 0.5, 0.5], [2.0]]).tolist() == [0.5, 0.5, 2.0]
    with pytest.raises(ValueError, match="row 1 has no samples"):
        row_values([[1.0], []])


def test_mean_and_paired_difference_by_hand():
    a, b = [1.0, 0.0, 0.5, 0.5], [0.0, 0.0, 0.5, 1.5]
    assert bootstrap_mean(a).mean == pytest.approx(0.5)
    diff = paired_difference(a, b)
    assert diff.mean == pytest.approx((1.0 + 0.0 + 0.0 - 1.0) / 4)
    assert diff.low <= diff.mean <= diff.high


def test_two_rows_interval_spans_the_two_values():
    # resampled means of rows {0, 1} take the values 0, 0.5 and 1 with probabilities 1/4, 1/2, 1/4: the 2.5% and
    # 97.5% quantiles of many resamples are 0 and 1
    interval = bootstrap_mean([0.0, 1.0], num_resamples=4000, seed=1)
    assert (interval.mean, interval.low, interval.high) == (0.5, 0.0, 1.0)


def test_bootstrap_with_a_fixed_seed_matches_a_direct_recomputation():
    x = np.array([0.2, 0.9, 0.4, 0.4, 0.0, 1.0, 0.7])
    y = np.array([0.1, 0.5, 0.6, 0.2, 0.0, 0.8, 0.3])
    rng = np.random.default_rng(7)
    idx = rng.integers(0, len(x), size=(500, len(x)))
    means = x[idx].mean(axis=1)
    diffs = (x - y)[idx].mean(axis=1)
    got = bootstrap_mean(x, num_resamples=500, seed=7)
    assert (got.low, got.high) == tuple(np.percentile(means, [2.5, 97.5]))
    d = paired_difference(x, y, num_resamples=500, seed=7)
    assert d.mean == pytest.approx(float((x - y).mean()))
    assert (d.low, d.high) == pytest.approx(tuple(np.percentile(diffs, [2.5, 97.5])), abs=1e-15)
    # the same seed: the same numbers; another seed: other resamples
    assert bootstrap_mean(x, num_resamples=500, seed=7) == got
    assert bootstrap_mean(x, num_resamples=500, seed=8) != got
    assert (resample_indices(len(x), 500, 7) == idx).all()


def test_one_row_and_identical_conditions():
    assert bootstrap_mean([0.3]).as_dict() == {"mean": 0.3, "low": 0.3, "high": 0.3}
    x = [0.1, 0.7, 0.35]
    assert paired_difference(x, x).as_dict() == {"mean": 0.0, "low": 0.0, "high": 0.0}


def test_bad_input_names_the_problem():
    with pytest.raises(ValueError, match="same rows: 2 values against 3"):
        paired_difference([0.0, 1.0], [0.0, 1.0, 2.0])
    with pytest.raises(ValueError, match="row 1 is not finite"):
        bootstrap_mean([0.0, float("nan")])
    with pytest.raises(ValueError, match="non-empty"):
        bootstrap_mean([])


# --- baselines row by row -----------------------------------------------------------------------------------------


def test_baseline_rows_score_each_row_and_count_its_tokens():
    from comlrl.envs.core.baselines import baseline_rows, run_baseline

    with toy_env.registered():
        env = envs.make(toy_env.NAME)
        rows = [{"prompt": "a"}, {"prompt": "bb"}, {"prompt": "ccc"}]

        def generate(agent, prompts):  # agent 1 writes more on longer prompts
            return [p if agent else "x" for p in prompts]

        got = baseline_rows(env, "parallel", generate=generate, rows=rows)
        # agent 1 answers its prompt "<p> More:"; agent 0 answers "x": reward = (len(p) + 6 - 1) / 10
        assert [s["reward"] for s in got.scores] == pytest.approx([0.6, 0.7, 0.8])
        assert [s["level/longer"] for s in got.scores] == [1.0, 1.0, 1.0]
        assert got.answers[0] == ["x", "x", "x"] and got.answers[1][2] == "ccc More:"
        assert got.tokens == [1 + 2, 1 + 2, 1 + 2]  # whitespace tokens of both agents' answers per row
        seq = baseline_rows(env, "sequential", generate=generate, rows=rows)
        assert seq.tokens[0] > got.tokens[0]  # agent 1 echoes a prompt that shows agent 0's answer
        metrics = run_baseline(env, "parallel", generate=generate, rows=rows)  # the aggregate path is unchanged
        assert metrics["reward/mean"] == pytest.approx(0.7) and metrics["tokens/per_task"] == pytest.approx(3.0)


# --- conditions on a tiny model -----------------------------------------------------------------------------------

SPLIT, SplitToy = toy_env.SPLIT_NAME, toy_env.SplitToy


def _config(path, rows, model, **top):
    cfg_path = toy_env.write_config(path, rows, model, max_steps=1, save_steps=0)
    cfg = yaml.safe_load(Path(cfg_path).read_text())
    cfg["env"]["name"] = SPLIT
    cfg["data"]["eval_limit"] = 4
    cfg["evaluation"] = {"before": False, "after": False}
    cfg.update(top)
    Path(cfg_path).write_text(yaml.safe_dump(cfg, sort_keys=False))
    return cfg_path


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A tiny model, a team config and a single-agent config of the split toy env, a trained run of each."""
    registry.register(SPLIT, SplitToy)
    root = tmp_path_factory.mktemp("compare")
    model = root / "model"
    tiny_model().save_pretrained(model)
    tiny_tokenizer().save_pretrained(model)
    rows = toy_env.write_rows(root / "rows.jsonl", n=10)
    team_cfg = _config(root / "team.yaml", rows, str(model))
    # the env's single-agent form: one model writes both parts, the team's reward scores its split answer
    solo_cfg = _config(
        root / "solo.yaml", rows, str(model), num_agents=1, name="solo", env={"name": SPLIT, "format": "single"}
    )
    for cfg, run in ((team_cfg, root / "team-run"), (solo_cfg, root / "solo-run")):
        assert main(["train", cfg, "--set", f"output_dir={run}"]) == 0
    yield {
        "root": root,
        "team_cfg": team_cfg,
        "solo_cfg": solo_cfg,
        "team": root / "team-run",
        "solo": root / "solo-run",
    }
    registry.ENVS.pop(SPLIT, None)


@pytest.fixture(scope="module")
def comparison(setup):
    s = setup
    return compare(
        [
            f"team=run:{s['team']}",
            f"untrained:{s['team_cfg']}",
            f"again=untrained:{s['team_cfg']}",
            f"baseline:parallel@{s['team_cfg']}",
            f"baseline:single@{s['team']}",
            f"solo=run:{s['solo']}",
        ],
        rows=3,
        samples=2,
        temperature=1.0,
        seed=5,
        control="untrained",
        out=s["root"] / "out",
        progress=False,
    )


def _by_row(result, name):
    rows = {}
    for r in result.records:
        if r["condition"] == name:
            rows.setdefault(r["row"], []).append(r)
    return rows


def test_every_condition_answers_the_same_rows(comparison):
    keys = {r["row"]: r["key"] for r in comparison.rows}
    assert sorted(keys) == [0, 1, 2] and len(set(keys.values())) == 3
    for name in comparison.summary:
        rows = _by_row(comparison, name)
        assert sorted(rows) == [0, 1, 2], name
        for row, recs in rows.items():
            assert [r["sample"] for r in recs] == [0, 1], name
            assert {r["key"] for r in recs} == {keys[row]}, name
    assert comparison.settings["decoding"] == "sampling at temperature 1"


def test_answers_are_scored_by_the_scoring_env(comparison):
    for r in comparison.records:
        parts = r["completions"]
        if r["condition"] == "solo":  # one model's answer, split into the two roles by the env
            (whole,) = parts
            parts = [whole[: len(whole) // 2], whole[len(whole) // 2 :]]
        assert r["reward"] == pytest.approx((len(parts[1]) - len(parts[0])) / 10.0), r["condition"]
        assert r["level/longer"] == float(len(parts[1]) > len(parts[0]))
        assert 0 < r["tokens"] <= 2 * 6  # generated tokens of the joint answer: max_new_tokens=6 per call


def test_table_numbers_match_a_hand_computation(comparison):
    ref = np.array(
        [np.mean([r["reward"] for r in recs]) for _, recs in sorted(_by_row(comparison, "untrained").items())]
    )
    for name, s in comparison.summary.items():
        rows = _by_row(comparison, name)
        values = np.array([np.mean([r["reward"] for r in rows[i]]) for i in (0, 1, 2)])
        assert s["reward"]["mean"] == pytest.approx(values.mean())
        assert s["difference"]["mean"] == pytest.approx(values.mean() - ref.mean())
        idx = np.random.default_rng(5).integers(0, 3, size=(2000, 3))
        assert s["reward"]["low"] == pytest.approx(np.percentile(values[idx].mean(axis=1), 2.5))
        assert s["difference"]["high"] == pytest.approx(np.percentile((values - ref)[idx].mean(axis=1), 97.5))
        longer = [r["level/longer"] for i in (0, 1, 2) for r in rows[i]]
        assert s["levels"]["level/longer"] == pytest.approx(np.mean(longer))
        assert s["tokens_per_answer"] == pytest.approx(np.mean([r["tokens"] for i in rows for r in rows[i]]))
        assert s["seconds_per_answer"] > 0
    # the same models, decoding and seed answer alike: the paired difference is exactly 0 with interval [0, 0]
    assert comparison.summary["again"]["difference"] == {"mean": 0.0, "low": 0.0, "high": 0.0}
    assert comparison.summary["untrained"]["difference"] == {"mean": 0.0, "low": 0.0, "high": 0.0}
    assert comparison.summary["team"]["description"].startswith(str(comparison.conditions[0].target))


def test_outputs_hold_a_run_and_baselines_in_one_table(comparison, setup):
    out = setup["root"] / "out"
    md = (out / "results.md").read_text()
    for name in ("team", "untrained", "parallel", "single", "solo"):
        assert f"| {name} | " in md
    assert "| untrained | " in md and "(control)" in md and "level/longer" in md and "vs untrained" in md
    team = comparison.summary["team"]["reward"]
    assert f"{team['mean']:.3f} [{team['low']:.3f}, {team['high']:.3f}]" in md
    with (out / "results.csv").open() as fh:
        table = {row["condition"]: row for row in csv.DictReader(fh)}
    assert list(table) == ["team", "untrained", "again", "parallel", "single", "solo"]
    assert float(table["team"]["reward_mean"]) == pytest.approx(team["mean"])
    assert table["parallel"]["kind"] == "baseline" and table["solo"]["kind"] == "run"
    assert (out / "compare.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len((out / "samples.jsonl").read_text().splitlines()) == 6 * 3 * 2
    assert json.loads((out / "summary.json").read_text())["control"] == "untrained"


def test_the_cli_writes_the_folder(setup, capsys):
    s = setup
    out = s["root"] / "cli-out"
    argv = ["compare", f"run:{s['team']}"]
    argv += [f"baseline:sequential@{s['team_cfg']}", "--rows", "2", "--out", str(out), "--seed", "1"]
    assert main([*argv, "--control", "sequential"]) == 0
    printed = capsys.readouterr().out
    assert "vs sequential [95% CI]" in printed and "| sequential | " in printed and "(control)" in printed
    assert json.loads((out / "summary.json").read_text())["control"] == "sequential"
    assert (out / "results.md").is_file() and (out / "results.csv").is_file() and (out / "compare.png").is_file()
    assert main(["compare", str(s["team"]), "--rows", "2", "--samples", "2", "--out", str(out)]) == 2
    assert "greedy answers repeat" in capsys.readouterr().err


def test_condition_syntax(setup):
    s = setup
    assert parse_condition(f"x=run:{s['team']}@4") == Condition(name="x", kind="run", target=str(s["team"]), step=4)
    assert parse_condition(str(s["team"])).kind == "run"
    assert parse_condition(s["team_cfg"]) == Condition(name="untrained", kind="untrained", target=s["team_cfg"])
    c = parse_condition(f"baseline:discussion@{s['team_cfg']}")
    assert (c.name, c.mode, c.target) == ("discussion", "discussion", s["team_cfg"])
    for bad, message in [
        (f"baseline:solo@{s['team_cfg']}", "baseline:MODE@TARGET"),
        ("run:/no/such/dir", "not a run directory"),
        ("untrained:/no/such.yaml", "not a file"),
    ]:
        with pytest.raises(ComlrlError, match=message):
            parse_condition(bad)
    with pytest.raises(ComlrlError, match="two conditions are named 'untrained'"):
        compare([s["team_cfg"], s["team_cfg"]], rows=1, progress=False)
    with pytest.raises(ComlrlError, match="control 'nope' is not a condition"):
        compare([s["team_cfg"]], control="nope", progress=False)
    with pytest.raises(ComlrlError, match="has 4 evaluation rows"):
        compare([s["team_cfg"]], rows=9, progress=False)


def test_summary_by_hand_with_a_task_metric_and_contribution_columns():
    from comlrl.compare import summarize
    from comlrl.compare_output import markdown_table

    def rec(name, row, reward, passed):
        return {"condition": name, "row": row, "reward": reward, "level/run": 1.0, "metric/pass": passed, "tokens": 4}

    records = [
        rec("a", 0, 1.0, 1.0),
        rec("a", 0, 0.0, 0.0),
        rec("a", 1, 0.0, 0.0),
        rec("a", 1, 0.0, 0.0),
        rec("b", 0, 0.5, 0.0),
        rec("b", 0, 0.5, 0.0),
        rec("b", 1, 1.0, 1.0),
        rec("b", 1, 1.0, 1.0),
    ]
    extras = {"b": {"eval/contribution/agent_0/empty/mean": 0.25}}
    s = summarize(
        records, names=["a", "b"], control="a", row_ids=[0, 1], samples=2, seconds={"a": 2.0, "b": 4.0}, extras=extras
    )
    # rows of a: 0.5, 0.0 -> 0.25; rows of b: 0.5, 1.0 -> 0.75; paired differences 0.0 and 1.0 -> 0.5
    assert s["a"]["reward"]["mean"] == 0.25 and s["b"]["reward"]["mean"] == 0.75
    assert s["b"]["difference"]["mean"] == 0.5 and s["a"]["difference"] == {"mean": 0.0, "low": 0.0, "high": 0.0}
    assert (s["b"]["difference"]["low"], s["b"]["difference"]["high"]) == (0.0, 1.0)
    assert s["a"]["task"] == {"pass@1": 0.25, "pass@2": 0.5} and s["b"]["task"] == {"pass@1": 0.5, "pass@2": 0.5}
    assert s["a"]["seconds_per_answer"] == 0.5 and s["b"]["tokens_per_answer"] == 4
    table = markdown_table(s, "a")
    assert "| pass@1 | pass@2 |" in table and "contribution/agent_0/empty/mean" in table
    assert (
        "| b | 0.750 [0.500, 1.000] | 0.500 [0.000, 1.000] | 1.000 | 0.500 | 0.500 | 4.000 | 1.000 | 0.250 |" in table
    )
    with pytest.raises(ComlrlError, match=r"condition 'b' has no answer for rows \[1\]"):
        summarize(records[:6], names=["a", "b"], control="a", row_ids=[0, 1], samples=2)


def test_compare_help():
    with pytest.raises(SystemExit) as done:
        main(["compare", "--help"])
    assert done.value.code == 0


# --- cross-play: teams whose agents come from different runs ------------------------------------------------------

LORA = "lora={r: 4, lora_alpha: 8, lora_dropout: 0.0, target_modules: [q_proj, v_proj]}"


@pytest.fixture(scope="module")
def crossplay(setup):
    """A second seed of the team and a LoRA team (one step each), and conditions pairing agents of the runs."""
    s = setup
    a, b, lora = s["team"], s["root"] / "team-seed4", s["root"] / "lora-run"
    assert main(["train", s["team_cfg"], "--set", f"output_dir={b}", "--set", "training.seed=4"]) == 0
    assert main(["train", s["team_cfg"], "--set", f"output_dir={lora}", "--set", LORA]) == 0
    result = compare(
        [
            f"a=run:{a}",
            f"b=run:{b}",
            f"untrained:{s['team_cfg']}",
            f"self=mix:{a},{a}",
            f"half=mix:run:{a},untrained",
            f"swap=mix:{a}#1,{a}#0",
            f"seeds=mix:{a},{b}",
            f"lora=run:{lora}",
            f"mix:{lora}#0,{lora}#1",
            f"lora-full=mix:{lora},{a}",
        ],
        rows=3,
        samples=2,
        temperature=1.0,
        seed=5,
        control="a",
        progress=False,
    )
    return {"a": a, "b": b, "lora": lora, "result": result}


def _answers(result, name):
    """(row, sample) -> (completions, reward) of a condition."""
    return {(r["row"], r["sample"]): (r["completions"], r["reward"]) for r in result.records if r["condition"] == name}


def test_a_mix_of_a_runs_own_agents_is_the_run(crossplay):
    result = crossplay["result"]
    for mixed, run in (("self", "a"), ("lora-run#0+lora-run#1", "lora")):
        assert _answers(result, mixed) == _answers(result, run), mixed
        assert len(_answers(result, mixed)) == 3 * 2
    assert result.summary["self"]["difference"] == {"mean": 0.0, "low": 0.0, "high": 0.0}
    assert result.summary["self"]["kind"] == "mix"
    assert "agent 1 = agent 1 of run" in result.summary["self"]["description"]


def test_each_agent_answers_as_in_the_team_it_comes_from(crossplay):
    result = crossplay["result"]
    teams = {name: _answers(result, name) for name in ("a", "b", "untrained", "lora")}
    # agent i of a mix answers role i's prompt as its own team's agent does (same seed stream per agent and row)
    for mixed, sources in {
        "half": ("a", "untrained"),
        "seeds": ("a", "b"),
        "lora-full": ("lora", "a"),
    }.items():
        for key, (completions, reward) in _answers(result, mixed).items():
            assert completions == [teams[src][key][0][i] for i, src in enumerate(sources)], (mixed, key)
            assert reward == pytest.approx((len(completions[1]) - len(completions[0])) / 10.0)
    # the sources differ, so the checks above could fail
    for x, y in (("a", "untrained"), ("a", "b"), ("a", "lora")):
        assert [v[0][1] for v in teams[x].values()] != [v[0][1] for v in teams[y].values()], (x, y)


def test_a_swap_loads_agent_j_as_agent_i(crossplay, setup):
    from safetensors.torch import load_file

    from comlrl.crossplay import open_team

    a, lora = crossplay["a"], crossplay["lora"]
    trainer, _, models = open_team(parse_condition(f"mix:{a}#1,{a}#0"), setup["team_cfg"])
    for i, j in ((0, 1), (1, 0)):
        saved = load_file(str(a / "final" / f"agent_{j}" / "model.safetensors"))
        own = load_file(str(a / "final" / f"agent_{i}" / "model.safetensors"))
        state = trainer.agents[i].model.state_dict()
        assert all(torch.equal(state[k], v) for k, v in saved.items()), (i, j)
        assert any(not torch.equal(state[k], v) for k, v in own.items()), (i, j)  # the two trained agents differ
    assert models["description"].startswith("cross-play: agent 0 = agent 1 of run")
    trainer, _, _ = open_team(parse_condition(f"mix:{lora}#1,{lora}#0"), setup["team_cfg"])
    from peft import get_peft_model_state_dict

    for i, j in ((0, 1), (1, 0)):
        agent = trainer.agents[i]
        saved = load_file(str(lora / "final" / f"agent_{j}" / "adapter_model.safetensors"))
        state = get_peft_model_state_dict(agent.model, adapter_name=agent.adapter)
        assert saved.keys() == state.keys() and all(torch.equal(state[k], saved[k]) for k in saved), (i, j)


def test_cross_play_refusals(crossplay, setup, tmp_path):
    s, a, lora = setup, crossplay["a"], crossplay["lora"]
    other = tmp_path / "other.yaml"  # the same team on another env
    cfg = yaml.safe_load(Path(s["team_cfg"]).read_text())
    cfg["env"]["name"] = toy_env.NAME
    other.write_text(yaml.safe_dump(cfg))
    lora_r8 = tmp_path / "lora-r8"  # a LoRA run whose adapters have another shape
    shutil.copytree(lora, lora_r8)
    cfg = yaml.safe_load((lora_r8 / "config.yaml").read_text())
    cfg["lora"]["r"] = 8
    (lora_r8 / "config.yaml").write_text(yaml.safe_dump(cfg))
    with toy_env.registered():
        for mix, message in [
            (f"mix:{a}", "lists 1 agent; the scoring env toy-split has a team of 2"),
            (f"mix:{a},{a},{a}", "lists 3 agents"),
            (f"mix:{a}#2,{a}", r"agent 0 takes agent 2 of run .*team-run, whose team has agents 0 to 1"),
            (f"mix:{a},{s['solo']}", r"agent 1 comes from run .*solo-run, a team of 1"),
            (f"mix:{a},untrained:{other}", "agent 1 comes from .*other.yaml, a toy-length team"),
            (f"mix:{lora},{lora_r8}", "different lora sections"),
        ]:
            with pytest.raises(ComlrlError, match=message):
                compare([mix], config=s["team_cfg"], rows=1, progress=False)
    with pytest.raises(ComlrlError, match="name a config"):
        compare(["mix:untrained,untrained"], rows=1, progress=False)
    for bad, message in [
        ("mix:", "one source per agent"),
        ("mix:/no/such/dir,untrained", "agent 0: /no/such/dir is neither a run directory nor a config"),
        (f"mix:{a},", "agent 1: empty"),
    ]:
        with pytest.raises(ComlrlError, match=message):
            parse_condition(bad)
    c = parse_condition(f"mix:{a}@4#1,untrained,untrained:{s['team_cfg']}#0")
    assert c.name == "team-run@4#1+untrained+team#0" and c.kind == "mix"
    assert [(x.kind, x.step, x.index) for x in c.agents] == [
        ("run", 4, 1),
        ("untrained", None, None),
        ("untrained", None, 0),
    ]


def test_compare_help_shows_cross_play(capsys):
    with pytest.raises(SystemExit):
        main(["compare", "--help"])
    assert "mix:SOURCE,SOURCE" in capsys.readouterr().out


def test_a_mixs_untrained_models_are_its_agents_bases(crossplay, setup):
    """evaluate()'s contributions of a mix replace each agent by the untrained model its source started from."""
    a, lora = crossplay["a"], crossplay["lora"]
    on = ["training.eval_contributions=true"]
    result = compare(
        [f"a=run:{a}", f"self=mix:{a},{a}", f"half=mix:{a},untrained"], rows=2, overrides=on, progress=False
    )
    extra = {name: s["extra"] for name, s in result.summary.items()}
    assert extra["self"] == extra["a"] and extra["a"]["eval/contribution/agent_0/untrained"] != 0.0
    assert extra["half"]["eval/contribution/agent_1/untrained"] == 0.0  # agent 1 is its untrained model already
    with pytest.raises(ComlrlError, match="fully fine-tuned agent \\(agent 1\\) in a team of LoRA agents"):
        compare([f"mix:{lora},{a}"], config=setup["team_cfg"], rows=1, overrides=on, progress=False)


def test_an_untrained_chain_team_answers_as_the_sequential_baseline(setup):
    """The sequential baseline is the chain topology untrained: greedy, the same models answer alike, so a trained
    chain is compared with an untrained chain by one mechanism."""
    s = setup
    cfg = yaml.safe_load(Path(s["team_cfg"]).read_text())
    cfg["training"]["topology"] = "chain"
    chain_cfg = s["root"] / "chain.yaml"
    chain_cfg.write_text(yaml.safe_dump(cfg, sort_keys=False))
    result = compare(
        [f"chain=untrained:{chain_cfg}", f"baseline:sequential@{s['team_cfg']}", f"untrained:{s['team_cfg']}"],
        rows=3,
        progress=False,
    )
    chain, sequential, parallel = (_by_row(result, n) for n in ("chain", "sequential", "untrained"))
    assert [chain[i][0]["completions"] for i in range(3)] == [sequential[i][0]["completions"] for i in range(3)]
    assert result.summary["sequential"]["difference"] == {"mean": 0.0, "low": 0.0, "high": 0.0}
    # agent 1 sees agent 0's answer under the chain, not under the parallel team: its answers differ
    assert [chain[i][0]["completions"][1] for i in range(3)] != [parallel[i][0]["completions"][1] for i in range(3)]
