"""The published writing rewards (``reward="published"``): the tiers on the whole texts, no task check.

Each threshold is tried just below, at and just above on hand-made texts whose token, character and distinct-word
counts are asserted first, so every expected score is computed by hand from the module docstring's table.
"""

import pytest
from test_envs_writing import HONEST, _packaged_row, writing_hacks

import comlrl.envs as envs
from comlrl import runconfig, runs
from comlrl.envs.writing import count_tokens, distinct_words

# tldr's first output: 10 tokens, 10 distinct words, 110 characters (ten 10-letter words + 9 spaces + 1 letter)
C1 = " ".join(c * 10 for c in "abcdefghij") + "j"


def text(n_tokens, chars, distinct=None, extra=(), prefix="z"):
    """``n_tokens`` whitespace tokens, ``chars`` characters, ``distinct`` distinct words (default all): the words of
    ``extra``, then ``prefix`` + a number, then the first numbered word repeated; the last numbered word is padded
    with x to reach ``chars``."""
    distinct = n_tokens if distinct is None else distinct
    words = list(extra) + [f"{prefix}{i}" for i in range(distinct - len(extra))]
    words += [f"{prefix}0"] * (n_tokens - len(words))
    missing = chars - len(" ".join(words))
    assert missing >= 0, (n_tokens, chars)
    last = distinct - len(extra) - 1
    words[len(extra) + last] += "x" * missing
    out = " ".join(words)
    assert (count_tokens(out), len(out), len(distinct_words(out))) == (n_tokens, chars, distinct)
    return out


def published(name, c1, c2, **options):
    return envs.make(name, reward="published", **options).reward_func.score([c1], [c2])[0]


def levels(out):
    return [out[k] for k in ("level/structure", "level/length", "level/distinct", "level/style")]


# c2: 20 distinct words ("however" and 19 numbered ones) -> distinct ratio 20/10 = 2.0: 0.5 points; one transition
# category and no word shared with C1 -> style 0.4 * 0.4 = 0.16. A level that stops leaves the rest at 0.
@pytest.mark.parametrize(
    "chars, length, stops",
    [
        (120, 0.0, True),  # r = 120/110 = 1.09 < 1.1: stop
        (121, 0.0, False),  # r = 1.1: 0 points, scoring goes on
        (165, (1.5 - 1.1) / 0.5, False),  # r = 1.5: on the ramp up
        (175, (175 / 110 - 1.1) / 0.5, False),  # r = 1.59
        (176, 1.0, False),  # r = 1.6
        (352, 1.0, False),  # r = 3.2
        (353, 1 - (353 / 110 - 3.2) / 1.8, False),  # r = 3.209: on the ramp down
        (550, 0.0, False),  # r = 5.0: 0 points, scoring goes on
        (551, 0.0, True),  # r = 5.009: stop
    ],
)
def test_tldr_published_length_thresholds(chars, length, stops):
    out = published("tldr", C1, text(20, chars, extra=["however"]))
    assert out["metric/length_ratio"] == pytest.approx(chars / 110)
    expected = [1.0, 0.0, 0.0, 0.0] if stops else [1.0, length, 1.0, 0.16]
    assert levels(out) == pytest.approx(expected)
    assert out["reward"] == pytest.approx(0.5 if stops else 0.5 + length + 0.5 + 0.16)


# c2: 240 characters (length ratio 2.18: full points), "however" among its distinct words, the rest repeats.
@pytest.mark.parametrize(
    "distinct, level, stops",
    [
        (12, 0.0, True),  # 12/10 = 1.2 < 1.3: stop
        (13, 0.0, False),  # 1.3: 0 points, scoring goes on
        (15, 0.2 / 0.7, False),  # 1.5: (1.5-1.3)/0.7 of the level's 0.5 points
        (19, 0.6 / 0.7, False),  # 1.9
        (20, 1.0, False),  # 2.0
        (30, 1.0, False),  # 3.0: no upper bound
    ],
)
def test_tldr_published_distinct_thresholds(distinct, level, stops):
    out = published("tldr", C1, text(36, 240, distinct=distinct, extra=["however"]))
    assert out["metric/distinct_ratio"] == pytest.approx(distinct / 10)
    assert levels(out) == pytest.approx([1.0, 1.0, 0.0, 0.0] if stops else [1.0, 1.0, level, 0.16])
    assert out["reward"] == pytest.approx(1.5 if stops else 1.5 + 0.5 * level + 0.16)


@pytest.mark.parametrize(
    "c1_tokens, c2_tokens, structure",
    [(7, 20, 0.0), (8, 20, 1.0), (8, 7, 0.0), (8, 8, 1.0), (8, 256, 1.0), (8, 257, 0.0), (257, 20, 0.0)],
)
def test_tldr_published_structure_bounds(c1_tokens, c2_tokens, structure):
    c1 = text(c1_tokens, 5 * c1_tokens + 40, prefix="a")
    out = published("tldr", c1, text(c2_tokens, 5 * c2_tokens + 40, prefix="b"))
    assert out["level/structure"] == structure
    if not structure:
        assert out["reward"] == 0.0


@pytest.mark.parametrize(
    "shared, overlap",
    [(2, 2 / 3), (3, 1.0), (4, 1.0)],  # Jaccard 0.02, 0.03 (the cap), 0.04 over 100 content words
)
def test_tldr_published_overlap_cap(shared, overlap):
    """c2: 90 words of its own ("however" and numbered ones) and ``shared`` of C1's: 100 content words in all."""
    c1_words = C1.split()
    c2 = text(90 + shared, 500, extra=["however", *c1_words[:shared]])  # length ratio 4.5, distinct 9+: go on
    out = published("tldr", C1, c2)
    assert out["metric/jaccard"] == pytest.approx(shared / 100)
    assert out["level/style"] == pytest.approx(0.4 * 0.4 + 0.6 * overlap)


def test_tldr_published_pays_a_list_of_transition_words():
    """One word of each of the 12 categories in a list: 0.95 of the transition score (the strict reward counts two
    categories per counted sentence, and a list is no sentence)."""
    words = "moreover namely thus however first indeed overall similarly although if meanwhile clarify".split()
    out = published("tldr", C1, text(20, 240, extra=words))
    assert out["metric/transition_categories"] == 11  # "clarify" alone is no phrase of the list
    out = published("tldr", C1, text(20, 240, extra=[*words[:-1], "that", "is"]))
    assert out["metric/transition_categories"] == 12
    assert out["level/style"] == pytest.approx(0.4 * 0.95)


ARXIV_C1 = text(128, 800, distinct=100, extra=["however"], prefix="a")  # 128 tokens, 800 characters, 100 distinct


@pytest.mark.parametrize(
    "chars, length, stops",
    [
        (639, 0.0, True),  # r = 0.799 < 0.8: stop
        (640, 0.0, False),  # r = 0.8: 0 points, scoring goes on
        (840, (1.05 - 0.8) / 0.5, False),  # r = 1.05
        (1040, 1.0, False),  # r = 1.3
        (1280, 1.0, False),  # r = 1.6
        (1440, 1 - (1.8 - 1.6) / 0.4, False),  # r = 1.8
        (1600, 0.0, False),  # r = 2.0: 0 points, scoring goes on
        (1601, 0.0, True),  # r = 2.001: stop
    ],
)
def test_arxiv_published_length_thresholds(chars, length, stops):
    """c2: 128 distinct words with "moreover" (ratio 1.28: full 0.5 points); transitions are counted in both
    outputs: contrast (C1's "however") and elaboration -> 0.45, style 0.4 * 0.45 = 0.18."""
    out = published("arxiv", ARXIV_C1, text(128, chars, extra=["moreover"], prefix="b"))
    assert out["metric/length_ratio"] == pytest.approx(chars / 800)
    assert levels(out) == pytest.approx([1.0, 0.0, 0.0, 0.0] if stops else [1.0, length, 1.0, 0.18])
    assert out["reward"] == pytest.approx(0.5 if stops else 0.5 + length + 0.5 + 0.18)


@pytest.mark.parametrize(
    "distinct, level, stops",
    [
        (49, 0.0, True),  # 49/100 < 0.5: stop
        (50, 0.0, False),  # 0.5: 0 points, scoring goes on
        (60, 0.5, False),  # 0.6: (0.6-0.5)/0.2
        (70, 1.0, False),  # 0.7
        (130, 1.0, False),  # 1.3
        (150, 0.5, False),  # 1.5: 1-(1.5-1.3)/0.4
        (170, 0.0, False),  # 1.7: 0 points, scoring goes on
        (171, 0.0, True),  # 1.71: stop
    ],
)
def test_arxiv_published_distinct_thresholds(distinct, level, stops):
    """c2: 200 tokens, 1200 characters (length ratio 1.5: full points)."""
    out = published("arxiv", ARXIV_C1, text(200, 1200, distinct=distinct, extra=["moreover"], prefix="b"))
    assert out["metric/distinct_ratio"] == pytest.approx(distinct / 100)
    assert levels(out) == pytest.approx([1.0, 1.0, 0.0, 0.0] if stops else [1.0, 1.0, level, 0.18])
    assert out["reward"] == pytest.approx(1.5 if stops else 1.5 + 0.5 * level + 0.18)


@pytest.mark.parametrize("c1_tokens, structure", [(127, 0.0), (128, 1.0), (256, 1.0), (257, 0.0)])
def test_arxiv_published_structure_bounds(c1_tokens, structure):
    c1 = text(c1_tokens, 6 * c1_tokens, prefix="a")
    out = published("arxiv", c1, text(200, 1200, prefix="b"))
    assert out["level/structure"] == structure


@pytest.mark.parametrize(
    "chars, published_length, first_length",
    [
        (800, (1.0 - 0.8) / 0.5, 1.0),  # r = 1.0: the first release's band starts here
        (1040, 1.0, 1.0),  # r = 1.3: both bands
        (1200, 1.0, 0.0),  # r = 1.5: the end of the first release's ramp (0 points, goes on)
        (1280, 1.0, None),  # r = 1.6: the first release stops
    ],
)
def test_arxiv_published_first_release_band(chars, published_length, first_length):
    c2 = text(128, chars, extra=["moreover"], prefix="b")
    assert published("arxiv", ARXIV_C1, c2)["level/length"] == pytest.approx(published_length)
    out = envs.make("arxiv", reward="published_v1").reward_func.score([ARXIV_C1], [c2])[0]
    if first_length is None:
        assert out["reward"] == 0.5
    else:
        assert out["level/length"] == pytest.approx(first_length) and out["level/distinct"] == 1.0


def test_published_single_agent_splits_at_the_marker():
    c2 = text(20, 240, extra=["however"])
    single = envs.make("tldr", num_agents=1, reward="published").reward_func
    assert single.score([f"{C1}\n### PART 2\n{c2}"])[0] == published("tldr", C1, c2)


# --- the default stays strict; the option's name is checked; it flows from a YAML config -------------------


def test_default_reward_is_strict_and_published_pays_an_echo():
    """The role hint echoed by agent 2 (a hack): the strict reward leaves it out, the published one pays it."""
    row = _packaged_row("tldr", 0)
    c1, c2 = writing_hacks("tldr", row, HONEST[("tldr", 0)])["agent 2 echoes its role hint"]
    strict = envs.make("tldr").reward_func.score([c1], [c2], batch_items=[row])[0]
    named = envs.make("tldr", reward="strict").reward_func.score([c1], [c2], batch_items=[row])[0]
    loose = envs.make("tldr", reward="published").reward_func.score([c1], [c2], batch_items=[row])[0]
    assert strict == named and strict["reward"] <= 0.5 and "metric/counted_2" in strict
    assert loose["reward"] >= 2.0 and "metric/counted_2" not in loose
    assert envs.env_options("tldr")["reward"] == "strict"


def test_unknown_reward_name_is_refused_with_the_valid_ones():
    with pytest.raises(
        ValueError, match=r"tldr: unknown reward 'publish'\. Did you mean 'published'\?.*strict, published"
    ):
        envs.make("tldr", reward="publish")
    with pytest.raises(ValueError, match="arxiv: unknown reward 'loose'.*strict, published, published_v1"):
        envs.make("arxiv", reward="loose")
    with pytest.raises(ValueError, match="tldr: unknown reward 'published_v1'"):
        envs.make("tldr", reward="published_v1")


def test_reward_option_from_a_yaml_config(tmp_path):
    path = tmp_path / "published.yaml"
    path.write_text("env:\n  name: tldr\n  options: {reward: published}\nmodel: embedded\n")
    env = runs.make_env(runconfig.load_config(path))
    c2 = text(20, 240, extra=["however"])
    assert env.reward_func.score([C1], [c2])[0]["reward"] == pytest.approx(2.16)  # whole texts count
    assert envs.make("tldr").reward_func.score([C1], [c2])[0]["reward"] < 0.5  # strict: a list of codes, no prose
    path.write_text("env:\n  name: tldr\n  options: {reward: nonsense}\nmodel: embedded\n")
    with pytest.raises(ValueError, match="unknown reward 'nonsense'.*strict, published"):
        runs.make_env(runconfig.load_config(path))
