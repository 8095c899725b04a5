"""vLLM rollouts in the trainer's process (``use_vllm=True``, ``vllm_mode="colocate"``).

One vLLM engine per distinct base model: a LoRA team on one shared base is one engine with ``enable_lora``, each
row generating through its agent's adapter; a fully fine-tuned agent, or each model of a heterogeneous team, has an
engine of its own. An engine starts from the model's config with placeholder weights and takes the trainer's
weights from memory, so it never reads a checkpoint and always samples the policy being trained: before every
rollout, the parameters an optimizer step changed (torch's in-place version counters tell which; comlrl's optimizer
steps raise them) are pushed again: a full model's weights in place through vLLM's weight-reload path, a LoRA
adapter as a new adapter version loaded at runtime from a temporary folder outside the run directory. Server mode
(:mod:`.vllm_server`) shares the bookkeeping (:class:`SyncedEngine`); the ``"vllm"`` rollout engine that picks one
per model is :class:`comlrl.rollout.generation.VLLMEngine`. With ``vllm_enable_sleep_mode`` on a GPU a
process runs one engine (:class:`SleepModeClaim`), which sleeps after each rollout and wakes before the next push.
The truncation flag of a row is not vLLM's ``finish_reason``: the rollout's stop-id scan sets it, as on every engine.

Prompts go in as token ids and completion ids come back as vLLM sampled them, with each token's log-prob under
the distribution it was drawn from (repetition penalty, temperature, top-k and top-p applied, renormalized: vLLM's
``processed_logprobs``), which the loss's truncated importance weight compares with the training forward's under
the same processing (:func:`comlrl.accel.sampler.sampler_logprobs`).

``vllm`` is imported on first use only: importing it takes seconds and changes process-wide state, which
:func:`vllm_process_guard` puts back (torch's thread count and ``set_num_threads``, the global RNGs).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import random
import shutil
import tempfile
import uuid
import weakref
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel

from ..engine.team import adapter_weights
from ..errors import ConfigError
from ..parallel.sharding import is_shard
from .protocol import VLLMOptions

LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vLLM's accepted max_lora_rank values


def peft_adapters(model: Any) -> list[str]:
    """The LoRA adapter names of a PEFT model; [] for a plain model."""
    config = getattr(model, "peft_config", None)
    return list(config) if isinstance(config, dict) else []


def base_weights(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) of a model's weights under the names of its Hugging Face checkpoint: a PEFT model's base
    weights without its LoRA factors (what vLLM's ``load_weights`` reads). A sharded (FSDP) weight is gathered when
    its turn comes, so a consumer that loads one at a time never holds a second full copy of the model (a collective:
    every rank of the model's mesh must iterate together)."""
    peft = bool(peft_adapters(model))
    for name, param in model.named_parameters():
        if peft:
            if "lora_" in name or ".modules_to_save." in name:
                continue
            name = name.removeprefix("base_model.model.").replace(".base_layer.", ".")
            name = name.replace(".original_module.", ".")
        yield name, (param.full_tensor() if is_shard(param) else param).detach()


def weight_versions(params: list[torch.Tensor]) -> tuple[int, ...]:
    """torch's in-place version counter of each tensor: an optimizer step (or any in-place write) raises it."""
    return tuple(p._version for p in params)


@contextlib.contextmanager
def vllm_process_guard() -> Iterator[None]:
    """Run vLLM code in this process and then put back what it changes process-wide: torch's intra-op thread
    count and ``torch.set_num_threads`` (vLLM's CPU worker replaces it with a no-op), and the Python, NumPy and
    torch RNG states (its worker reseeds them). Its engine core stays in this process (no spawned workers)."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    set_threads, threads = torch.set_num_threads, torch.get_num_threads()
    py_state, torch_state = random.getstate(), torch.random.get_rng_state()
    cuda_state = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    np_state = _numpy_state()
    try:
        yield
    finally:
        torch.set_num_threads = set_threads
        torch.set_num_threads(threads)
        random.setstate(py_state)
        torch.random.set_rng_state(torch_state)
        if cuda_state is not None:
            torch.cuda.set_rng_state_all(cuda_state)
        if np_state is not None:
            import numpy as np

            np.random.set_state(np_state)


def _numpy_state() -> Any:
    try:
        import numpy as np
    except ImportError:  # pragma: no cover - numpy comes with torch's usual installs
        return None
    return np.random.get_state()


def lora_rank(model: Any) -> int:
    """The smallest ``max_lora_rank`` vLLM accepts that holds every adapter of ``model``."""
    largest = max(int(getattr(model.peft_config[a], "r", 8)) for a in peft_adapters(model))
    for rank in LORA_RANKS:
        if rank >= largest:
            return rank
    raise ConfigError(f"LoRA rank {largest} is above vLLM's largest max_lora_rank ({LORA_RANKS[-1]})")


def kv_cache_bytes(config: Any, max_len: int, dtype: torch.dtype, sequences: int = 64) -> int:
    """Bytes of KV cache for ``sequences`` sequences of ``max_len`` tokens (CPU engines: vLLM's default reserves
    a fraction of all host memory); ``VLLM_CPU_KVCACHE_SPACE`` (GiB), when set, wins."""
    if os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
        return int(float(os.environ["VLLM_CPU_KVCACHE_SPACE"]) * 2**30)
    text = getattr(config, "text_config", None) or config
    heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    per_token = 2 * text.num_hidden_layers * heads * head_dim * torch.finfo(dtype).bits // 8
    return int(min(max(per_token * max_len * sequences, 2**28), 4 * 2**30))


@dataclass
class AdapterVersion:
    """One pushed version of a LoRA adapter: the name and id vLLM knows it by, and the folder it loads from."""

    name: str
    lora_id: int
    path: Path


SampledRow = tuple[list[int], list[float] | None]  # token ids, their log-probs (when asked)


def run_tag() -> str:
    """A tag unique to this engine's run and rank (random, then the torchrun rank): in adapter version names, so
    replicas of one agent on several ranks, or two runs sharing a server, never load or unload each other's."""
    return f"{uuid.uuid4().hex[:8]}-r{os.environ.get('RANK', '0')}"


class SyncedEngine:
    """What every vLLM engine of comlrl shares: it knows which of the trainer's weights it holds and pushes what an
    optimizer step changed before the next rollout (:meth:`sync`): a full model's weights (:meth:`push_weights`),
    or each LoRA adapter as a new version written to a temporary folder outside the run directory
    (:meth:`load_adapter`; the previous version is dropped with :meth:`drop_adapter`). ``root``: where that folder
    is made (None: ``tempfile.gettempdir()``, i.e. ``TMPDIR``); version names carry :func:`run_tag`."""

    def __init__(self, model: PreTrainedModel, root: str | None = None) -> None:
        self.adapters = peft_adapters(model)
        self.tag = run_tag()
        self.folder = Path(tempfile.mkdtemp(prefix=f"comlrl-vllm-{self.tag}-", dir=root))
        self.lora_ids = itertools.count(1)
        self.versions: dict[str, AdapterVersion] = {}  # adapter name -> its latest pushed version
        self.synced: dict[str, tuple[int, ...]] = {}  # what was last pushed: adapter name (or "") -> versions
        self.max_len: int | None = None  # the engine's context window in tokens, when known

    def sync(self, model: PreTrainedModel) -> None:
        """Push whatever changed since the last push: each LoRA adapter whose factors an optimizer step wrote, or
        a full model's weights."""
        if not self.adapters:
            versions = weight_versions(list(model.parameters()))
            if versions != self.synced.get(""):
                self.push_weights(base_weights(model))
                self.synced[""] = versions
            return
        for name in self.adapters:
            params = adapter_weights(model, name)
            if weight_versions(params) == self.synced.get(name):
                continue
            lora_id = next(self.lora_ids)
            label = f"{name}-{self.tag}-v{lora_id}"
            version = AdapterVersion(label, lora_id, self.folder / label)
            write_adapter(model, name, version.path)
            self.load_adapter(version)
            old, self.versions[name] = self.versions.get(name), version
            if old is not None:
                self.drop_adapter(old)
                shutil.rmtree(old.path, ignore_errors=True)
            self.synced[name] = weight_versions(params)

    def push_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Replace the engine's weights by ``weights`` (checkpoint names), taken one at a time."""
        raise NotImplementedError

    def load_adapter(self, version: AdapterVersion) -> None:
        """Make ``version`` available to requests (before the first one that names it)."""

    def drop_adapter(self, version: AdapterVersion) -> None:
        """Forget a superseded adapter version."""

    def adapter_of_rows(self, rows: int, adapters: list[str] | None) -> list[AdapterVersion] | None:
        """The adapter version each row generates through; None for a model without adapters."""
        if not self.adapters:
            return None
        names = adapters or [self.adapters[0]] * rows
        return [self.versions[n] for n in names]

    def close(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


def write_adapter(model: Any, name: str, folder: Path) -> None:
    """Adapter ``name`` of a PEFT model as a PEFT checkpoint folder (weights and adapter_config.json)."""
    from peft.utils import get_peft_model_state_dict
    from safetensors.torch import save_file

    folder.mkdir(parents=True)
    state = get_peft_model_state_dict(model, adapter_name=name)
    save_file(
        {k: v.detach().to("cpu").contiguous() for k, v in state.items()}, str(folder / "adapter_model.safetensors")
    )
    model.peft_config[name].save_pretrained(str(folder))


class ColocatedEngine(SyncedEngine):
    """One vLLM engine on one base model in this process, kept in step with the trainer's weights."""

    def __init__(self, model: PreTrainedModel, options: VLLMOptions, dtype: torch.dtype) -> None:
        from vllm import LLM

        gpu = on_gpu(model)
        if options.enable_sleep_mode and gpu:
            SLEEP_MODE.claim(self, model)
        super().__init__(model, _temp_root())
        config = model.config
        config.save_pretrained(self.folder)  # vLLM reads the architecture from it; the weights come from memory
        self.max_len = options.max_model_length or getattr(config, "max_position_embeddings", None) or 2048
        kwargs: dict[str, Any] = dict(
            model=str(self.folder),
            load_format="dummy",
            skip_tokenizer_init=True,
            dtype=str(dtype).removeprefix("torch."),
            max_model_len=self.max_len,
            seed=options.seed,
            tensor_parallel_size=options.tensor_parallel_size,
            enable_prefix_caching=True,
            logprobs_mode="processed_logprobs",
            enable_sleep_mode=options.enable_sleep_mode and gpu,
        )
        if gpu:
            kwargs["gpu_memory_utilization"] = options.gpu_memory_utilization
        else:
            kwargs.update(enforce_eager=True, kv_cache_memory_bytes=kv_cache_bytes(config, self.max_len, dtype))
        if self.adapters:
            n = len(self.adapters)
            kwargs.update(enable_lora=True, max_lora_rank=lora_rank(model), max_loras=n, max_cpu_loras=n)
        try:
            with vllm_process_guard():
                self.llm = LLM(**kwargs)
        except BaseException:
            self.close()
            raise
        self.sleeping = False
        self.sleep_between_rollouts = bool(kwargs["enable_sleep_mode"])
        if self.adapters:  # a LoRA team's base once; its adapters (and a full model's weights) through sync()
            self.push_weights(base_weights(model))

    def sync(self, model: PreTrainedModel) -> None:
        self.wake()  # weights reach a sleeping engine's offloaded copy otherwise, and are lost when it wakes
        super().sync(model)

    def wake(self) -> None:
        """Bring a sleeping engine's weights and KV cache back (vllm_enable_sleep_mode, GPU)."""
        if self.sleeping:
            with vllm_process_guard():
                self.llm.wake_up()
            self.sleeping = False

    def push_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        with vllm_process_guard():
            # in place, through vLLM's reload path: it re-runs the weight processing (e.g. CPU kernels' repacking)
            # that a bare load_weights after start-up would skip
            self.llm.collective_rpc(
                "reload_weights", kwargs={"weights_iterator": iter(weights), "is_checkpoint_format": True}
            )
            self.llm.apply_model(refresh_vocabulary_layers)
            self.llm.reset_prefix_cache()  # cached prompt KV was computed with the old weights

    def drop_adapter(self, version: AdapterVersion) -> None:
        # the new version has a new id, which vLLM loads on first use; the old one would only take a slot
        with vllm_process_guard():
            self.llm.llm_engine.remove_lora(version.lora_id)

    def generate(self, prompts: list[list[int]], settings: Any, batch: Any) -> list[SampledRow]:
        """Each row's completion of token-id prompts, sampled as ``settings`` say, through the rows' adapters."""
        from vllm.inputs import TokensPrompt
        from vllm.lora.request import LoRARequest

        versions = self.adapter_of_rows(len(prompts), batch.adapter_names)
        requests = None if versions is None else [LoRARequest(v.name, v.lora_id, str(v.path)) for v in versions]
        self.wake()
        with vllm_process_guard():
            outputs = self.llm.generate(
                [TokensPrompt(prompt_token_ids=p) for p in prompts],
                sampling_params(settings, batch),
                lora_request=requests,
                use_tqdm=False,
            )
            if self.sleep_between_rollouts:
                self.llm.sleep(level=1)  # weights to host memory, KV cache dropped, until the next rollout
                self.sleeping = True
        rows = []
        for output in outputs:
            out = output.outputs[0]
            tokens = list(out.token_ids)
            logp = [step[t].logprob for step, t in zip(out.logprobs, tokens)] if settings.logprobs else None
            rows.append((tokens, logp))
        return rows

    def close(self) -> None:
        """Stop the engine and delete its temporary folder."""
        llm, self.llm = getattr(self, "llm", None), None
        if llm is not None:
            stop_in_process(llm)
        SLEEP_MODE.release(self)
        super().close()


def on_gpu(model: torch.nn.Module) -> bool:
    """Whether ``model``'s colocated engine runs on a GPU: its parameters are on one."""
    return next(model.parameters()).device.type == "cuda"


class SleepModeClaim:
    """The one colocated engine of this process that runs with vLLM's sleep mode. Why one: sleep mode allocates an
    engine's weights and KV cache through vLLM's ``CuMemAllocator``, a singleton per process, whose sleep unmaps every
    allocation it holds; a second engine in it would lose its weights and KV cache whenever the first slept, and vLLM
    refuses to load one ("CuMem allocator can only be used for one instance per process"). So engines cannot sleep
    and wake together; a second one is refused before it starts, with what to do instead."""

    def __init__(self) -> None:
        self.holder: weakref.ref | None = None

    def claim(self, engine: object, model: torch.nn.Module) -> None:
        """Make ``engine`` this process's sleep-mode engine; a :class:`ConfigError` while another one is open."""
        held = self.holder() if self.holder is not None else None
        if held is not None and held is not engine:
            name = getattr(getattr(model, "config", None), "_name_or_path", "") or type(model).__name__
            raise ConfigError(
                "vllm_enable_sleep_mode=True runs one vLLM engine per process, and this process would start a second "
                f"one (for the model {name!r}): vLLM's sleep mode allocates through one allocator per process, so "
                "one engine's sleep would unmap the other's weights and KV cache, and vLLM refuses to start a second "
                "engine in it. A process runs one engine per distinct base model it trains or samples: a full "
                "fine-tune of several agents, a team of distinct models and MADPO's comparator='model' need several. "
                "Set vllm_enable_sleep_mode=False, or train LoRA adapters on one base model (peft_config=...: one "
                "engine for the team), or under torchrun give each rank one agent (placement)."
            )
        self.holder = weakref.ref(engine)

    def release(self, engine: object) -> None:
        """Free the claim of ``engine`` (a closed engine); another one may then use sleep mode."""
        if self.holder is not None and self.holder() is engine:
            self.holder = None


SLEEP_MODE = SleepModeClaim()


def refresh_vocabulary_layers(model: torch.nn.Module) -> None:
    """Redo the post-load processing of a vLLM model's embedding and LM-head layers. Why: vLLM's reload
    processes a tied LM head's weight only through the embedding that owns it, and on CPU the head computes from a
    matmul handle packed at load time, which would keep the placeholder weights the engine started with."""
    from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding

    for module in model.modules():
        method = getattr(module, "quant_method", None)
        if isinstance(module, VocabParallelEmbedding) and hasattr(method, "process_weights_after_loading"):
            method.process_weights_after_loading(module)


def stop_in_process(llm: Any) -> None:
    """Stop an in-process vLLM engine's executor and scheduler, and keep vLLM's own shutdown from running when it
    is garbage-collected: that one also tears down the process's distributed state (vLLM's parallel groups and
    torch.distributed's default group), which this process's other engines and torchrun's group still use."""
    client = getattr(llm.llm_engine, "engine_core", None)
    finalizer, core = getattr(client, "_finalizer", None), getattr(client, "engine_core", None)
    if finalizer is None or core is None:  # not an in-process engine: its own shutdown is the right one
        return
    finalizer.detach()
    with contextlib.suppress(Exception):
        core.model_executor.shutdown()
        core.scheduler.shutdown()


def _temp_root() -> str | None:
    """Where a colocated engine writes its config and adapter versions (only this process reads them):
    memory-backed /dev/shm where it exists, else ``TMPDIR``."""
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else None


def sampling_params(settings: Any, batch: Any) -> list[Any]:
    """One vLLM ``SamplingParams`` per row: the rollout's settings, the row's seed, the batch's stop ids."""
    from vllm import SamplingParams

    common: dict[str, Any] = dict(
        max_tokens=settings.max_new_tokens,
        stop_token_ids=list(batch.stop_ids),
        repetition_penalty=settings.repetition_penalty,
        detokenize=False,
        logprobs=0 if settings.logprobs else None,
    )
    if settings.do_sample:
        common.update(temperature=settings.temperature, top_p=settings.top_p, top_k=settings.top_k or 0)
    else:
        common.update(temperature=0.0)
    seeds = batch.row_seeds if settings.do_sample and batch.row_seeds is not None else [None] * batch.rows
    return [SamplingParams(seed=None if s is None else int(s) % 2**63, **common) for s in seeds]


def completions_from(rows: list[SampledRow], pad_id: int, logprobs: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(ids, log-probs) of sampled rows: ids right-padded, each sampled token's log-prob (when asked)."""
    width = max((len(tokens) for tokens, _ in rows), default=0)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    logp = torch.zeros((len(rows), width)) if logprobs else None
    for i, (tokens, picked) in enumerate(rows):
        ids[i, : len(tokens)] = torch.tensor(tokens, dtype=torch.long)
        if logp is not None and picked:
            logp[i, : len(picked)] = torch.tensor(picked, dtype=torch.float32)
    return ids, logp
