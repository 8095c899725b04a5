"""Writing environments (tldr, arxiv): tier thresholds and ramps, loaders, formatters, registry."""

import json
from pathlib import Path

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
    sentence_transitions,
    split_marked,
    transition_categories,
    transition_score,
)
from comlrl.envs.writing_rules import copied_runs, counted_sentences, stem, task_context, word_positions

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
    row = _packaged_row("tldr", 0)
    c1, c2 = HONEST[("tldr", 0)]
    values = reward([c1, "x"], [c2, "y"], batch_items=[row, row], prompts=[["p"], ["q"]], turn=1)
    # every sentence counts: length ratio 3.01 -> 1.0; distinct 63/20 -> 0.5 points; transitions in agent 2's
    # sentences: elaboration, example, comparison, contrast -> 0.55; Jaccard 0.17 >= 0.03 -> 1.0
    assert values == pytest.approx([0.5 + 1.0 + 0.5 + 0.4 * 0.55 + 0.6, 0.0])
    scores = reward.score([c1], [c2], batch_items=[row])
    assert set(scores[0]) >= {"reward", "level/structure", "level/length", "level/distinct", "level/style"}
    assert scores[0]["metric/counted_1"] == scores[0]["metric/counted_2"] == 1.0
    with pytest.raises(ValueError, match="3 agent"):
        reward(["a"], ["b"], ["c"])
    with pytest.raises(ValueError, match="differ in length"):
        reward(["a", "b"], ["c"])


def test_single_agent_marker_split():
    assert split_marked(f"Short one.\n{MARKER}\nLong one here.") == ("Short one.", "Long one here.")
    assert split_marked("### Part 1\nShort.\n**PART 2**\nLong.") == ("Short.", "Long.")
    assert split_marked("no marker at all") == ("no marker at all", "")
    # no marker: the first blank line separates the parts; later blank lines stay inside part 2
    assert split_marked("\n\nShort one.\n  \nLong one.\n\nMore of it.") == ("Short one.", "Long one.\n\nMore of it.")
    assert split_marked("One line.\nNext line, same paragraph.") == ("One line.\nNext line, same paragraph.", "")
    # the marker wins over an earlier blank line
    assert split_marked(f"Short.\n\nStill part one.\n{MARKER}\nLong.") == ("Short.\n\nStill part one.", "Long.")
    single = envs.make("tldr", num_agents=1)
    row = _packaged_row("tldr", 2)
    c1, c2 = HONEST[("tldr", 2)]
    both = envs.make("tldr").reward_func([c1], [c2], batch_items=[row])[0]
    assert single.reward_func([f"{c1}\n{MARKER}\n{c2}"], batch_items=[row])[0] == both > 2.5
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
    row = _packaged_row("arxiv", 0)
    out = envs.make("arxiv", jaccard_cap=0.23).reward_func.score(*HONEST[("arxiv", 0)], batch_items=[row])[0]
    jac, cats = out["metric/jaccard"], int(out["metric/transition_categories"])
    assert 0.03 < jac < 0.23 and cats == 6
    assert out["level/style"] == pytest.approx(0.4 * transition_score(cats) + 0.6 * jac / 0.23)
    with pytest.raises(ValueError, match="jaccard_cap"):
        envs.make("tldr", jaccard_cap=0)


# --- the hack set: cheap answers that do not summarise / introduce the text score clearly below honest work --------

HONEST = {  # (env, packaged row index): hand-written honest answers (agent 1, agent 2)
    ("tldr", 0): (
        "The poster argues that corporations already enjoy the Bill of Rights protections that people have, and that "
        "ordinary citizens should want it that way.",
        "The poster argues that corporations are already treated as people under the Bill of Rights, and moreover "
        "that ordinary owners benefit from this. For instance, his house belongs to a realty company, yet it still "
        "cannot be searched without a warrant. Similarly, his roommate's small repair business can demand a jury and "
        "keeps due process for its property. The only exception is bearing arms; however, that limit is anatomical "
        "rather than constitutional.",
    ),
    ("tldr", 2): (
        "The poster has a crush on a woman in the other building of his company, but she has been in a relationship "
        "for over seven years.",
        "The poster started working at an institute a few months ago and developed a crush on a woman in the "
        "company's other building. Although he knows little about her, her constant smiles make his days. However, "
        "she seems to have been in a relationship for more than seven years. Meanwhile, he recently ended his own "
        "seven-year relationship, so he feels hopeful but also insecure.",
    ),
    ("arxiv", 0): (
        "Pairs of photons with large invariant mass are among the cleanest final states that can be observed at "
        "hadron colliders. They are produced directly in quantum chromodynamics (QCD) through quark-antiquark "
        "annihilation, gluon-quark scattering and gluon-gluon fusion, and they form the dominant irreducible "
        "background to the search for a light Higgs boson decaying into two photons. Understanding their production "
        "precisely is therefore essential for experiments at the Fermilab Tevatron and at the Large Hadron Collider. "
        "However, fixed-order perturbative calculations describe the transverse momentum of the photon pair poorly "
        "when it is small, because soft and collinear gluons radiated from the incoming partons produce large "
        "logarithms that must be summed to all orders. Earlier studies either neglected some subprocesses or treated "
        "this initial-state radiation only approximately, which leaves the predictions uncertain in exactly the "
        "region where most events lie. A complete and fully differential description has been missing.",
        "In this work we present a fully differential calculation of massive photon pair production that combines "
        "all next-to-leading order contributions with the resummation of initial-state gluon radiation. "
        "Specifically, we include the quark-antiquark, gluon-quark and gluon-gluon subprocesses, and we sum the "
        "logarithms of soft and collinear emission to next-to-next-to-leading logarithmic accuracy. As a result, the "
        "calculation remains reliable across the whole transverse momentum spectrum, and we identify the region of "
        "phase space in which its predictions can be trusted most. We then compare the results with measurements "
        "from the CDF and D0 collaborations at the Tevatron, finding good agreement, and we make predictions for "
        "more detailed tests with future data. Furthermore, we present distributions of diphoton pairs at the "
        "energy of the LHC, where the larger gluon flux makes the gluon-gluon channel considerably more important. "
        "Finally, we contrast the diphoton pairs produced in QCD processes with those from the decay of a Higgs "
        "boson. These comparisons show that careful selection of events, for example through cuts on the transverse "
        "momentum and the angular distribution of the photons, can enhance the sensitivity to the signal. "
        "Consequently, the method offers a practical tool for experimental searches and for precise tests of "
        "perturbative QCD at hadron colliders.",
    ),
    ("arxiv", 1): (
        "Sparse graphs, in which every subset of vertices spans only a limited number of edges, arise naturally in "
        "rigidity theory, where the (k,l)-sparsity conditions characterize the generic rigidity of bar-and-joint "
        "frameworks in the plane. They are also closely tied to classical questions about decomposing a graph into "
        "forests, such as the arboricity results of Tutte and Nash-Williams. Because of these connections, sparse "
        "graphs have received increased attention in recent years, both from mathematicians studying matroids and "
        "from computer scientists who need efficient algorithms for recognizing them. Pebble games, simple greedy "
        "procedures that test whether a graph is sparse, have proved especially useful for such algorithms. "
        "However, the existing pebble games answer only whether a graph is sparse; they do not directly reveal the "
        "structure of the graph, such as its decomposition into trees, and their relationship to other sparse graph "
        "algorithms has remained unclear. A unified algorithmic view of sparsity and tree decompositions is "
        "therefore still missing.",
        "To address this gap, the paper introduces a new algorithm, the (k,l)-pebble game with colors, which extends "
        "the standard pebble game by assigning a color to every pebble placed on an edge. The colors record which "
        "tree each edge belongs to, so the game not only decides whether a graph is sparse but also builds a "
        "decomposition of its edges into trees as it runs. Using this algorithm, the authors obtain a new "
        "characterization of the family of (k,l)-sparse graphs and give algorithmic solutions to several problems "
        "concerning tree decompositions. The colored version extends and sharpens earlier work by Lee and Streinu, "
        "and it also gives a fresh proof of the arboricity theorem of Tutte and Nash-Williams. Moreover, the paper "
        "presents a new decomposition that certifies sparsity directly from the final state of the colored game. "
        "Finally, the work exposes connections between pebble game algorithms and earlier sparse graph algorithms "
        "by Gabow, by Gabow and Westermann, and by Hendrickson, which suggests that these approaches can be "
        "understood within one framework. As a consequence, the results offer both simpler proofs and practical "
        "algorithms for rigidity theory and for graph decomposition problems.",
    ),
}
TRANSITION_LIST = (
    "Moreover, however, as a result, for instance, first, indeed, in summary, similarly, although, if, meanwhile, "
    "that is."
)
GENERIC = {
    "tldr": (
        "The poster describes a personal situation and asks the community for advice on what to do next.",
        "The poster describes a difficult personal situation in considerable detail. Moreover, they explain how the "
        "problem began and why it matters to them; however, they are unsure what to do. As a result, they ask the "
        "community for advice. For instance, they wonder whether to act now or wait, and ultimately they hope that "
        "other people who faced something similar can share useful experience.",
    ),
    "arxiv": (
        "This paper studies an important problem that has attracted considerable attention in recent years. Despite "
        "significant progress, existing approaches suffer from several limitations, and a complete understanding is "
        "still missing. Moreover, the problem is relevant to many applications in science and engineering, which "
        "makes it both timely and important. However, previous work has focused on special cases, and the general "
        "setting remains poorly understood. For instance, many methods rely on strong assumptions that rarely hold "
        "in practice, and as a result their conclusions are limited. In this context, a careful and systematic "
        "treatment of the problem is needed. Furthermore, the relationship between theory and practice has not been "
        "clarified, and researchers lack reliable tools. Therefore, addressing these questions is a central "
        "motivation for the present work, and it could benefit a broad community of researchers.",
        "In this work we propose a new approach that addresses these limitations in a principled way. First, we "
        "develop a general framework that captures the essential features of the problem. Then, we derive the main "
        "results and show how they apply to a wide range of settings. Moreover, we present detailed experiments and "
        "comparisons with previous methods, which demonstrate clear improvements. However, we also discuss the "
        "limitations of our approach and identify open questions for future research. As a result, our findings "
        "provide new insight into the problem and suggest practical guidelines for its solution. For instance, the "
        "framework can be extended to related problems, and the techniques may be of independent interest. In "
        "summary, this work offers both theoretical understanding and practical tools, and it opens several "
        "directions for further investigation by the community.",
    ),
}


def _gibberish(n, seed):
    import random

    rng = random.Random(seed)
    return " ".join(
        "".join(rng.choice("bcdfghjklmnpqrstvwxz") + rng.choice("aeiou") for _ in range(rng.randint(2, 4)))
        for _ in range(n)
    )


def _sentences(text):
    import re

    return re.split(r"(?<=[.!?])\s+", text.strip())


def writing_hacks(name, row, honest):
    """Answers a policy under reward pressure could try instead of summarising (tldr) or introducing (arxiv)."""
    import re

    env = envs.make(name)
    source = env._text(row)
    p1, p2 = (fmt(row) for fmt in env.formatters())
    hint1, hint2 = p1.split("\n\n")[0], p2.split("\n\n")[0]
    h1, h2 = honest
    words = source.split()
    keywords = list(dict.fromkeys(w.lower() for w in re.findall(r"[A-Za-z]{4,}", source)))
    long = name == "arxiv"  # arxiv wants 128-256 tokens per part
    n1, n2 = (140, 190) if long else (20, 60)
    return {
        "empty": ("", ""),
        "whitespace": (" \n ", "\t "),
        "echo the role hints": ((hint1 + " ") * (3 if long else 1), (hint2 + " ") * (4 if long else 1)),
        "echo the whole prompts": (p1, p2),
        "agent 2 echoes its role hint": (h1, (hint2 + " ") * (4 if long else 1)),
        "copy the text": (" ".join(words[:n1]), " ".join((words * 3)[: int(n2 * 1.1)])),
        "agent 2 repeats agent 1": (h1, " ".join([h1] * 3)),
        "one sentence repeated": (_sentences(h1)[0], " ".join([_sentences(h1)[0]] * 4)),
        "keyword stuffing": (" ".join((keywords * 9)[:n1]), " ".join((keywords * 9)[:n2])),
        "generic text for any input": GENERIC[name],
        "transition words and keywords": (h1, TRANSITION_LIST + " " + " ".join(keywords[:n2])),
        "gibberish of the right length": (_gibberish(n1, 1), _gibberish(n2, 2)),
        "the same text twice": (h2, h2),
    }


def _writing_reward(name, row):
    env = envs.make(name)
    return lambda c1, c2: env.reward_func.score([c1], [c2], batch_items=[row])[0]["reward"]


def _packaged_row(name, index):
    return envs.make(name).load_dataset()[index]


@pytest.mark.parametrize("key", list(HONEST), ids=lambda k: f"{k[0]}-{k[1]}")
def test_writing_hacks_score_clearly_below_honest_work(key):
    name, index = key
    row = _packaged_row(name, index)
    reward = _writing_reward(name, row)
    honest = reward(*HONEST[key])
    assert honest >= 2.5, f"{name} row {index}: the honest answer scores only {honest:.3f}"
    for hack, (c1, c2) in writing_hacks(name, row, HONEST[key]).items():
        got = reward(c1, c2)
        assert got <= 0.5, f"{name} row {index}: hack '{hack}' scores {got:.3f} (honest {honest:.3f})"
    # swapped roles do the task, in the other order: tldr stops at the length ratio, arxiv (which allows a ratio
    # from 0.8) keeps less than honest work
    assert reward(*reversed(HONEST[key])) <= (0.5 if name == "tldr" else honest - 0.4)


@pytest.mark.parametrize("key", list(HONEST), ids=lambda k: f"{k[0]}-{k[1]}")
def test_writing_hacks_added_to_honest_work_do_not_raise_it(key):
    """Neither appended to both answers nor to agent 2's alone, to an honest answer or to one whose agent 2 wrote too
    little (so padding its length would pay if it counted); an addition is cut to the room left under 250 tokens, so
    the structure's 256-token bound does not hide it."""
    name, index = key
    row = _packaged_row(name, index)
    reward = _writing_reward(name, row)
    env = envs.make(name)
    h1, h2 = HONEST[key]
    short = {  # agent 2 stops early: too short for the full length level
        ("tldr", 0): _sentences(h2)[0] + " For instance, his house belongs to a realty company.",
        ("tldr", 2): " ".join(_sentences(h2)[:2]),
    }
    bases = [HONEST[key], (h1, short.get(key, " ".join(_sentences(h2)[:-2])))]
    lengths = [env.reward_func.score([c1], [c2], batch_items=[row])[0]["level/length"] for c1, c2 in bases]
    assert any(0 < x < 1 for x in lengths)  # padding agent 2 would pay if it counted

    def add(text, more):
        return text + "\n" + " ".join(more.split()[: max(0, 250 - len(text.split()))])

    for base in bases:
        honest = reward(*base)
        for hack, (a, b) in writing_hacks(name, row, base).items():
            if hack == "generic text for any input":  # the known limit: test_generic_text_counts_only_by_chance
                continue
            for c1, c2 in ((add(base[0], a), add(base[1], b)), (base[0], add(base[1], b))):
                got = reward(c1, c2)
                assert got <= honest + 1e-9, f"{name} row {index}: adding '{hack}' raises {honest:.3f} to {got:.3f}"


def test_generic_text_counts_only_by_chance():
    """The known limit of a bag-of-words check: a generic sentence counts when its topic words happen to be a
    quarter from the text (abstracts share boilerplate like "attention in recent years"). Alone such text scores
    nothing, but a counted sentence or two added to an honest arxiv answer can move its length ratio."""
    for name, count in (("tldr", 100), ("arxiv", 200)):
        env = envs.make(name)
        rows = env.load_dataset()
        counted = total = 0
        for row in rows:
            for text in GENERIC[name]:
                total += len(_sentences(text))
                counted += len(counted_sentences(text, env.task_context(row)))
        assert len(rows) == count and counted / total < 0.08, f"{name}: {counted} of {total} generic sentences count"
        c1, c2 = GENERIC[name]
        assert max(env.reward_func([c1] * count, [c2] * count, batch_items=list(rows))) <= 0.5


POST = (
    "POST: My landlord kept my whole security deposit after I moved out of the apartment, claiming the carpet was "
    "damaged, although it was already worn when I moved in. Should I take him to small claims court?"
)
CONTEXT = task_context(POST, [f"Summarize the post below.\n\n{POST}\n\nSummary:"])


@pytest.mark.parametrize(
    "sentence, counts",
    [
        ("The landlord withheld the deposit over a carpet that was worn before the tenant arrived.", True),
        ("This is a difficult situation that many people face today.", False),  # about nothing in the post
        ("My landlord kept my whole security deposit after I moved out.", False),  # copied from the post
        ("The landlord kept the whole security deposit, claiming the carpet was damaged.", True),  # the post's
        # things in the post's words: short shared phrases, no clause copied
        ("The tenant wonders whether small claims court is worth it over a worn carpet.", True),
        ("Although it was already worn when I moved in, should I take him to small claims court?", False),  # two
        # clauses of the post copied
        ("Summarize the post below.", False),  # the instructions echoed
        ("landlord deposit carpet damaged apartment worn security court claims", False),  # a keyword list
        ("landlord kept whole security deposit after moved apartment claiming carpet damaged although", False),  # the
        # post's own words rearranged (nothing in the writer's words)
        ("The tenant asks whether small claims court could recover the deposit " + "and the carpet " * 20, False),
    ],
)
def test_which_sentences_count(sentence, counts):
    assert counted_sentences(sentence, CONTEXT) == ([sentence] if counts else [])


def test_summary_in_the_posts_words_counts():
    """A TL;DR names the post's things in the post's words; only a copied clause or sentence is left out."""
    env = envs.make("tldr")
    context = env.task_context(_packaged_row("tldr", 71))  # a friend from HR turning to life coaching
    for summary in (
        "A friend with an HR background wants to grow her life coaching client base.",
        "A friend in HR turned life coach wants to attract younger professionals.",
        "She hopes to reach younger professionals who feel stuck in a rut.",
    ):
        assert counted_sentences(summary, context) == [summary]
    for copied in (
        "She has been building her client base, but it has been slow going.",  # a post sentence
        "I believe she has been doing life coaching for a while now.",  # most of one, cut short
        "She wants to target younger professionals that may be stuck in a rut and asked me how.",  # a long clause
        "friend long background group facilitator collaboration believe doing life coaching while",  # its words,
        # short ones dropped
    ):
        assert counted_sentences(copied, context) == [], copied


def test_copied_runs_follow_the_prompts_order_with_short_gaps():
    positions = word_positions(["one two three four five six", "seven eight"])
    assert copied_runs(["one", "three", "five", "new"], positions, 3, 1) == [True, True, True, False]  # 1 word left out
    assert copied_runs(["one", "three", "five", "new"], positions, 3, 0) == [False] * 4  # verbatim runs only
    assert copied_runs(["one", "four", "six"], positions, 3, 1) == [False] * 3  # two words left out: no run
    assert copied_runs(["five", "six", "seven", "eight"], positions, 3, 3) == [False] * 4  # no run joins two prompts
    assert copied_runs(["three", "two", "one"], positions, 2, 3) == [False] * 3  # out of order


HONEST_PAIRS = Path(__file__).parents[1] / "data" / "tldr_honest_pairs.json"


def test_hand_written_honest_tldr_pairs_count():
    """Honest pairs of two styles (close to the post's wording, paraphrased) for 24 packaged posts, written without
    regard to the rule (not tuned to pass it): at least 90% of them score (benchmarks/bench_tldr_honest.py prints the rates)."""
    data = json.loads(HONEST_PAIRS.read_text())["pairs"]
    env = envs.make("tldr")
    rows = env.load_dataset()
    assert len({p["row"] for p in data}) >= 20 and all(
        rows[p["row"]]["prompt"].startswith(p["post_start"]) for p in data
    )
    scores = env.reward_func.score(
        [p["concise"] for p in data], [p["detailed"] for p in data], batch_items=[rows[p["row"]] for p in data]
    )
    for style in ("close", "paraphrase"):
        picked = [s for p, s in zip(data, scores) if p["style"] == style]
        counted = sum(s["reward"] > 0 for s in picked) / len(picked)
        concise = sum(s["metric/counted_1"] for s in picked) / len(picked)
        assert counted >= 0.9 and concise >= 0.9, f"{style}: {counted:.0%} of pairs, {concise:.0%} of agent 1 counted"
    assert sum(s["reward"] > 0 for s in scores) / len(scores) >= 0.9


def test_repeated_and_teammate_sentences_do_not_count():
    own = "The landlord withheld the deposit over a carpet that was worn before the tenant arrived."
    more = "The tenant wonders whether small claims court is worth it."
    assert counted_sentences(f"{own} {own} {more}", CONTEXT) == [own, more]  # the repeat is left out
    assert counted_sentences(f"{own} {more}", CONTEXT, before=own) == [more]  # agent 2 repeating agent 1
    assert counted_sentences("Deposit kept. Deposit kept. Deposit kept.", CONTEXT) == ["Deposit kept."]
    # no source: the sentences are not checked for being about it, the rest still is
    generic = "This is a difficult situation that many people face today."
    assert counted_sentences(f"{generic} {generic}", task_context(None)) == [generic]
    assert stem("searched") == stem("searches") == stem("search") and stem("smiling") == stem("smile")
    assert stem("considerable") != stem("considerations")


def test_transitions_count_two_per_counted_sentence():
    listed = "Moreover, however, as a result, for instance, indeed, the landlord kept the deposit, refusing any refund."
    assert sentence_transitions(listed, 2) == ["elaboration", "contrast"]
    assert len(transition_categories(listed)) == 5  # the published count: every category anywhere
    row = {"prompt": POST}
    c1 = "The landlord kept the deposit over a worn carpet."
    c2 = (
        "The tenant moved out, and the landlord then withheld the entire deposit. However, the landlord blamed "
        "damage to the carpet, which was already worn at move-in. " + listed
    )
    out = envs.make("tldr").reward_func.score([c1], [c2], batch_items=[row])[0]
    assert out["metric/counted_2"] == 1.0
    # sequence ("then"), contrast ("However"), then the list's first two: elaboration and contrast again
    assert out["metric/transition_categories"] == 3
    assert score_writing(c1, c2, TLDR_TIERS)["metric/transition_categories"] == 6  # uncapped


def test_structure_bounds_what_was_written():
    row = _packaged_row("tldr", 0)
    reward = _writing_reward("tldr", row)
    c1, c2 = HONEST[("tldr", 0)]
    assert reward(c1, c2) > 2.5
    assert reward(c1, c2 + " " + _gibberish(200, 3)) == 0.0  # 256 tokens at most, counted or not
    assert reward("Corporations are people.", c2) == 0.0  # agent 1 needs 8 tokens in counted sentences


def test_scoring_without_the_source_warns(caplog):
    env = envs.make("tldr")
    c1, c2 = HONEST[("tldr", 0)]
    with caplog.at_level("WARNING", logger="comlrl.envs.writing"):
        out = env.reward_func.score([c1], [c2])[0]
        env.reward_func.score([c1], [c2])
    assert out["reward"] > 2.5 and caplog.text.count("without the source text") == 1
