"""vLLM rollouts on a separately started vLLM server (``use_vllm=True``, ``vllm_mode="server"``).

The server serves the team's base model (OpenAI-compatible API); the trainer sends each row as a completion request
with its prompt as token ids and gets the sampled token ids back (``return_token_ids``), so nothing is
re-tokenized. A LoRA team stays in step through vLLM's runtime LoRA loading: after an optimizer step, the agent's
adapter is written as a new version to a temporary folder the server reads (under ``vllm_server_adapter_dir``, else
``TMPDIR``: a filesystem both hosts see when the server runs on another one), loaded under a name unique to the run
and rank (so replicas of an agent on several ranks, or runs sharing the server, keep their own versions), and the
previous version unloaded. The server must be started with ``--enable-lora`` (``--max-loras`` at least the
adapters in use at once: the team size times the ranks sampling from it), ``--max-lora-rank`` at least the
adapters' rank, ``--logprobs-mode processed_logprobs`` (for the importance correction) and
``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`` in its environment; docs/vllm.md shows the command.

Fully fine-tuned agents in server mode would need their weights sent to the server after every step (NCCL, on
GPUs); that is not built: such a team fails at its first rollout with what to do instead.
"""

from __future__ import annotations

import json
import tempfile
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from transformers import PreTrainedModel

from ..errors import ConfigError
from .protocol import VLLMOptions
from .vllm_engine import AdapterVersion, SampledRow, SyncedEngine


class ServerError(RuntimeError):
    """The vLLM server refused or failed a request."""


class ServerEngine(SyncedEngine):
    """A LoRA team's rollouts on a running vLLM server, its adapters kept in step with the trainer's."""

    def __init__(self, model: PreTrainedModel, options: VLLMOptions) -> None:
        super().__init__(model, adapter_root(options))
        if not self.adapters:
            super().close()
            raise ConfigError(
                "vllm_mode='server' keeps LoRA teams in step with the server (runtime LoRA loading); this agent is "
                "fully fine-tuned, and sending its weights to a server after each step is not supported. Use "
                "vllm_mode='colocate', or train LoRA adapters (peft_config=...)."
            )
        self.url = f"http://{options.server_host}:{options.server_port}"
        self.timeout = options.server_timeout
        self.wait_until_up()
        models = self.request("GET", "/v1/models")["data"]
        self.base = models[0]["id"]
        self.max_len = int(models[0].get("max_model_len") or 0) or None

    # ---------------------------------------------------------------- HTTP
    def request(self, method: str, path: str, body: dict | None = None, timeout: float | None = None) -> Any:
        """One JSON request to the server; its decoded answer ('' for an empty one)."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=timeout or self.timeout) as answer:
                text = answer.read().decode()
        except urllib.error.HTTPError as exc:
            raise ServerError(f"vLLM server {self.url}{path}: HTTP {exc.code}: {exc.read().decode()[:500]}") from exc
        try:
            return json.loads(text) if text.strip() else ""
        except json.JSONDecodeError:
            return text

    def wait_until_up(self) -> None:
        """Wait for the server's health check, up to ``vllm_server_timeout`` seconds."""
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                self.request("GET", "/health", timeout=5.0)
                return
            except (urllib.error.URLError, OSError, ServerError) as exc:
                if time.monotonic() > deadline:
                    raise ConfigError(
                        f"no vLLM server answered at {self.url} within vllm_server_timeout={self.timeout:g} s "
                        f"({exc}); start it first (docs/vllm.md) or check vllm_server_host / vllm_server_port."
                    ) from exc
                time.sleep(1.0)

    # ---------------------------------------------------------------- weights
    def load_adapter(self, version: AdapterVersion) -> None:
        self.request("POST", "/v1/load_lora_adapter", {"lora_name": version.name, "lora_path": str(version.path)})

    def drop_adapter(self, version: AdapterVersion) -> None:
        self.request("POST", "/v1/unload_lora_adapter", {"lora_name": version.name})

    # ---------------------------------------------------------------- sampling
    def generate(self, prompts: list[list[int]], settings: Any, batch: Any) -> list[SampledRow]:
        """Each row's completion, one request per row (its own seed and adapter), sent concurrently."""
        versions = self.adapter_of_rows(len(prompts), batch.adapter_names)
        seeds = batch.row_seeds if settings.do_sample and batch.row_seeds is not None else [None] * len(prompts)
        bodies = [
            completion_body(
                prompt, settings, stop_ids=batch.stop_ids, seed=seed, model=versions[i].name if versions else self.base
            )
            for i, (prompt, seed) in enumerate(zip(prompts, seeds))
        ]
        with ThreadPoolExecutor(max_workers=min(32, max(len(bodies), 1))) as pool:
            answers = list(pool.map(lambda body: self.request("POST", "/v1/completions", body), bodies))
        rows = []
        for answer in answers:
            choice = answer["choices"][0]
            tokens = [int(t) for t in choice["token_ids"]]
            logp = [float(x) for x in choice["logprobs"]["token_logprobs"]] if settings.logprobs else None
            rows.append((tokens, logp))  # truncation: the rollout's stop-id scan, as on every engine
        return rows

    def close(self) -> None:
        """Unload this run's adapter versions from the server and delete their folders."""
        for version in self.versions.values():
            try:
                self.drop_adapter(version)
            except (ServerError, OSError):
                pass  # the server may already be gone
        self.versions.clear()
        super().close()


def adapter_root(options: VLLMOptions) -> str:
    """Where adapter versions are written for the server to read: ``vllm_server_adapter_dir`` (made if missing), else
    ``TMPDIR`` (``tempfile.gettempdir()``); never /dev/shm, which a server on another host cannot see."""
    if not options.server_adapter_dir:
        return tempfile.gettempdir()
    root = Path(options.server_adapter_dir).expanduser()
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"vllm_server_adapter_dir={options.server_adapter_dir!r}: cannot create it ({exc}).") from exc
    return str(root)


def completion_body(prompt: list[int], settings: Any, *, stop_ids: list[int], seed: int | None, model: str) -> dict:
    """The JSON body of one row's ``/v1/completions`` request: the rollout's sampling settings, by token ids."""
    body: dict[str, Any] = dict(
        model=model,
        prompt=prompt,
        max_tokens=settings.max_new_tokens,
        stop_token_ids=list(stop_ids),
        repetition_penalty=settings.repetition_penalty,
        return_token_ids=True,
        skip_special_tokens=False,
    )
    if settings.do_sample:
        body.update(temperature=settings.temperature, top_p=settings.top_p, top_k=settings.top_k or 0)
        if seed is not None:
            body["seed"] = int(seed) % 2**63
    else:
        body["temperature"] = 0.0
    if settings.logprobs:
        body["logprobs"] = 0
    return body
