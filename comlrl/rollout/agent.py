"""One member of a team as the rollout and the update see it (:class:`Agent`), and its prompt formatter."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ..errors import FormatterError

Formatter = Callable[[dict], str]


@dataclass(kw_only=True)
class Agent:
    """One member of the team and everything needed to update it."""

    index: int
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    formatter: Formatter
    chat: bool = False
    optimizer: torch.optim.Optimizer | None = None
    scheduler: Any = None
    ref_model: PreTrainedModel | None = None
    adapter: str | None = None  # LoRA adapter name when the model is shared with other agents
    params: list = field(default_factory=list)  # this agent's trainable parameters

    @property
    def name(self) -> str:
        return f"agent_{self.index}"


def apply_formatter(fmt: Formatter, row: dict, *, agent: int, row_id: int, columns: Sequence[str] | None = None) -> str:
    """Run an agent's formatter on a dataset row; errors name the agent, the row and the missing column."""
    try:
        text = fmt(row)
    except KeyError as exc:
        cols = list(columns) if columns is not None else list(row.keys()) if hasattr(row, "keys") else []
        raise FormatterError(
            f"formatter of agent {agent} needs column {exc} which dataset row {row_id} does not have (columns: {cols})."
        ) from exc
    except Exception as exc:
        raise FormatterError(
            f"formatter of agent {agent} raised {type(exc).__name__} on dataset row {row_id}: {exc}"
        ) from exc
    if not isinstance(text, str):
        raise FormatterError(
            f"formatter of agent {agent} returned {type(text).__name__} on dataset row {row_id}; it must return a str."
        )
    return text
