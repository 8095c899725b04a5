"""Value critics: a causal-LM backbone with a scalar head, and the texts critics read.

V(h) is read at the last token of the critic's input (left-padded batch, positions from the mask).
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ..accel.shapes import pad_tokens
from .logprobs import training_forward
from .rollout import left_pad


class ValueModel(nn.Module):
    """A scalar value head on a causal LM's last hidden state.

    With ``detach_backbone`` the head reads frozen features (a value head on an actor's backbone
    that the value loss must not move).
    """

    def __init__(self, backbone: PreTrainedModel, detach_backbone: bool = False) -> None:
        super().__init__()
        self.backbone = backbone
        self.detach_backbone = detach_backbone
        hidden = backbone.get_input_embeddings().weight.shape[1]
        self.head = nn.Linear(hidden, 1)
        nn.init.normal_(self.head.weight, std=1.0 / (hidden**0.5) * 0.1)
        nn.init.zeros_(self.head.bias)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """(B, T) left-padded ids and mask -> (B,) values."""
        position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)
        with torch.no_grad() if self.detach_backbone else training_forward(self.backbone):
            out = self.backbone(
                input_ids=input_ids,
                attention_mask=attention_mask,
                position_ids=position_ids,
                output_hidden_states=True,
                logits_to_keep=1,
                use_cache=False,
            )
        last = out.hidden_states[-1][:, -1, :]  # (B, H): the last position is the last real token (left padding)
        return self.head(last.float()).squeeze(-1)

    def trainable_parameters(self) -> list[nn.Parameter]:
        """Head only when the backbone is detached, else every parameter that requires grad."""
        if self.detach_backbone:
            return list(self.head.parameters())
        return [p for p in self.parameters() if p.requires_grad]


def encode_texts(
    tokenizer: PreTrainedTokenizerBase, texts: list[str], max_length: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded (ids, mask) for critic inputs, keeping the last ``max_length`` tokens; the width is a multiple of
    :data:`comlrl.accel.shapes.TOKENS` (masked padding, see :mod:`comlrl.accel.shapes`)."""
    seqs = [tokenizer(t, add_special_tokens=True)["input_ids"] for t in texts]
    if max_length:
        seqs = [s[-max_length:] for s in seqs]
    ids, mask = left_pad(seqs, tokenizer.pad_token_id)
    return pad_tokens(ids, mask, left=True, pad_id=tokenizer.pad_token_id)


def joint_state_text(prompts: list[str]) -> str:
    """What a centralized V critic reads: every agent's prompt, labelled."""
    return "\n\n".join(f"[Agent {i + 1} prompt]\n{p}" for i, p in enumerate(prompts))


def joint_action_text(prompts: list[str], answers: list[str]) -> str:
    """What a centralized Q critic reads: every agent's prompt, then every agent's answer."""
    return (
        joint_state_text(prompts) + "\n\n" + "\n\n".join(f"[Agent {i + 1} answer]\n{a}" for i, a in enumerate(answers))
    )
