"""Evaluation baselines with a fake, deterministic generator: prompt wiring, scoring and the table."""

import pytest

import comlrl.envs as envs
from comlrl.envs.core.baselines import format_table, run_baseline
from comlrl.envs.writing import MARKER

# summaries of both posts (the reward counts only sentences about the post, in the writer's own words)
CONCISE = "The landlord kept the deposit over worn carpet."  # 8 tokens
DETAILED = "After moving out, the tenant lost the deposit over carpet wear."  # 11 tokens
ROWS = [
    {
        "prompt": "SUBREDDIT: r/test\n\nTITLE: deposit\n\nPOST: My landlord kept my whole security deposit after I "
        "moved out, blaming a worn carpet."
    },
    {"prompt": "POST: After I moved out, the landlord kept the security deposit and blamed the old carpet."},
]


class FakeGenerator:
    """Agent 0 always answers CONCISE, agent 1 DETAILED; single mode answers both parts with the marker."""

    def __init__(self):
        self.calls = []

    def __call__(self, agent, prompts):
        self.calls.append((agent, list(prompts)))
        if MARKER in prompts[0] and "Write two summaries" in prompts[0]:
            return [f"{CONCISE}\n{MARKER}\n{DETAILED}"] * len(prompts)
        return [CONCISE if agent == 0 else DETAILED] * len(prompts)


SCORES = envs.make("tldr").reward_func.score([CONCISE] * 2, [DETAILED] * 2, batch_items=ROWS)
EXPECTED = sum(s["reward"] for s in SCORES) / 2
LENGTH = sum(s["level/length"] for s in SCORES) / 2


@pytest.mark.parametrize(
    "mode, n_calls, tokens", [("single", 1, 22), ("parallel", 2, 19), ("sequential", 2, 19), ("discussion", 4, 38)]
)
def test_modes_score_the_same_answers(mode, n_calls, tokens):
    gen = FakeGenerator()
    out = run_baseline(envs.make("tldr"), mode, generate=gen, rows=ROWS)
    assert out["reward/mean"] == pytest.approx(EXPECTED) and EXPECTED > 1.0
    assert len(gen.calls) == n_calls and out["num_tasks"] == 2
    assert out["tokens/per_task"] == tokens  # whitespace tokens per task over all calls (the marker line counts 3)
    assert out["level/length"] == pytest.approx(LENGTH) and 0 < LENGTH < 1


def test_prompt_wiring():
    env = envs.make("tldr")
    concise_fmt, detailed_fmt = env.formatters()

    gen = FakeGenerator()
    run_baseline(env, "single", generate=gen, rows=ROWS)
    [(agent, prompts)] = gen.calls
    assert agent == 0 and prompts == [env.single_formatter()(r) for r in ROWS] and MARKER in prompts[0]

    gen = FakeGenerator()
    run_baseline(env, "parallel", generate=gen, rows=ROWS)
    assert gen.calls == [(0, [concise_fmt(r) for r in ROWS]), (1, [detailed_fmt(r) for r in ROWS])]

    gen = FakeGenerator()
    run_baseline(env, "sequential", generate=gen, rows=ROWS)
    (a0, p0), (a1, p1) = gen.calls
    assert (a0, a1) == (0, 1) and p0 == [concise_fmt(r) for r in ROWS]
    # the chain topology's composition: agent 0's answer under a header naming it
    assert p1[0] == f"{detailed_fmt(ROWS[0]).rstrip()}\n\nAgent 1's answer (this turn):\n{CONCISE}"

    gen = FakeGenerator()
    run_baseline(env, "discussion", generate=gen, rows=ROWS)
    first0, first1, second0, second1 = gen.calls
    assert first0 == (0, [concise_fmt(r) for r in ROWS]) and first1 == (1, [detailed_fmt(r) for r in ROWS])
    # the debate topology's second turn: every agent's first answer, its own included
    shown = f"Your answer (previous turn):\n{CONCISE}\n\nAgent 2's answer (previous turn):\n{DETAILED}"
    assert second0 == (0, [f"{concise_fmt(r).rstrip()}\n\n{shown}" for r in ROWS])
    shown = f"Agent 1's answer (previous turn):\n{CONCISE}\n\nYour answer (previous turn):\n{DETAILED}"
    assert second1 == (1, [f"{detailed_fmt(r).rstrip()}\n\n{shown}" for r in ROWS])


def test_custom_token_counter_and_errors():
    out = run_baseline(envs.make("tldr"), "parallel", generate=FakeGenerator(), rows=ROWS, count_tokens=len)
    assert out["tokens/per_task"] == len(CONCISE) + len(DETAILED)
    with pytest.raises(ValueError, match="unknown baseline mode 'debate'"):
        run_baseline(envs.make("tldr"), "debate", generate=FakeGenerator(), rows=ROWS)
    with pytest.raises(ValueError, match="returned 1 completions for 2 prompts"):
        run_baseline(envs.make("tldr"), "parallel", generate=lambda agent, prompts: ["x"], rows=ROWS)


def test_code_single_mode_splits_aux_out():
    row = {
        "task_id": "toy",
        "prompt": 'def double(x):\n    """Twice x."""\n',
        "entry_point": "double",
        "test": "def check(candidate):\n    assert candidate(2) == 4\n    assert candidate(0) == 0\n",
    }
    program = "```python\ndef aux(x):\n    return x + x\n\ndef double(x):\n    y = aux(x)\n    return y\n```"
    out = run_baseline(
        envs.make("humaneval"), "single", generate=lambda agent, prompts: [program] * len(prompts), rows=[row]
    )
    assert out["pass@1"] == 1.0 and out["level/aux_defined"] == 1.0 and out["aux/usage_rate"] == 1.0
    assert out["reward/mean"] == pytest.approx(3.0)  # r = aux(x); return r is a trivial wrapper: no +1.0


def test_format_table():
    results = {
        "single": {"reward/mean": 1.25, "pass@1": 0.5, "level/tests": 0.75, "tokens/per_task": 120.0},
        "parallel": {"reward/mean": 2.0, "pass@1": 1.0, "level/tests": 1.0, "tokens/per_task": 80.5},
    }
    table = format_table(results)
    assert table.splitlines() == [
        "| baseline | reward/mean | pass@1 | level/tests | tokens/per_task |",
        "|---|---:|---:|---:|---:|",
        "| single | 1.250 | 0.500 | 0.750 | 120.0 |",
        "| parallel | 2.000 | 1.000 | 1.000 | 80.5 |",
    ]
    assert format_table({"a": {"x": 1.0}}, columns=["x", "y"]).splitlines()[-1] == "| a | 1.000 | - |"


def test_one_completion_for_the_whole_team_gets_the_joint_token_budget():
    """single and centralized write every agent's answer in one completion: a generate that takes ``parts`` is asked
    for num_agents parts; the per-agent modes keep one part per call, and a two-argument generate still works."""
    asked = []

    def generate(agent, prompts, parts=1):
        asked.append(parts)
        return ["x"] * len(prompts)

    env = envs.make("tldr")
    for mode, expected in [("single", [2]), ("centralized", [2]), ("parallel", [1, 1]), ("sequential", [1, 1])]:
        asked.clear()
        run_baseline(env, mode, generate=generate, rows=ROWS)
        assert asked == expected, mode
    assert run_baseline(env, "single", generate=lambda agent, prompts: ["x"] * len(prompts), rows=ROWS)[
        "num_tasks"
    ] == len(ROWS)
