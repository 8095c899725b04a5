"""The joint reward model (stage 2 of multi-agent RLHF): build, score, train, hold out, reward, save and load."""

import random
import string

import pytest
import torch
from tiny import tiny_model, tiny_tokenizer
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from comlrl.algorithms.preference import bradley_terry_loss
from comlrl.engine.critic import encode_texts, joint_action_text
from comlrl.engine.reward_model import (
    JointRewardModel,
    RewardModelReward,
    attention_targets,
    build_reward_model,
    joint_texts,
    load_reward_model,
    save_reward_model,
    score_joint,
    score_stats,
)
from comlrl.engine.reward_pairs import check_readable, readable_pairs, split_pairs_by_prompt
from comlrl.engine.rewards import compute_rewards
from comlrl.engine.team import build_lora_team
from comlrl.errors import ConfigError, RewardError
from comlrl.trainers.reward_model import train_reward_model


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models gain nothing from threads; one keeps timings steady on a shared 2-core machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def word(rng: random.Random, lo: int, hi: int) -> str:
    return "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(lo, hi)))


def length_pairs(n: int, seed: int, first_row: int) -> list[dict]:
    """2 agents, one pair per prompt row; chosen answers 6-12 letters each, rejected ones 1-4 letters."""
    rng = random.Random(seed)
    return [
        {
            "row": first_row + k,
            "prompts": [word(rng, 3, 8), word(rng, 3, 8)],
            "chosen": [word(rng, 6, 12), word(rng, 6, 12)],
            "rejected": [word(rng, 1, 4), word(rng, 1, 4)],
            "round": 0,  # other keys are ignored
        }
        for k in range(n)
    ]


# 3 joint actions of 2 agents, of different lengths (one empty answer, one empty prompt)
PROMPTS = [["abc", "q" * 20, "z"], ["de", "", "y"]]
ANSWERS = [["hello world", "x", "zz"], ["x", "abcdefghijklmn", ""]]


def perturbed(model: JointRewardModel, seed: int = 1) -> JointRewardModel:
    """Move every trainable weight a little, so LoRA's zero-initialized B matrices count in the scores."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.trainable_parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    return model


def word_tokenizer(lowercase: bool = False) -> PreTrainedTokenizerFast:
    """A word-level tokenizer over 8 tokens with an unknown token (and optionally a lowercasing normalizer)."""
    vocab = {w: i for i, w in enumerate(["[UNK]", "<pad>", "</s>", "hello", "world", "good", "answer", ","])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    if lowercase:
        tok.normalizer = normalizers.Lowercase()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="<pad>", eos_token="</s>")


# ----------------------------------------------------------------------------------------------- acceptance


def test_learns_longer_joint_answer_preferred_on_held_out_prompts():
    train, held_out = length_pairs(150, seed=1, first_row=0), length_pairs(50, seed=2, first_row=1000)
    assert not {p["row"] for p in train} & {p["row"] for p in held_out}
    model, tok = build_reward_model(tiny_model(seed=0), tiny_tokenizer(), training="lora", seed=0)
    metrics = train_reward_model(
        model,
        tok,
        train,
        held_out,
        epochs=4,
        learning_rate=3e-3,
        batch_size=16,
        max_length=256,
        seed=0,
        disable_tqdm=True,
    )
    assert metrics["reward_model/eval_accuracy"] > 0.9
    assert metrics["reward_model/pairs"] == 150 and metrics["reward_model/eval_pairs"] == 50
    assert metrics["reward_model/eval_loss"] < 0.5  # -log sigmoid(0) = 0.693 is chance
    assert set(metrics) == {
        "reward_model/train_loss",
        "reward_model/train_accuracy",
        "reward_model/eval_loss",
        "reward_model/eval_accuracy",
        "reward_model/pairs",
        "reward_model/eval_pairs",
    }


# ------------------------------------------------------------------------------------------------- training


def test_bradley_terry_training_lowers_the_loss_and_leaves_the_source_model_alone():
    pairs = length_pairs(24, seed=3, first_row=0)
    source = tiny_model(seed=2)
    before_source = {k: v.clone() for k, v in source.state_dict().items()}
    model, tok = build_reward_model(source, tiny_tokenizer(), training="full", seed=0)

    def loss() -> float:
        def side(key: str) -> torch.Tensor:
            return score_joint(
                model,
                tok,
                [[p["prompts"][i] for p in pairs] for i in range(2)],
                [[p[key][i] for p in pairs] for i in range(2)],
            )

        return bradley_terry_loss(side("chosen"), side("rejected")).item()

    start = loss()
    metrics = train_reward_model(
        model, tok, pairs, [], epochs=2, learning_rate=1e-3, batch_size=8, max_length=256, seed=0, disable_tqdm=True
    )
    end = loss()
    assert end < start - 0.05
    assert metrics["reward_model/eval_pairs"] == 0 and "reward_model/eval_accuracy" not in metrics
    assert 0 < metrics["reward_model/train_loss"] < 1.0
    # the reward model trained a deep copy: the caller's model has its own, unchanged weights
    assert model.backbone is not source
    for k, v in source.state_dict().items():
        assert torch.equal(v, before_source[k]), k


def test_training_is_reproducible_under_a_seed():
    pairs = length_pairs(12, seed=4, first_row=0)
    kw = dict(epochs=1, learning_rate=1e-3, batch_size=4, max_length=128, seed=7, disable_tqdm=True)
    runs = []
    for _ in range(2):
        model, tok = build_reward_model(tiny_model(seed=0), tiny_tokenizer(), training="full", seed=3)
        train_reward_model(model, tok, pairs, None, **kw)
        runs.append(score_joint(model, tok, PROMPTS, ANSWERS))
    torch.testing.assert_close(runs[0], runs[1], rtol=0, atol=0)


def test_bad_pair_records_are_named():
    model, tok = build_reward_model(tiny_model(), tiny_tokenizer(), training="head")
    kw = dict(epochs=1, learning_rate=1e-3, batch_size=4, max_length=64, seed=0, disable_tqdm=True)
    with pytest.raises(ConfigError, match="pairs is empty"):
        train_reward_model(model, tok, [], [], **kw)
    good = length_pairs(3, seed=0, first_row=0)
    missing = [good[0], {k: v for k, v in good[1].items() if k != "rejected"}]
    with pytest.raises(ConfigError, match=r"pairs\[1\] has no key 'rejected'"):
        train_reward_model(model, tok, missing, [], **kw)
    short = [good[0], good[1], {**good[2], "chosen": ["only one"]}]
    with pytest.raises(ConfigError, match=r"pairs\[2\]\['chosen'\] has 1 entries, expected one per agent \(2\)"):
        train_reward_model(model, tok, short, [], **kw)
    with pytest.raises(ConfigError, match=r"eval_pairs\[0\]\['prompts'\]\[1\] \(agent 2\) is int"):
        train_reward_model(model, tok, good, [{**good[0], "prompts": ["a", 3]}], **kw)


# -------------------------------------------------------------------------------------------------- scoring


def test_score_joint_shape_no_grad_and_batch_size_invariance():
    model, tok = build_reward_model(tiny_model(seed=1), tiny_tokenizer(), training="full", seed=0)
    model.train()
    one = score_joint(model, tok, PROMPTS, ANSWERS, batch_size=1)
    all_at_once = score_joint(model, tok, PROMPTS, ANSWERS, batch_size=16)
    assert one.shape == (3,) and all_at_once.shape == (3,)
    assert not all_at_once.requires_grad and not model.training
    # left padding with positions from the mask: a text's score does not depend on what it is batched with
    torch.testing.assert_close(one, all_at_once, rtol=0, atol=1e-5)
    assert len(set(all_at_once.tolist())) == 3
    # the same when the pad token is the EOS the head reads (what load_tokenizer sets when a tokenizer has no pad)
    eos_pad = tiny_tokenizer(pad_is_eos=True)
    torch.testing.assert_close(score_joint(model, eos_pad, PROMPTS, ANSWERS, batch_size=1), one, rtol=0, atol=1e-5)
    torch.testing.assert_close(score_joint(model, eos_pad, PROMPTS, ANSWERS), one, rtol=0, atol=1e-5)
    assert score_joint(model, tok, [[], []], [[], []]).shape == (0,)


def test_joint_texts_end_with_eos_and_the_head_reads_it():
    tok = tiny_tokenizer()
    texts = joint_texts(tok, PROMPTS, ANSWERS)
    assert texts[1] == joint_action_text(["q" * 20, ""], ["x", "abcdefghijklmn"]) + "</s>"
    ids, mask = encode_texts(tok, texts, max_length=16)  # truncation drops the start, never the end token
    assert (ids[:, -1] == tok.eos_token_id).all() and (mask[:, -1] == 1).all()
    with pytest.raises(ConfigError, match="answers of agent 2 has 2 entries for 3"):
        joint_texts(tok, PROMPTS, [ANSWERS[0], ANSWERS[1][:2]])


def test_build_modes_train_the_right_parameters():
    assert attention_targets(tiny_model()) == (["q_proj", "v_proj"], False)
    lora, _ = build_reward_model(tiny_model(), tiny_tokenizer(), training="lora", lora_r=2)
    names = [n for n, p in lora.named_parameters() if p.requires_grad]
    assert set(names) == {n for n in names if "lora_" in n or n.startswith("head.")}
    assert any(".q_proj.lora_A." in n for n in names) and any(".v_proj.lora_B." in n for n in names)
    assert {id(p) for p in lora.trainable_parameters()} == {id(p) for n, p in lora.named_parameters() if n in names}
    head, _ = build_reward_model(tiny_model(), tiny_tokenizer(), training="head")
    assert [id(p) for p in head.trainable_parameters()] == [id(p) for p in head.head.parameters()]
    full, _ = build_reward_model(tiny_model(), tiny_tokenizer(), training="full")
    assert len(full.trainable_parameters()) == len(list(full.parameters()))
    with pytest.raises(ConfigError, match="training='adapter' is unknown"):
        build_reward_model(tiny_model(), tiny_tokenizer(), training="adapter")


# ------------------------------------------------------------------------------------------------- held out


def test_split_pairs_by_prompt_holds_out_whole_rows():
    pairs = [{"row": r, "prompts": [], "chosen": [], "rejected": [], "k": k} for r in range(10) for k in range(3)]
    train, held = split_pairs_by_prompt(pairs, eval_fraction=0.3, seed=5)
    train_rows, held_rows = {p["row"] for p in train}, {p["row"] for p in held}
    assert not train_rows & held_rows and train_rows | held_rows == set(range(10))
    assert len(held_rows) == 3 and len(train) + len(held) == 30
    assert [p for p in pairs if p in held] == held  # the pairs' order is kept
    assert split_pairs_by_prompt(pairs, 0.3, seed=5) == (train, held)
    two = [{"row": 4}, {"row": 9}, {"row": 4}]
    for fraction in (0.01, 0.99):  # at least one row on each side
        t, h = split_pairs_by_prompt(two, fraction, seed=0)
        assert len({p["row"] for p in t}) == 1 and len({p["row"] for p in h}) == 1
    with pytest.raises(ConfigError, match="at least 2 distinct rows, got 1"):
        split_pairs_by_prompt([{"row": 1}, {"row": 1}], 0.5, seed=0)
    with pytest.raises(ConfigError, match=r"pairs\[1\] has no key 'row'"):
        split_pairs_by_prompt([{"row": 1}, {}], 0.5, seed=0)
    with pytest.raises(ConfigError, match="eval_fraction"):
        split_pairs_by_prompt(pairs, 1.0, seed=0)


# ----------------------------------------------------------------------------------------------- readability


def test_check_readable_names_the_agent_and_quotes_the_text():
    tok = word_tokenizer()
    check_readable(tok, [["hello world", "good answer"], ["hello, world", "[UNK] answer"]])  # a literal [UNK] is read
    with pytest.raises(ConfigError, match=r"agent 2: .*cannot read text 1: 'hello zebra world' .* at 'zebra'"):
        check_readable(tok, [["hello world"], ["good answer", "hello zebra world"]])
    with pytest.raises(ConfigError, match=r"agent 1: .*loses characters near 'good Answer' \(decoded: 'good answer'\)"):
        check_readable(word_tokenizer(lowercase=True), [["good Answer"], ["hello"]])
    check_readable(tiny_tokenizer(), [["déjà vu ✓\n\tdef f():"], ["日本語"]])  # byte-level reads anything


# --------------------------------------------------------------------------------------------------- reward


def task_reward(a1: list[str], a2: list[str]) -> list[float]:
    """Total answer length in characters (called once per joint action)."""
    return [float(len(x) + len(y)) for x, y in zip(a1, a2)]


def test_reward_model_reward_mixes_a_task_reward():
    model, tok = (
        perturbed(build_reward_model(tiny_model(seed=3), tiny_tokenizer(), training="full")[0]),
        tiny_tokenizer(),
    )
    rm = score_joint(model, tok, PROMPTS, ANSWERS).tolist()
    plain = RewardModelReward(model, tok)
    assert plain.batched is True
    assert plain(*ANSWERS, prompts=PROMPTS) == pytest.approx(rm, abs=1e-6)
    mixed = RewardModelReward(model, tok, task_reward=task_reward, task_weight=0.5)
    # task lengths: 11 + 1 = 12, 1 + 14 = 15, 2 + 0 = 2
    expected = [rm[0] + 0.5 * 12, rm[1] + 0.5 * 15, rm[2] + 0.5 * 2]
    assert mixed(*ANSWERS, prompts=PROMPTS) == pytest.approx(expected, abs=1e-6)
    # as the trainer calls it: one batched call, levels reported per joint action
    rewards, levels = compute_rewards(mixed, ANSWERS, prompts=PROMPTS, batch_items=[{}] * 3, row_ids=[7, 8, 9])
    assert rewards == pytest.approx(expected, abs=1e-6)
    assert [lv["level/task"] for lv in levels] == [12.0, 15.0, 2.0]
    assert [lv["level/reward_model"] for lv in levels] == pytest.approx(rm, abs=1e-6)
    with pytest.raises(RewardError, match="needs prompts="):
        mixed(*ANSWERS)


def test_reward_model_reward_skips_and_counts_text_its_tokenizer_cannot_read():
    """One odd sample must not end a long run: an unreadable joint action is not scored; it gets the neutral score
    (the normalizing mean: 0 after normalizing) and level/unreadable = 1."""
    tok = word_tokenizer()
    model, tok = build_reward_model(tiny_model(vocab_size=len(tok)), tok, training="head")
    prompts = [["hello", "hello", "hello"], ["world", "world", "zebra"]]
    answers = [["good answer", "hello", "good"], ["world", "good zebra", "world"]]
    raw = score_joint(model, tok, prompts, answers).tolist()
    plain = RewardModelReward(model, tok)
    out = plain.score(*answers, prompts=prompts)
    assert [d["level/unreadable"] for d in out] == [0.0, 1.0, 1.0]  # an answer, then a prompt, it cannot read
    assert [d["reward"] for d in out] == pytest.approx([raw[0], 0.0, 0.0], abs=1e-6)
    norm = RewardModelReward(model, tok, score_mean=0.5, score_std=2.0, normalize=True)
    out = norm.score(*answers, prompts=prompts)
    assert [d["reward"] for d in out] == pytest.approx([(raw[0] - 0.5) / 2.0, 0.0, 0.0], abs=1e-6)
    assert [d["level/reward_model_raw"] for d in out] == pytest.approx([raw[0], 0.5, 0.5], abs=1e-6)
    assert norm.unreadable == 2 and plain.unreadable == 2  # running counts


def test_readable_pairs_skip_and_count_the_pairs_a_tokenizer_cannot_read():
    tok = word_tokenizer()
    good = {"row": 0, "prompts": ["hello", "world"], "chosen": ["good answer", "hello"], "rejected": ["good", "a"]}
    pairs = [
        {**good, "rejected": ["good", "world"]},
        {**good, "row": 1, "chosen": ["good zebra", "hello"], "rejected": ["good", "world"]},  # an answer
        {**good, "row": 2, "prompts": ["hello", "zebra"], "rejected": ["good", "world"]},  # a prompt
        {**good, "row": 3, "rejected": ["good", "world"]},
    ]
    kept, skipped, why = readable_pairs(tok, pairs)
    assert [p["row"] for p in kept] == [0, 3] and skipped == 2
    assert "agent 1" in why and "zebra" in why
    assert readable_pairs(tiny_tokenizer(), pairs) == (pairs, 0, None)  # byte-level reads anything


def test_score_stats_are_the_mean_and_population_std():
    # scores 1, 2, 3, 6: mean 3; squared deviations 4, 1, 0, 9 -> variance 14 / 4 = 3.5, std 1.870829
    mean, std = score_stats(torch.tensor([1.0, 2.0, 3.0, 6.0]))
    assert mean == pytest.approx(3.0) and std == pytest.approx(1.8708287, rel=1e-6)
    assert score_stats(torch.tensor([2.0, 2.0])) == (pytest.approx(2.0), pytest.approx(1e-6))  # floored, no 1/0
    with pytest.raises(ConfigError, match="no scores"):
        score_stats(torch.empty(0))


def test_reward_model_reward_normalizes_with_the_given_statistic():
    model, tok = (
        perturbed(build_reward_model(tiny_model(seed=3), tiny_tokenizer(), training="full")[0]),
        tiny_tokenizer(),
    )
    raw = score_joint(model, tok, PROMPTS, ANSWERS)
    mean, std = score_stats(raw)
    reward = RewardModelReward(
        model, tok, task_reward=task_reward, task_weight=0.5, score_mean=mean, score_std=std, normalize=True
    )
    out = reward.score(*ANSWERS, prompts=PROMPTS)
    normed = [d["level/reward_model"] for d in out]
    assert normed == pytest.approx(((raw - mean) / std).tolist(), abs=1e-5)
    assert sum(normed) == pytest.approx(0.0, abs=1e-5)
    assert [d["reward"] for d in out] == pytest.approx([normed[0] + 6.0, normed[1] + 7.5, normed[2] + 1.0], abs=1e-5)


def test_reward_model_from_an_in_memory_model_with_lora_injected_has_no_adapter_layers():
    """A team's LoRA is injected into the caller's model in place; the reward model is built from a clean copy."""
    from peft import LoraConfig
    from peft.tuners.tuners_utils import BaseTunerLayer

    clean = tiny_model(seed=6)
    injected = tiny_model(seed=6)
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    build_lora_team([injected, injected], [0, 0], lora)  # the agents' adapters, in place
    for training in ("full", "lora"):
        model, tok = build_reward_model(injected, tiny_tokenizer(), training=training, seed=0)
        names = [n for n, _ in model.backbone.named_parameters()]
        assert not any("agent_" in n for n in names), [n for n in names if "agent_" in n][:3]
        if training == "full":
            assert not any(isinstance(m, BaseTunerLayer) for m in model.backbone.modules())
            assert not any("lora_" in n for n in names)
        want = build_reward_model(clean, tiny_tokenizer(), training=training, seed=0)[0]
        torch.testing.assert_close(score_joint(model, tok, PROMPTS, ANSWERS), score_joint(want, tok, PROMPTS, ANSWERS))
    assert any(isinstance(m, BaseTunerLayer) for m in injected.modules())  # the caller's model is untouched


# ---------------------------------------------------------------------------------------------- save / load


@pytest.mark.parametrize("training", ["lora", "head", "full"])
def test_save_load_round_trip_gives_identical_scores(tmp_path, training):
    model, tok = build_reward_model(tiny_model(seed=4), tiny_tokenizer(), training=training, seed=1)
    perturbed(model)
    want = score_joint(model, tok, PROMPTS, ANSWERS)
    path = tmp_path / "reward_model"
    save_reward_model(model, tok, path)
    save_reward_model(model, tok, path)  # replaces the first copy
    assert [p.name for p in tmp_path.iterdir()] == ["reward_model"]  # no temporary folder left behind
    loaded, loaded_tok = load_reward_model(path)
    assert loaded.mode == training and not loaded.training
    torch.testing.assert_close(score_joint(loaded, loaded_tok, PROMPTS, ANSWERS), want, rtol=0, atol=0)
    with pytest.raises(ConfigError, match="not a saved reward model"):
        load_reward_model(tmp_path)
