"""Value critics: a causal-LM backbone with a scalar head, and the texts critics read.

V(h) is read at the last token of the critic's input (left-padded batch, positions from the mask).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ..accel.shapes import pad_tokens
from .logprobs import training_forward
from .models import left_pad

VALUE_HEAD_FILE = "value_head.pt"  # the head's state dict, under the reference library's ValueHead names
CRITIC_FILE = "comlrl_critic.json"  # where the backbone of a head saved apart from it lives
_HEAD_NAMES = {"weight": "value_projection.weight", "bias": "value_projection.bias"}


class ValueModel(nn.Module):
    """A scalar value head on a causal LM's last hidden state.

    With ``detach_backbone`` the head reads frozen features (a value head on an actor's backbone
    that the value loss must not move). With ``shared_backbone`` the backbone is an actor's, which the value loss
    reaches and the actor's optimizer updates: the head alone is this model's to update.
    """

    def __init__(self, backbone: PreTrainedModel, detach_backbone: bool = False, shared_backbone: bool = False) -> None:
        super().__init__()
        self.backbone = backbone
        self.detach_backbone = detach_backbone
        self.shared_backbone = shared_backbone
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
        """Head only when the backbone is detached or an actor's, else every parameter that requires grad."""
        if self.detach_backbone or self.shared_backbone:
            return list(self.head.parameters())
        return [p for p in self.parameters() if p.requires_grad]


def save_value_head(model: ValueModel, folder: str | os.PathLike, backbone: str | None = None) -> None:
    """Write ``model``'s head to ``folder/value_head.pt`` (keys ``value_projection.weight`` / ``.bias``, so the
    reference library's ``ValueHead(hidden).load_state_dict`` reads it too); ``backbone``: the folder of the
    backbone it reads, relative to ``folder``, when that is not ``folder`` itself (a head on an actor's model)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    state = {_HEAD_NAMES[k]: v.detach().to("cpu", copy=True) for k, v in model.head.state_dict().items()}
    torch.save(state, folder / VALUE_HEAD_FILE)
    if backbone is not None:
        (folder / CRITIC_FILE).write_text(json.dumps({"backbone": backbone}, indent=2))


def load_critic(folder: str | os.PathLike) -> tuple[ValueModel, PreTrainedTokenizerBase]:
    """A critic as ``save_model`` writes it, and its tokenizer: the head from ``folder/value_head.pt`` on the
    backbone in ``folder`` (a model or a LoRA adapter folder), or in the folder ``comlrl_critic.json`` names."""
    from .models import load_model, load_tokenizer

    folder = Path(folder)
    if not (folder / VALUE_HEAD_FILE).is_file():
        raise FileNotFoundError(f"{folder} holds no {VALUE_HEAD_FILE}: not a critic folder written by save_model.")
    source = folder
    if (folder / CRITIC_FILE).is_file():
        source = folder / json.loads((folder / CRITIC_FILE).read_text())["backbone"]
    model = ValueModel(load_model(str(source)))
    state = torch.load(folder / VALUE_HEAD_FILE, map_location="cpu", weights_only=True)
    model.head.load_state_dict({k: state[name] for k, name in _HEAD_NAMES.items()})
    return model.train(False), load_tokenizer(str(source))


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


def joint_state_text(prompts: list[str], agents: Sequence[int] | None = None) -> str:
    """What a centralized V critic reads: every agent's prompt, labelled with its agent's number (``agents``: the
    agents' indices, default ``0..n-1``; a stage where only some agents act passes theirs)."""
    labels = range(len(prompts)) if agents is None else agents
    return "\n\n".join(f"[Agent {i + 1} prompt]\n{p}" for i, p in zip(labels, prompts, strict=True))


def joint_action_text(prompts: list[str], answers: list[str], agents: Sequence[int] | None = None) -> str:
    """What a centralized Q critic reads: every agent's prompt, then every agent's answer, labelled as in
    :func:`joint_state_text`."""
    labels = range(len(answers)) if agents is None else agents
    said = "\n\n".join(f"[Agent {i + 1} answer]\n{a}" for i, a in zip(labels, answers, strict=True))
    return joint_state_text(prompts, agents) + "\n\n" + said
