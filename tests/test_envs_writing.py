"""Writing environments (tldr, arxiv): tier thresholds and ramps, loaders, formatters, registry."""

import json

import pytest

import comlrl.envs as envs
from comlrl.envs import DatasetError
from comlrl.envs.writing import (
    ARXIV_TIERS,
    MARKER,
    TLDR_TIERS,
    jaccard,
    plateau,
    score_writing,
    split_marked,
    transition_categories,
    transition_score,
)

# 8 distinct 4-letter words + one 5-letter word: 8 tokens... see each test for the counts.
C1_40 = "aaaa bbbb cccc dddd eeee ffff gggg hhhhh"  # 8 tokens, 8 distinct words, 40 characters


def test_tldr_length_tier_thresholds_and_ramps():
    lo, full_lo, full_hi, hi = TLDR_TIERS.length
    assert (lo, full_lo, full_hi, hi) == (1.1, 1.6, 3.2, 5.0)
    assert plateau(1.35, *TLDR_TIERS.length) == pytest.approx((0.5, True))  # (1.35-1.1)/0.5
    assert plateau(1.1, *TLDR_TIERS.length) == (0.0, True)  # edge: 0 points but scoring goes on
    assert plateau(1.6, *TLDR_TIERS.length) == (1.0, True)
    assert plateau(3.2, *TLDR_TIERS.length) == (1.0, True)
    assert plateau(4.1, *TLDR_TIERS.length) == pytest.approx((0.5, True))  # 1-(4.1-3.2)/1.8
    assert plateau(5.0, *TLDR_TIERS.length) == pytest.approx((0.0, True))
    assert plateau(1.09, *TLDR_TIERS.length) == (0.0, False)  # stop
    assert plateau(5.01, *TLDR_TIERS.length) == (0.0, False)


def test_tldr_distinct_tier():
    assert plateau(1.65, *TLDR_TIERS.distinct) == pytest.approx((0.5, True))  # (1.65-1.3)/0.7 of 0.5 points
    assert plateau(2.0, *TLDR_TIERS.distinct) == (1.0, True)
    assert plateau(9.0, *TLDR_TIERS.distinct) == (1.0, True)
    assert plateau(1.29, *TLDR_TIERS.distinct) == (0.0, False)


def test_arxiv_tiers():
    assert ARXIV_TIERS.tokens == (128, 256)
    assert plateau(1.05, *ARXIV_TIERS.length) == pytest.approx((0.5, True))  # (1.05-0.8)/0.5
    assert plateau(1.8, *ARXIV_TIERS.length) == pytest.approx((0.5, True))  # 1-(1.8-1.6)/0.4
    assert plateau(1.45, *ARXIV_TIERS.length) == (1.0, True)
    assert plateau(0.79, *ARXIV_TIERS.length)[1] is False and plateau(2.01, *ARXIV_TIERS.length)[1] is False
    assert plateau(0.6, *ARXIV_TIERS.distinct) == pytest.approx((0.5, True))  # (0.6-0.5)/0.2
    assert plateau(1.5, *ARXIV_TIERS.distinct) == pytest.approx((0.5, True))  # 1-(1.5-1.3)/0.4
    assert plateau(1.0, *ARXIV_TIERS.distinct) == (1.0, True)
    assert plateau(1.71, *ARXIV_TIERS.distinct)[1] is False


def test_transition_score_and_matching():
    assert [transition_score(k) for k in (0, 1, 2, 3, 12)] == pytest.approx([0.0, 0.4, 0.45, 0.5, 0.95])
    assert transition_categories("However, prices rose; as a result, sales fell.") == {"contrast", "cause_effect"}
    assert transition_categories("We also went.") == {"elaboration"}  # "also", and "so" inside it does not count
    assert transition_categories("Nothing here, really.") == set()
    assert jaccard({"a", "b"}, {"b", "c"}) == pytest.approx(1 / 3) and jaccard(set(), set()) == 0.0


def test_tldr_structure_stops_scoring():
    assert score_writing("too short to count here", "a b c d e f g h i j", TLDR_TIERS)["reward"] == 0.0  # 5 tokens
    long = " ".join(["word"] * 257)
    out = score_writing(C1_40, long, TLDR_TIERS)
    assert out["reward"] == 0.0 and out["level/structure"] == 0.0


def test_tldr_ratio_135_gives_half_length_points():
    # c2: 11 distinct 4-letter words = 54 characters -> length ratio 54/40 = 1.35 -> 0.5 of 1.0 point.
    # distinct ratio 11/8 = 1.375 -> (1.375-1.3)/0.7 = 0.107143 of 0.5 points; no transitions, no shared words.
    c2 = "iiii jjjj kkkk llll mmmm nnnn oooo pppp qqqq rrrr ssss"
    out = score_writing(C1_40, c2, TLDR_TIERS)
    assert out["metric/length_ratio"] == pytest.approx(1.35)
    assert out["level/length"] == pytest.approx(0.5)
    assert out["level/distinct"] == pytest.approx(0.075 / 0.7)
    assert out["level/style"] == 0.0
    assert out["reward"] == pytest.approx(0.5 + 0.5 + 0.5 * 0.075 / 0.7)


def test_tldr_full_example():
    c1 = "aaaa bbbb cccc dddd eeee ffff gggg hhhh"  # 39 characters
    c2 = "aaaa however moreover " + " ".join(w * 4 for w in "ijklmnopqrstuvwxy")  # 20 distinct words, 106 chars
    out = score_writing(c1, c2, TLDR_TIERS)
    # length 106/39 = 2.72 -> 1.0; distinct 20/8 = 2.5 -> 0.5 points; transitions: contrast + elaboration -> 0.45;
    # Jaccard of content words = 1/27 = 0.037 >= 0.03 -> 1.0; style = 0.4*0.45 + 0.6*1.0 = 0.78
    assert out["level/style"] == pytest.approx(0.78)
    assert out["reward"] == pytest.approx(0.5 + 1.0 + 0.5 + 0.78)


def test_arxiv_example_transitions_count_in_both_outputs():
    c1 = " ".join(f"w{i:03d}" for i in range(129)) + " however"  # 130 tokens, 652 chars, transition in c1 only
    c2 = " ".join(f"x{i:04d}" for i in range(167)) + " w000"  # 168 tokens, 1007 chars, shares w000 with c1
    out = score_writing(c1, c2, ARXIV_TIERS)
    # length 1007/652 = 1.544 -> 1.0; distinct 168/130 = 1.29 -> 1.0 (0.5 points);
    # one transition category (counted over c1+c2) -> 0.4; Jaccard 1/(130+168-1) = 1/297 -> (1/297)/0.03
    overlap = (1 / 297) / 0.03
    assert out["level/style"] == pytest.approx(0.4 * 0.4 + 0.6 * overlap)
    assert out["reward"] == pytest.approx(2.0 + 0.16 + 0.6 * overlap)
    tldr = score_writing(c1, c2, TLDR_TIERS)  # tldr counts transitions in c2 only
    assert tldr["metric/transition_categories"] == 0.0


def test_empty_first_output_is_minimum():
    assert score_writing("", "anything at all here to say now ok", TLDR_TIERS)["reward"] == 0.0


def test_reward_contract():
    env = envs.make("tldr")
    reward = env.reward_func
    assert reward.batched is True and reward.max_reward == 3.0
    c2 = "iiii jjjj kkkk llll mmmm nnnn oooo pppp qqqq rrrr ssss"
    values = reward([C1_40, "x"], [c2, "y"], batch_items=None, prompts=[["p"], ["q"]], turn=1)
    assert values == pytest.approx([0.5 + 0.5 + 0.5 * 0.075 / 0.7, 0.0])
    scores = reward.score([C1_40], [c2])
    assert set(scores[0]) >= {"reward", "level/structure", "level/length", "level/distinct", "level/style"}
    with pytest.raises(ValueError, match="3 agent"):
        reward(["a"], ["b"], ["c"])
    with pytest.raises(ValueError, match="differ in length"):
        reward(["a", "b"], ["c"])


def test_single_agent_marker_split():
    assert split_marked(f"Short one.\n{MARKER}\nLong one here.") == ("Short one.", "Long one here.")
    assert split_marked("### Part 1\nShort.\n**PART 2**\nLong.") == ("Short.", "Long.")
    assert split_marked("no marker at all") == ("no marker at all", "")
    single = envs.make("tldr", num_agents=1)
    c2 = "iiii jjjj kkkk llll mmmm nnnn oooo pppp qqqq rrrr ssss"
    assert single.reward_func([f"{C1_40}\n{MARKER}\n{c2}"])[0] == pytest.approx(0.5 + 0.5 + 0.5 * 0.075 / 0.7)
    assert MARKER in single.formatters()[0]({"prompt": "POST: hello"})


def test_writing_envs_are_two_agent():
    with pytest.raises(ValueError, match="num_agents=3"):
        envs.make("arxiv", num_agents=3)


def test_registry():
    builtin = {"arxiv", "bfcl", "blocks", "classeval", "coophumaneval", "humaneval", "mbpp", "tldr"}
    assert builtin <= set(envs.list_envs()) and envs.list_envs() == sorted(envs.list_envs())
    with pytest.raises(ValueError, match="Did you mean 'tldr'"):
        envs.make("tldrr")
    with pytest.raises(ValueError, match="unknown option 'transitions'.*Did you mean 'transition'"):
        envs.make("mbpp", transitions="plain")
    env = envs.make("arxiv")
    assert env.describe()["levels"] == ["level/structure", "level/length", "level/distinct", "level/style"]
    assert env.external_transition is None and env.defaults["num_turns"] == 1


def test_tldr_loader_and_formatters(shared_data):
    env = envs.make("tldr")
    ds = env.load_dataset(str(shared_data / "tldr_sample.jsonl"), limit=5)
    assert len(ds) == 5 and set(ds.column_names) == {"prompt", "completion"}
    assert ds[0]["prompt"].startswith("SUBREDDIT:") and not ds[0]["prompt"].rstrip().endswith("TL;DR:")
    extra = env.load_dataset(str(shared_data / "tldr_posts_extra.jsonl"))
    assert len(extra) == 100
    concise, detailed = [f(ds[0]) for f in env.formatters()]
    assert ds[0]["prompt"][:50] in concise and ds[0]["prompt"][:50] in detailed
    assert "concise" in concise.lower() and "detailed" in detailed.lower() and concise != detailed


def test_arxiv_loader_string_and_sentence_list(shared_data, tmp_path):
    env = envs.make("arxiv")
    ds = env.load_dataset(str(shared_data / "arxiv_abstracts.jsonl"), limit=3)
    assert len(ds) == 3 and ds[0]["article_id"] == "0704.0001" and ds[0]["abstract"].startswith("A fully")
    path = tmp_path / "abs.json"
    path.write_text(json.dumps([{"abstract_text": ["First sentence.", "Second sentence."]}]))
    assert env.load_dataset(str(path))[0]["abstract"] == "First sentence. Second sentence."
    prompts = [f(env.load_dataset(str(path))[0]) for f in env.formatters()]
    assert all("First sentence. Second sentence." in p for p in prompts)


def test_loader_errors_name_file_row_and_field(tmp_path):
    env = envs.make("arxiv")
    path = tmp_path / "rows.jsonl"
    path.write_text('{"abstract": "ok"}\n{"title": "no abstract"}\n')
    with pytest.raises(DatasetError, match=r"rows\.jsonl: row 2 is missing the field 'abstract' or 'abstract_text'"):
        env.load_dataset(str(path))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"abstract": "ok"}\n{"abstract": broken}\n')
    with pytest.raises(DatasetError, match=r"bad\.jsonl: row 2 \(line 2\) is not valid JSON"):
        env.load_dataset(str(bad))
    with pytest.raises(DatasetError, match=r"data file not found: '.*missing\.jsonl'"):
        env.load_dataset(str(tmp_path / "missing.jsonl"))
    broken_json = tmp_path / "broken.json"
    broken_json.write_text('[{"abstract": "a"},,]')
    with pytest.raises(DatasetError, match=r"broken\.json: not valid JSON at line 1"):
        env.load_dataset(str(broken_json))


def test_hub_id_offline_error_names_the_id():
    with pytest.raises(DatasetError, match="'trl-lib/tldr'.*local .json/.jsonl/.parquet path"):
        envs.make("tldr").load_dataset("trl-lib/tldr")  # a named hub id; no source reads the packaged posts


def test_jaccard_cap_option():
    c1 = " ".join(f"w{i:03d}" for i in range(129)) + " however"
    c2 = " ".join(f"x{i:04d}" for i in range(167)) + " w000"
    out = envs.make("arxiv", jaccard_cap=0.23).reward_func.score([c1], [c2])[0]
    assert out["level/style"] == pytest.approx(0.4 * 0.4 + 0.6 * (1 / 297) / 0.23)
    with pytest.raises(ValueError, match="jaccard_cap"):
        envs.make("tldr", jaccard_cap=0)
