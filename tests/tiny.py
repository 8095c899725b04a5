"""Tiny offline models, tokenizers and token batches for fast tests (no network, built from a config)."""

from __future__ import annotations

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

SPECIALS = ["<pad>", "<s>", "</s>"]
PAD_ID = SPECIALS.index("<pad>")


def tiny_tokenizer(pad_is_eos: bool = False) -> PreTrainedTokenizerFast:
    """A byte-level tokenizer: 3 special tokens then one token per byte (vocab 259)."""
    byte_chars = pre_tokenizers.ByteLevel.alphabet()
    vocab = {tok: i for i, tok in enumerate(SPECIALS)}
    for ch in sorted(byte_chars):
        vocab[ch] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="</s>" if pad_is_eos else "<pad>",
    )
    hf.chat_template = (
        "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}</s>{% endfor %}"
        "{% if add_generation_prompt %}<s>assistant: {% endif %}"
    )
    return hf


def tiny_model(seed: int = 0, vocab_size: int = 259, layers: int = 2, hidden: int = 32) -> LlamaForCausalLM:
    """A 2-layer Llama with random weights, small enough for CPU unit tests."""
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        tie_word_embeddings=False,
    )
    return LlamaForCausalLM(cfg)


def grouped_batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(prompt ids, prompt mask, completion ids, completion mask) of 7 rows over 3 distinct prompts (groups of 3, 3
    and 1, rows interleaved), one prompt left-padded, one completion cut short by padding."""
    torch.manual_seed(5)
    prompts = torch.randint(3, 259, (3, 6))
    p_mask = torch.ones(3, 6, dtype=torch.long)
    p_mask[1, :2] = 0
    prompts[1, :2] = PAD_ID
    group = torch.tensor([0, 1, 0, 0, 1, 1, 2])
    c_ids = torch.randint(3, 259, (7, 5))
    c_mask = torch.ones(7, 5, dtype=torch.long)
    c_mask[2, 3:] = 0
    c_ids[2, 3:] = PAD_ID
    return prompts[group], p_mask[group], c_ids, c_mask
