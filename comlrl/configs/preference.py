"""The preference trainers' configs: how pairs are made (:class:`PreferenceConfig`), MADPO's rounds, comparator and
replay (:class:`MADPOConfig`), MARLHF's three stages (:class:`MARLHFConfig`). Declared as every config is
(:mod:`comlrl.configs.fields`) on :class:`comlrl.configs.base.TrainConfig`."""

from __future__ import annotations

from ..algorithms.preference import PAIR_MODES
from ..errors import ConfigError
from .base import TrainConfig
from .fields import config_class, help_field

PREFERENCE_SOURCES = ("online", "dataset")
PAIR_SELECTIONS = PAIR_MODES
COMPARATORS = ("current", "initial", "history", "model", "api")
COMPARATOR_GENERATIONS = ("decentralized", "centralized")  # how a text comparator ('model', 'api') answers
COMPARATOR_PAIRINGS = ("all", "aligned")
COMPARATOR_API_FORMATS = ("generic", "openai", "anthropic", "openai_responses")  # engine.api_client.API_FORMATS
REPLAY_MODES = ("current", "last_k", "all", "decay")
DPO_LOSS_TYPES = ("sigmoid", "ipo")


@config_class
class PreferenceConfig(TrainConfig):
    """How preference pairs are made: K team candidates per prompt scored by the team reward, or a dataset's
    chosen / rejected columns (shared by MADPO and MARLHF)."""

    num_agents: int | None = help_field(None, "Optional check: must equal the trainer's number of agents when set.")
    preferences: str = help_field(
        "online",
        "'online': each round, num_generations joint candidates per prompt from the team (one batched rollout), "
        "scored by reward_func and paired; 'dataset': labelled pairs from train_dataset's chosen_column / "
        "rejected_column (one answer per agent in each), no reward_func needed.",
    )
    chosen_column: str = help_field("chosen", "Dataset column of the preferred joint answer: a list, one per agent.")
    rejected_column: str = help_field("rejected", "Dataset column of the other joint answer: a list, one per agent.")
    pair_selection: str = help_field(
        "reward_gap",
        f"Which candidate pairs to keep per prompt: one of {PAIR_SELECTIONS} (largest reward gaps first, every pair, "
        "a random subset, or with a comparator team the pairs whose comparator answer scored highest first); "
        "candidates whose rewards differ by at most tie_tolerance are ties and never paired.",
    )
    pairs_per_prompt: int | None = help_field(2, "At most this many pairs per prompt (None = every untied pair).")
    tie_tolerance: float = help_field(0.0, "Rewards this close are a tie (dropped, counted in pairs/ties).")

    def __post_init__(self) -> None:
        super().__post_init__()
        self._check_choice("preferences", PREFERENCE_SOURCES)
        self._refuse_topology("the preference trainers pair joint answers of turns that every agent plays at once")
        self._check_choice("pair_selection", PAIR_SELECTIONS)
        self._check_all(
            [
                (
                    self.pairs_per_prompt is None or self.pairs_per_prompt >= 1,
                    "pairs_per_prompt",
                    "must be >= 1 (or None)",
                ),
                (self.tie_tolerance >= 0, "tie_tolerance", "must be >= 0"),
                (
                    self.preferences != "online" or self.num_generations >= 2,
                    "num_generations",
                    "online preferences compare at least 2 candidates per prompt",
                ),
            ]
        )


@config_class
class MADPOConfig(PreferenceConfig):
    """Multi-agent DPO: the team's summed log-ratio margin on preference pairs, each agent credited through its own
    term (:func:`comlrl.algorithms.preference.team_dpo_loss`), in rounds of collect -> pair -> train.

    Differs from TRL's DPOConfig where the team makes it so: per_device_train_batch_size counts pairs (as in TRL),
    and a round's candidates come from the team itself (online), not from a fixed dataset, unless
    preferences='dataset'. Log-probs are taken over every completion token up to and including the stop token
    (summed; averaged per token for IPO, as TRL), at temperature 1 (the candidates are sampled at ``temperature``).
    """

    per_device_train_batch_size: int = help_field(
        4, "Preference pairs per micro-batch (TRL's DPO meaning); gradient_accumulation_steps micro-batches per step."
    )
    disable_dropout: bool = help_field(
        True,
        "Set every dropout probability of the agents' models to 0 (TRL's DPOConfig default). With dropout on, the "
        "reference log-probs and evaluate() on labelled pairs are computed in eval mode.",
    )
    beta: float = help_field(0.1, "DPO's beta: the scale of the implied reward beta * log(pi / ref) (TRL's default).")
    loss_type: str = help_field(
        "sigmoid",
        f"One of {DPO_LOSS_TYPES} (TRL's names and reductions): DPO's -log sigmoid(beta h) on log-probs summed over "
        "each completion's tokens, or IPO's (h - 1/(2 beta))^2 on log-probs averaged per token.",
    )
    label_smoothing: float = help_field(
        0.0, "Conservative DPO: the label is wrong with this probability (sigmoid loss only), as TRL's option."
    )
    reference_free: bool = help_field(
        False,
        "Take the reference log-probs as 0 (the reference library's form); default: a frozen reference per agent "
        "(the initial model, or the LoRA base with adapters off).",
    )
    num_rounds: int = help_field(1, "Online rounds of collect -> pair -> train, each with the current team.")
    prompts_per_round: int | None = help_field(
        8, "Dataset rows whose candidates one round collects (one batched rollout); None: every row of train_dataset."
    )
    steps_per_round: int | None = help_field(
        4,
        "Optimizer steps per round over the round's pairs (and replayed ones). None: num_train_epochs passes over the "
        "round's pair slots, prompts_per_round x pairs_per_prompt (every untied pair: K(K-1)/2 per prompt), rounded "
        "up to whole steps of per_device_train_batch_size x gradient_accumulation_steps pairs (TRL's epochs over a "
        "preference dataset; the reference library's MADPO).",
    )
    comparator: str = help_field(
        "current",
        f"Where the other side of a pair comes from: one of {COMPARATORS}. 'current': all num_generations candidates "
        "from the team; 'initial': num_generations from the team and as many from a frozen copy of the starting "
        "team, pairs only across the two; 'history': the same with the team of comparator_lag rounds back; "
        "'model': the same with comparator_model answering for every agent; 'api': the same with an HTTP endpoint "
        "(comparator_api_url) answering for every agent.",
    )
    comparator_model: str | None = help_field(
        None,
        "comparator='model': the model source (like model=) whose answers the team's are compared with; its answers "
        "are re-tokenized with each agent's tokenizer for the loss.",
    )
    comparator_lag: int = help_field(1, "comparator='history': how many rounds back the comparator team is.")
    comparator_pairing: str = help_field(
        "all",
        f"How team and comparator candidates pair, one of {COMPARATOR_PAIRINGS}: 'all': any team candidate with any "
        "comparator one; 'aligned': the team's i-th candidate with the comparator's i-th only (the reference "
        "library's iterative MADPO). With 'aligned', comparator='current' samples the comparator's candidates from "
        "the current team, apart from the team's own.",
    )
    comparator_num_generations: int | None = help_field(
        None, "Candidates per prompt of the comparator side (None: num_generations)."
    )
    comparator_generation: str = help_field(
        "decentralized",
        f"comparator='model' or 'api': one of {COMPARATOR_GENERATIONS}. 'decentralized': the comparator answers each "
        "agent's prompt on its own; 'centralized': one prompt holding every agent's prompt "
        "(comlrl.algorithms.preference.centralized_prompt) asks for all the answers in one completion, "
        "<agent_1>...</agent_1> ... <agent_N>...</agent_N>, split by role (within max_new_tokens for all of them); a "
        "completion that does not parse is dropped from pairing and counted in comparator/parse_failures (the "
        "reference library's comparator_generation_mode).",
    )
    comparator_api_url: str | None = help_field(
        None,
        "comparator='api': the endpoint, path included, POSTed to as given (e.g. "
        "https://api.openai.com/v1/chat/completions, https://api.anthropic.com/v1/messages).",
    )
    comparator_api_format: str = help_field(
        "openai",
        f"comparator='api': the request and response shape, one of {COMPARATOR_API_FORMATS}: OpenAI Chat Completions, "
        "Anthropic Messages, OpenAI Responses, or generic ({prompt, n, max_new_tokens, temperature, top_p} -> "
        "{completions: [...]}); see comlrl.engine.api_client.",
    )
    comparator_api_model: str | None = help_field(None, "comparator='api': the model name sent in each request.")
    comparator_api_key_env: str | None = help_field(
        None,
        "comparator='api': the NAME of the environment variable holding the API key (e.g. OPENAI_API_KEY), read when "
        "the trainer is built; sent as 'Authorization: Bearer <key>' ('x-api-key' for anthropic). None: no key. The "
        "key itself is never stored in the config or logged.",
    )
    comparator_api_timeout: float = help_field(120.0, "comparator='api': seconds to wait for each response.")
    comparator_api_max_n_per_request: int | None = help_field(
        None,
        "comparator='api', formats openai and generic: answers asked for per request (the body's n), up to "
        "num_generations; None or 1: one request per answer (servers that ignore n still give them all). anthropic "
        "and openai_responses have no n: one request per answer.",
    )
    comparator_api_concurrency: int = help_field(
        8, "comparator='api': requests in flight at once (one prompt's requests run one after the other)."
    )
    comparator_api_extra_body: dict | None = help_field(
        None, "comparator='api': fields merged into every request's JSON body (they override the built ones)."
    )
    comparator_api_headers: dict | None = help_field(
        None,
        "comparator='api': extra HTTP headers. Not for the key: they are saved with the config (use "
        "comparator_api_key_env).",
    )
    replay: str = help_field(
        "current",
        f"Which stored pairs a round trains on: one of {REPLAY_MODES}: this round's, the last replay_k rounds', "
        "all, or all weighted by replay_decay ** age (age in rounds). A round's steps_per_round x "
        "gradient_accumulation_steps x per_device_train_batch_size pair slots take every pair of the round "
        "first, then pairs drawn from the pool with probability proportional to that weight; each counts once "
        "in the loss.",
    )
    replay_k: int = help_field(2, "replay='last_k': rounds of pairs kept (1 = 'current').")
    replay_decay: float = help_field(0.5, "replay='decay': weight per round of age, in (0, 1].")
    replay_dir: str | None = help_field(
        None,
        "A folder that also holds each round's pairs as iteration_<round + 1, 4 digits>.json (the reference "
        "library's preference_replay_dir files: {iteration, num_pairs, pairs}), written atomically; replay reads "
        "earlier rounds back from it, so a run resumed with another output_dir replays them. None: the pairs are "
        "in <output_dir>/pairs/ only.",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        for field_name, valid in (
            ("loss_type", DPO_LOSS_TYPES),
            ("comparator", COMPARATORS),
            ("replay", REPLAY_MODES),
            ("comparator_generation", COMPARATOR_GENERATIONS),
            ("comparator_api_format", COMPARATOR_API_FORMATS),
            ("comparator_pairing", COMPARATOR_PAIRINGS),
        ):
            self._check_choice(field_name, valid)
        checks = [
            (self.beta > 0, "beta", "must be > 0"),
            (0.0 <= self.label_smoothing < 0.5, "label_smoothing", "must be in [0, 0.5)"),
            (self.label_smoothing == 0 or self.loss_type == "sigmoid", "label_smoothing", "applies to sigmoid only"),
            (self.num_rounds >= 1, "num_rounds", "must be >= 1"),
            (self.prompts_per_round is None or self.prompts_per_round >= 1, "prompts_per_round", "must be >= 1"),
            (self.steps_per_round is None or self.steps_per_round >= 1, "steps_per_round", "must be >= 1"),
            (self.comparator_lag >= 1, "comparator_lag", "must be >= 1"),
            (
                (self.comparator == "model") == bool(self.comparator_model),
                "comparator_model",
                "is set with comparator='model' only",
            ),
            (self.replay_k >= 1, "replay_k", "must be >= 1"),
            (
                self.comparator_num_generations is None or self.comparator_num_generations >= 1,
                "comparator_num_generations",
                "must be >= 1 or None",
            ),
            (
                self.comparator_num_generations is None or self.has_comparator_side,
                "comparator_num_generations",
                "applies to a comparator side (comparator='current' pairs within the team's candidates unless "
                "comparator_pairing='aligned')",
            ),
            (0.0 < self.replay_decay <= 1.0, "replay_decay", "must be in (0, 1]"),
            (
                self.comparator_generation == "decentralized" or self.comparator in ("model", "api"),
                "comparator_generation",
                "applies to comparator='model' or 'api' (the team answers each prompt on its own)",
            ),
        ]
        self._check_all(checks)
        self._check_api()

    @property
    def has_comparator_side(self) -> bool:
        """Whether rounds sample comparator candidates to pair the team's with (else pairs are within the team's)."""
        return self.comparator != "current" or self.comparator_pairing == "aligned"

    def _check_api(self) -> None:
        """The comparator_api_* fields: the url with comparator='api' only, and well-formed values."""
        name, url = type(self).__name__, self.comparator_api_url
        fmt, n = self.comparator_api_format, self.comparator_api_max_n_per_request
        checks = [
            (
                (self.comparator == "api") == bool(url),
                "comparator_api_url",
                "is required with comparator='api' (and set with it only)",
            ),
            (
                url is None or isinstance(url, str) and url.startswith(("http://", "https://")),
                "comparator_api_url",
                "must be an http:// or https:// url, path included",
            ),
            (self.comparator_api_timeout > 0, "comparator_api_timeout", "must be > 0"),
            (n is None or n >= 1, "comparator_api_max_n_per_request", "must be >= 1 or None"),
            (
                n in (None, 1) or fmt in ("openai", "generic"),
                "comparator_api_max_n_per_request",
                f"format '{fmt}' answers one completion per request (no n); leave it None",
            ),
            (self.comparator_api_concurrency >= 1, "comparator_api_concurrency", "must be >= 1"),
        ]
        self._check_all(checks)
        for field_name in ("comparator_api_extra_body", "comparator_api_headers"):
            value = getattr(self, field_name)
            if value is not None and (not isinstance(value, dict) or not all(isinstance(k, str) for k in value)):
                raise ConfigError(f"{name}.{field_name}: must be a dict with string keys (or None).")
        secret = [h for h in self.comparator_api_headers or {} if h.lower() in ("authorization", "x-api-key")]
        if secret:
            raise ConfigError(
                f"{name}.comparator_api_headers: '{secret[0]}' would be saved with the config; put the key in an "
                "environment variable and name it in comparator_api_key_env."
            )
        env = self.comparator_api_key_env
        if env is not None and not (isinstance(env, str) and env.isidentifier() and env.isascii()):
            # the value is not echoed: a key pasted here by mistake must not reach the log
            raise ConfigError(
                f"{name}.comparator_api_key_env must be the NAME of an environment variable (letters, digits, _), "
                "e.g. OPENAI_API_KEY, not the key itself."
            )


REWARD_MODEL_TRAINING = ("lora", "head", "full")


@config_class
class MARLHFConfig(PreferenceConfig):
    """Multi-agent RLHF in three stages: preference pairs (online from the team and the task reward, or a dataset),
    a joint reward model trained on them (Bradley-Terry), then RL of the team against the frozen reward model.

    The run settings (max_steps, learning_rate, num_generations, ...) are stage 3's; rl_args holds the fields
    of the RL algorithm's own config (e.g. advantage_mode, beta, critic_type).
    """

    rl_algorithm: str = help_field("magrpo", "Stage 3's algorithm: magrpo, mareinforce, marloo, maremax, iac or maac.")
    rl_args: dict = help_field({}, "Fields of the stage 3 algorithm's config that are not TrainConfig's.")
    preference_prompts: int | None = help_field(
        16, "Stage 1: dataset rows whose candidates are collected and paired; None: every row of train_dataset."
    )
    candidates_per_prompt: int = help_field(4, "Stage 1: joint candidates per prompt (K).")
    reward_model: str | None = help_field(
        None, "Stage 2: backbone source of the reward model (None = the first agent's model source)."
    )
    reward_model_training: str = help_field(
        "lora",
        f"Stage 2: one of {REWARD_MODEL_TRAINING}: LoRA adapters on the backbone and the head, the head only "
        "(frozen features), or every weight.",
    )
    reward_model_learning_rate: float = help_field(1e-4, "Stage 2: AdamW learning rate.")
    reward_model_epochs: int = help_field(3, "Stage 2: passes over the training pairs.")
    reward_model_batch_size: int = help_field(8, "Stage 2: pairs per optimizer step.")
    reward_model_eval_fraction: float = help_field(
        0.2, "Stage 2: share of the pairs held out (by prompt) for the held-out pair accuracy."
    )
    reward_model_max_length: int = help_field(1024, "Stage 2: the reward model reads the last N tokens of its input.")
    reward_model_normalize: bool = help_field(
        True,
        "Stage 3: the reward model's score is standardized, (s - mean) / std, with the mean and the (population) "
        "std of its scores on the preference pairs' joint answers (both sides), computed once after stage 2 and "
        "reported as reward_model/score_mean and reward_model/score_std; False: the raw score. (TRL's RLHF "
        "trainers read the raw score.)",
    )
    task_reward_weight: float = help_field(
        0.0,
        "Stage 3: team reward = reward model score (standardized unless reward_model_normalize=False) + "
        "task_reward_weight x the task reward (0: the model only).",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        self._check_choice("reward_model_training", REWARD_MODEL_TRAINING)
        checks = [
            (self.preference_prompts is None or self.preference_prompts >= 1, "preference_prompts", "must be >= 1"),
            (self.candidates_per_prompt >= 2, "candidates_per_prompt", "must be >= 2 (a pair needs two)"),
            (self.reward_model_learning_rate > 0, "reward_model_learning_rate", "must be > 0"),
            (self.reward_model_epochs >= 1, "reward_model_epochs", "must be >= 1"),
            (self.reward_model_batch_size >= 1, "reward_model_batch_size", "must be >= 1"),
            (0.0 < self.reward_model_eval_fraction < 1.0, "reward_model_eval_fraction", "must be in (0, 1)"),
            (self.reward_model_max_length >= 8, "reward_model_max_length", "must be >= 8"),
        ]
        self._check_all(checks)
