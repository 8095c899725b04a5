"""The joint reward model of multi-agent RLHF (stage 2): r(prompts, answers) for a whole team's joint answer.

A :class:`JointRewardModel` is a :class:`~comlrl.engine.critic.ValueModel` (causal-LM backbone, scalar head read at
the last token of a left-padded batch) that reads :func:`~comlrl.engine.critic.joint_action_text` (every agent's
prompt and answer, labelled) followed by the tokenizer's EOS. It is trained with the Bradley-Terry loss on preference
pairs (the loop: :func:`comlrl.trainers.reward_model.train_reward_model`) and then scores rollouts as a batched reward
function (:class:`RewardModelReward`), standardized with the mean and standard deviation of its scores on the pairs
(:func:`score_stats`) so that its scale does not depend on how the model was trained.

Pair records, their checks and the tokenizer-readability checks are in :mod:`comlrl.engine.reward_pairs`.

Shapes: N agents, M joint actions, P pairs. ``prompts[i][j]``, ``answers[i][j]``: agent i's prompt / answer in joint
action j (the layout of :mod:`comlrl.engine.rewards`).
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import os
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ..errors import ConfigError, RewardError
from .critic import ValueModel, encode_texts, joint_action_text
from .models import load_model, load_tokenizer, unwrap_peft
from .process import seeded
from .reward_pairs import check_pairs, joint_unreadable
from .rewards import compute_rewards
from .team import wrap_lora

log = logging.getLogger(__name__)

TRAINING_MODES = ("lora", "head", "full")
FORMAT = 1
META_FILE = "reward_model.json"
HEAD_FILE = "head.safetensors"

# Attention projections to put LoRA adapters on, by model family; the first group whose names all exist is used.
_ATTENTION_TARGETS: tuple[tuple[str, ...], ...] = (
    ("q_proj", "v_proj"),  # Llama, Mistral, Qwen, SmolLM, OPT, GPT-J
    ("qkv_proj",),  # Phi-3
    ("query_key_value",),  # GPT-NeoX, Falcon, BLOOM
    ("Wqkv",),  # MPT, ModernBERT
    ("c_attn",),  # GPT-2 (a Conv1D: weights stored transposed)
    ("query", "value"),
)


class JointRewardModel(ValueModel):
    """A scalar score of a team's joint answer: a causal-LM backbone with a linear head.

    ``mode``: 'lora' (adapters on the attention projections and the head train), 'head' (the backbone is frozen and
    detached) or 'full' (every weight trains). Inputs are left-padded, so the head reads each text's last real token,
    which :func:`joint_texts` makes the EOS token.
    """

    def __init__(self, backbone: Any, mode: str = "full") -> None:
        if mode not in TRAINING_MODES:
            raise ConfigError(f"reward model training='{mode}' is unknown; valid: {', '.join(TRAINING_MODES)}.")
        super().__init__(backbone, detach_backbone=mode == "head")
        self.mode = mode


def joint_texts(tokenizer: PreTrainedTokenizerBase, prompts: list[list[str]], answers: list[list[str]]) -> list[str]:
    """The reward model's input per joint action: ``joint_action_text`` of every agent's prompt and answer, then EOS.

    Why EOS: without it the last token is the last character of agent N's answer (or the label's newline when that
    answer is empty), so the head would read a different token type in every text; a fixed end token gives it one
    summary position that has attended to the whole joint answer. ``encode_texts`` keeps the *last* tokens when it
    truncates, so the EOS survives truncation (the start of the prompts is what is dropped).
    """
    n = len(prompts)
    if n == 0 or len(answers) != n:
        raise ConfigError(f"need one prompt list and one answer list per agent, got {n} and {len(answers)}.")
    m = len(answers[0])
    for what, lists in (("prompts", prompts), ("answers", answers)):
        for i, values in enumerate(lists):
            if len(values) != m:
                raise ConfigError(f"{what} of agent {i + 1} has {len(values)} entries for {m} joint action(s).")
    end = tokenizer.eos_token or ""
    return [joint_action_text([p[j] for p in prompts], [a[j] for a in answers]) + end for j in range(m)]


def attention_targets(model: torch.nn.Module) -> tuple[list[str] | str, bool]:
    """LoRA ``target_modules`` for a model's attention projections, and whether they store weights transposed
    (``fan_in_fan_out``, GPT-2's Conv1D); 'all-linear' when no known attention names are found."""
    names: dict[str, str] = {}
    for full_name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) or type(module).__name__ == "Conv1D":
            names.setdefault(full_name.rsplit(".", 1)[-1], type(module).__name__)
    for group in _ATTENTION_TARGETS:
        if all(name in names for name in group):
            return list(group), any(names[name] == "Conv1D" for name in group)
    return "all-linear", False


def clean_copy(model: torch.nn.Module) -> PreTrainedModel:
    """An independent copy of a loaded model without PEFT adapter layers: a PEFT wrapper is taken off and every
    adapter layer injected into the model (a LoRA team's adapters are injected into the caller's model in place)
    is replaced by the layer it wraps. The weights are the base's, in the model's current dtype."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    out = copy.deepcopy(unwrap_peft(model))
    for name, module in list(out.named_modules()):
        if isinstance(module, BaseTunerLayer):
            parent_name, _, child = name.rpartition(".")
            parent = out.get_submodule(parent_name) if parent_name else out
            if getattr(parent, child, None) is module:  # not inside an adapter layer replaced already
                setattr(parent, child, module.get_base_layer())
    out.__dict__.pop("peft_config", None)
    if getattr(out, "_hf_peft_config_loaded", False):
        out._hf_peft_config_loaded = False
    return out


def build_reward_model(
    source: str | PreTrainedModel,
    tokenizer: str | PreTrainedTokenizerBase | None = None,
    *,
    training: str = "lora",
    lora_r: int = 8,
    device: str | torch.device = "cpu",
    seed: int = 0,
) -> tuple[JointRewardModel, PreTrainedTokenizerBase]:
    """A fresh reward model on the backbone ``source`` (anything :func:`load_model` takes; a loaded model is copied
    without adapter layers by :func:`clean_copy`, so the caller's model is untouched) and its tokenizer (``tokenizer``, else the source's; a pad token is set when
    missing). The head and the LoRA adapters are initialized under ``seed``."""
    if training not in TRAINING_MODES:
        raise ConfigError(f"reward model training='{training}' is unknown; valid: {', '.join(TRAINING_MODES)}.")
    if training == "lora" and lora_r < 1:
        raise ConfigError(f"reward model lora_r must be >= 1, got {lora_r}.")
    tok = load_tokenizer(tokenizer if tokenizer is not None else source)
    backbone = clean_copy(source) if isinstance(source, torch.nn.Module) else load_model(source)
    with seeded(seed):
        if training == "lora":
            from peft import LoraConfig

            targets, transposed = attention_targets(backbone)
            config = LoraConfig(
                r=lora_r,
                lora_alpha=2 * lora_r,
                lora_dropout=0.0,
                target_modules=targets,
                fan_in_fan_out=transposed,
                task_type="CAUSAL_LM",
            )
            backbone = wrap_lora(backbone, config)  # freezes the base, adapters trainable
        elif training == "head":
            backbone.requires_grad_(False)
        else:
            backbone.requires_grad_(True)
        model = JointRewardModel(backbone, training)
    return model.to(device), tok


def score_stats(scores: torch.Tensor, min_std: float = 1e-6) -> tuple[float, float]:
    """(mean, std) of reward-model scores: the mean and the population standard deviation (divisor M), the std
    floored at ``min_std`` so that standardizing never divides by 0."""
    if scores.numel() == 0:
        raise ConfigError("score_stats: no scores to take a mean and standard deviation of.")
    x = scores.double().reshape(-1)
    return float(x.mean()), max(float(x.std(unbiased=False)), min_std)


def _device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


def _forward(
    model: JointRewardModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[list[str]],
    answers: list[list[str]],
    *,
    max_length: int,
) -> torch.Tensor:
    ids, mask = encode_texts(tokenizer, joint_texts(tokenizer, prompts, answers), max_length)
    dev = _device(model)
    return model(ids.to(dev), mask.to(dev))


def score_joint(
    model: JointRewardModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[list[str]],
    answers: list[list[str]],
    *,
    batch_size: int = 16,
    max_length: int = 1024,
) -> torch.Tensor:
    """Reward of each joint action, (M,) float on the CPU; ``prompts[i][j]``, ``answers[i][j]``: agent i's prompt and
    answer in joint action j. No gradients; the model is left in eval mode."""
    if batch_size < 1:
        raise ConfigError(f"batch_size must be >= 1, got {batch_size}.")
    m = len(answers[0]) if answers else 0
    joint_texts(tokenizer, prompts, answers)  # the shape checks, before any forward
    model.eval()
    out = []
    with torch.no_grad():
        for lo in range(0, m, batch_size):
            sl = slice(lo, lo + batch_size)
            out.append(
                _forward(model, tokenizer, [p[sl] for p in prompts], [a[sl] for a in answers], max_length=max_length)
            )
    return torch.cat(out).float().cpu() if out else torch.empty(0)


def pair_scores(
    model: JointRewardModel,
    tokenizer: PreTrainedTokenizerBase,
    batch: Sequence[dict],
    *,
    num_agents: int,
    max_length: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(chosen, rejected) scores (B,), (B,) of a batch of pairs, in one forward of both sides."""
    prompts = [[pair["prompts"][i] for pair in batch] * 2 for i in range(num_agents)]
    answers = [
        [pair["chosen"][i] for pair in batch] + [pair["rejected"][i] for pair in batch] for i in range(num_agents)
    ]
    scores = _forward(model, tokenizer, prompts, answers, max_length=max_length)
    return scores[: len(batch)], scores[len(batch) :]


def score_pairs(
    model: JointRewardModel,
    tokenizer: PreTrainedTokenizerBase,
    pairs: Sequence[dict],
    *,
    num_agents: int,
    batch_size: int,
    max_length: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(chosen, rejected) scores (P,), (P,) of every pair, scored in batches of ``batch_size`` with no gradients."""

    def side(key: str) -> torch.Tensor:
        prompts = [[pair["prompts"][i] for pair in pairs] for i in range(num_agents)]
        answers = [[pair[key][i] for pair in pairs] for i in range(num_agents)]
        return score_joint(model, tokenizer, prompts, answers, batch_size=batch_size, max_length=max_length)

    return side("chosen"), side("rejected")


def pair_score_stats(
    model: JointRewardModel,
    tokenizer: PreTrainedTokenizerBase,
    pairs: Sequence[dict],
    *,
    batch_size: int = 16,
    max_length: int = 1024,
) -> tuple[float, float]:
    """:func:`score_stats` of the model's scores of every pair's two joint answers (chosen and rejected)."""
    n = check_pairs(pairs)
    chosen, rejected = score_pairs(model, tokenizer, pairs, num_agents=n, batch_size=batch_size, max_length=max_length)
    return score_stats(torch.cat([chosen, rejected]))


class RewardModelReward:
    """A batched reward function (see :mod:`comlrl.engine.rewards`) scoring joint actions with a reward model,
    optionally plus ``task_weight`` times a task reward: r = RM(prompts, answers) + task_weight * task(...).

    ``normalize``: RM is the standardized score (s - score_mean) / score_std (the statistic of
    :func:`score_stats`), else the raw score s. It needs ``prompts`` (the trainer passes them). A joint action whose
    prompt or completion the reward model's tokenizer cannot read is not scored: its raw score is ``score_mean``
    (0 once standardized), it counts in ``unreadable`` and the first one is logged with the reason, so one odd
    sample does not end a run. ``score`` reports per joint action ``level/reward_model`` (RM as added),
    ``level/reward_model_raw``, ``level/unreadable`` (1 or 0) and, with a task reward, ``level/task``.
    """

    batched = True

    def __init__(
        self,
        model: JointRewardModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        task_reward: Callable | None = None,
        task_weight: float = 1.0,
        batch_size: int = 16,
        max_length: int = 1024,
        score_mean: float = 0.0,
        score_std: float = 1.0,
        normalize: bool = False,
    ) -> None:
        if task_reward is not None and not callable(task_reward):
            raise ConfigError(f"task_reward must be a reward function, got {type(task_reward).__name__}.")
        if not score_std > 0:
            raise ConfigError(f"score_std must be > 0, got {score_std}.")
        self.model = model
        self.tokenizer = tokenizer
        self.task_reward = task_reward
        self.task_weight = float(task_weight)
        self.batch_size = batch_size
        self.max_length = max_length
        self.score_mean, self.score_std, self.normalize = float(score_mean), float(score_std), normalize
        self.unreadable = 0  # joint actions not scored so far: the tokenizer could not read them

    def score(
        self,
        *agent_completions: list[str],
        prompts: list[list[str]] | None = None,
        batch_items: list[dict] | None = None,
        turn: int = 1,
        **kwargs: Any,
    ) -> list[dict[str, float]]:
        """Per joint action: ``reward`` (the total), ``level/reward_model``, ``level/reward_model_raw``,
        ``level/unreadable``, and with a task reward ``level/task`` (plus the task reward's own levels)."""
        completions = [list(c) for c in agent_completions]
        m = len(completions[0]) if completions else 0
        if prompts is None:
            raise RewardError(
                "the reward-model reward needs prompts= (one prompt list per agent): the reward model scores the "
                "prompts with the answers."
            )
        if len(prompts) != len(completions):
            raise RewardError(f"prompts= has {len(prompts)} agent list(s) for {len(completions)} agents' completions.")
        why = [joint_unreadable(self.tokenizer, [p[j] for p in prompts], [c[j] for c in completions]) for j in range(m)]
        ok = [j for j in range(m) if why[j] is None]
        raw = [self.score_mean] * m
        if ok:
            pick = [[texts[j] for j in ok] for texts in prompts], [[texts[j] for j in ok] for texts in completions]
            scores = score_joint(
                self.model, self.tokenizer, *pick, batch_size=self.batch_size, max_length=self.max_length
            ).tolist()
            for j, value in zip(ok, scores):
                raw[j] = value
        skipped = [w for w in why if w is not None]
        if skipped:
            if not self.unreadable:
                log.warning(
                    "the reward model's tokenizer (%s) cannot read a joint action, which gets the neutral score; "
                    "such joint actions are counted in reward/level/unreadable. First: %s",
                    type(self.tokenizer).__name__,
                    skipped[0],
                )
            self.unreadable += len(skipped)
        out = []
        for j, s in enumerate(raw):
            value = (s - self.score_mean) / self.score_std if self.normalize else s
            level = {
                "level/reward_model": value,
                "level/reward_model_raw": s,
                "level/unreadable": float(why[j] is not None),
            }
            out.append({"reward": value, **level})
        if self.task_reward is not None:
            task, levels = compute_rewards(
                self.task_reward,
                completions,
                prompts=prompts,
                batch_items=batch_items if batch_items is not None else [{} for _ in range(m)],
                row_ids=list(range(m)),  # positions in this call: the dataset rows are not passed to reward functions
                turn=turn,
            )
            for j, d in enumerate(out):
                d.update(levels[j] if j < len(levels) else {})
                d["level/task"] = task[j]
                d["reward"] = d["level/reward_model"] + self.task_weight * task[j]
        return out

    def __call__(
        self,
        *agent_completions: list[str],
        prompts: list[list[str]] | None = None,
        batch_items: list[dict] | None = None,
        turn: int = 1,
        **kwargs: Any,
    ) -> list[float]:
        """One reward per joint action (see :meth:`score`)."""
        scored = self.score(*agent_completions, prompts=prompts, batch_items=batch_items, turn=turn, **kwargs)
        return [d["reward"] for d in scored]


@contextlib.contextmanager
def _quiet_io() -> Iterator[None]:
    """No transformers 'Writing model shards' / 'Loading weights' bars, and no FutureWarning from PEFT reading
    ``is_gradient_checkpointing`` (as in :func:`comlrl.engine.team.wrap_lora`)."""
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
            yield
    finally:
        if was:
            hf_logging.enable_progress_bar()


def save_reward_model(model: JointRewardModel, tokenizer: PreTrainedTokenizerBase, path: str | os.PathLike) -> Path:
    """Write the reward model to folder ``path`` atomically (a temporary folder renamed at the end; an existing
    ``path`` is replaced): ``backbone/`` (the full causal LM; under LoRA the base without adapters), ``adapter/``
    (LoRA only, PEFT's folder), ``head.safetensors``, ``tokenizer/`` and ``reward_model.json``."""
    from safetensors.torch import save_file

    final = Path(path)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp", dir=final.parent))
    try:
        backbone = model.backbone
        with _quiet_io():
            if model.mode == "lora":
                backbone.save_pretrained(tmp / "adapter")
                inner = unwrap_peft(backbone)
                # the base weights as the unwrapped model names them: LoRA layers keep them under '.base_layer.'
                state = {k.replace(".base_layer.", "."): v for k, v in inner.state_dict().items() if "lora_" not in k}
                inner.save_pretrained(tmp / "backbone", state_dict=state)
            else:
                backbone.save_pretrained(tmp / "backbone")
        save_file({k: v.detach().cpu().contiguous() for k, v in model.head.state_dict().items()}, tmp / HEAD_FILE)
        tokenizer.save_pretrained(tmp / "tokenizer")
        dtype = str(next(unwrap_peft(backbone).parameters()).dtype).removeprefix("torch.")
        meta = {"format": FORMAT, "training": model.mode, "dtype": dtype}
        (tmp / META_FILE).write_text(json.dumps(meta, indent=2))
        old = None
        if final.exists():  # moved aside first, so a failure never leaves neither folder
            old = final.with_name(f".{final.name}.old-{os.getpid()}")
            os.rename(final, old)
        os.rename(tmp, final)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def load_reward_model(
    path: str | os.PathLike, device: str | torch.device = "cpu"
) -> tuple[JointRewardModel, PreTrainedTokenizerBase]:
    """A reward model and its tokenizer from a folder written by :func:`save_reward_model`, in eval mode."""
    from safetensors.torch import load_file

    folder = Path(path)
    meta_path = folder / META_FILE
    if not meta_path.is_file():
        raise ConfigError(f"{folder} is not a saved reward model: {META_FILE} is missing.")
    meta = json.loads(meta_path.read_text())
    mode = meta.get("training")
    if meta.get("format") != FORMAT or mode not in TRAINING_MODES:
        raise ConfigError(f"{meta_path}: unknown reward model format {meta.get('format')!r} / training {mode!r}.")
    with _quiet_io():
        backbone = load_model(str(folder / "backbone"), dtype=meta.get("dtype"))
        if mode == "lora":
            from peft import PeftModel

            backbone = PeftModel.from_pretrained(backbone, str(folder / "adapter"))  # adapters frozen
        else:
            backbone.requires_grad_(mode == "full")
    model = JointRewardModel(backbone, mode)
    model.head.load_state_dict(load_file(str(folder / HEAD_FILE)))
    tok = load_tokenizer(str(folder / "tokenizer"))
    model.to(device).eval()
    return model, tok
