"""A text-completion endpoint over HTTP: the comparator team of MADPO's ``comparator='api'``.

Standard library only (``urllib.request``, ``json``). ``url`` is the whole endpoint, path included, and is POSTed to
as given (the reference library's convention), e.g. ``https://api.openai.com/v1/chat/completions``. Four request
shapes (:data:`API_FORMATS`); each is a pair of pure functions, :func:`request_body` and :func:`parse_response`:

- ``openai``: ``{model, messages: [{role: user, content: prompt}], n, max_tokens, temperature, top_p}`` (Chat
  Completions); answers in ``choices[i].message.content``.
- ``openai_responses``: ``{model, input, max_output_tokens, temperature}`` (Responses); the answer in
  ``output_text``, else the text blocks of ``output[..].content``.
- ``anthropic``: ``{model, max_tokens, messages, temperature}`` (Messages); the answer in ``content[..].text``.
- ``generic``: ``{prompt, n, num_return_sequences, max_new_tokens, temperature, top_p, model}``; answers in
  ``completions``, a list of strings (or of ``{"text": ..., "truncated": ...}``).

``openai`` and ``generic`` ask for several answers per request (``n``), at most ``max_n_per_request`` (None: one);
``anthropic`` and ``openai_responses`` have no ``n``: one request per answer. The key is read from an environment
variable by the caller and sent as ``Authorization: Bearer <key>`` (``x-api-key: <key>`` and ``anthropic-version``
for ``anthropic``); it never appears in an error message, and neither does the url's query string.
"""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

API_FORMATS = ("generic", "openai", "anthropic", "openai_responses")
TAKES_N = ("generic", "openai")  # formats whose request asks for several answers at once
ANTHROPIC_VERSION = "2023-06-01"


class APIError(RuntimeError):
    """An endpoint call failed: the HTTP status, a timeout, or a response without the answers where the format has
    them. The message names the url (no query string, no key), the format and the caller's ``where``."""


@dataclass(frozen=True)
class Answer:
    """One completion: its text and whether it stopped at the token limit (finish_reason 'length', stop_reason
    'max_tokens', status 'incomplete'), so the trainer does not teach the team to stop where it was cut."""

    text: str
    truncated: bool = False


@dataclass(frozen=True)
class Sampling:
    """The sampling settings sent with each request (the trainer's max_new_tokens, temperature, top_p)."""

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0


def request_body(
    fmt: str, prompt: str, *, n: int, sampling: Sampling, model: str | None = None, extra_body: dict | None = None
) -> dict[str, Any]:
    """The JSON body asking ``fmt``'s endpoint for ``n`` answers to ``prompt`` (n must be 1 for a format without
    ``n``); ``extra_body`` is merged last (it overrides), and fields that are None are left out."""
    if fmt not in TAKES_N and n != 1:
        raise ValueError(f"format '{fmt}' answers one completion per request, asked for n={n}")
    user = [{"role": "user", "content": prompt}]
    s = sampling
    if fmt == "openai":
        body = {"model": model, "messages": user, "n": n, "max_tokens": s.max_new_tokens}
        body.update(temperature=s.temperature, top_p=s.top_p)
    elif fmt == "openai_responses":
        body = {"model": model, "input": prompt, "max_output_tokens": s.max_new_tokens, "temperature": s.temperature}
    elif fmt == "anthropic":
        body = {"model": model, "max_tokens": s.max_new_tokens, "messages": user, "temperature": s.temperature}
    elif fmt == "generic":
        body = {"prompt": prompt, "n": n, "num_return_sequences": n, "max_new_tokens": s.max_new_tokens}
        body.update(temperature=s.temperature, top_p=s.top_p, model=model)
    else:
        raise ValueError(f"unknown API format '{fmt}'; valid: {', '.join(API_FORMATS)}")
    body.update(extra_body or {})
    return {k: v for k, v in body.items() if v is not None}


def request_headers(fmt: str, key: str | None = None, extra: dict | None = None) -> dict[str, str]:
    """JSON content type, ``extra`` (the user's headers), then the key: ``x-api-key`` and ``anthropic-version``
    (unless given in ``extra``) for ``anthropic``, ``Authorization: Bearer`` otherwise; no key, no auth header."""
    headers = {"Content-Type": "application/json", **(extra or {})}
    if fmt == "anthropic":
        if not any(h.lower() == "anthropic-version" for h in headers):
            headers["anthropic-version"] = ANTHROPIC_VERSION
        if key:
            headers["x-api-key"] = key
    elif key:
        headers["Authorization"] = f"Bearer {key}"
    return headers


def parse_response(fmt: str, data: Any) -> list[Answer]:
    """The answers in a decoded response of ``fmt``; ValueError saying which field is missing or malformed."""
    if not isinstance(data, dict):
        raise ValueError(f"expected a JSON object, got {type(data).__name__}")
    if fmt == "openai":
        return [_chat_choice(c, k) for k, c in enumerate(_list(data, "choices"))]
    if fmt == "anthropic":
        texts = [b["text"] for b in _list(data, "content") if isinstance(b, dict) and isinstance(b.get("text"), str)]
        if not texts:
            raise ValueError("no text block in 'content'")
        return [Answer("".join(texts), data.get("stop_reason") == "max_tokens")]
    if fmt == "openai_responses":
        cut = data.get("status") == "incomplete"
        if isinstance(data.get("output_text"), str):
            return [Answer(data["output_text"], cut)]
        texts = [
            block["text"]
            for item in _list(data, "output")
            if isinstance(item, dict) and isinstance(item.get("content"), list)
            for block in item["content"]
            if isinstance(block, dict) and block.get("type") in ("output_text", "text") and "text" in block
        ]
        if not texts:
            raise ValueError("neither 'output_text' nor an output_text block in 'output'")
        return [Answer("".join(texts), cut)]
    if fmt == "generic":
        answers = []
        for k, c in enumerate(_list(data, "completions")):
            text = c.get("text") if isinstance(c, dict) else c
            if not isinstance(text, str):
                raise ValueError(f"completions[{k}] is {type(c).__name__}, not a string (or {{'text': ...}})")
            answers.append(Answer(text, bool(c.get("truncated", False)) if isinstance(c, dict) else False))
        return answers
    raise ValueError(f"unknown API format '{fmt}'; valid: {', '.join(API_FORMATS)}")


def _list(data: dict, key: str) -> list:
    value = data.get(key)
    if not isinstance(value, list) or not value:
        raise ValueError(f"missing or empty '{key}' (got {str(value)[:80]!r}); response keys: {sorted(data)}")
    return value


def _chat_choice(choice: Any, k: int) -> Answer:
    message = choice.get("message") if isinstance(choice, dict) else None
    text = message.get("content") if isinstance(message, dict) else None
    if not isinstance(text, str):
        raise ValueError(f"choices[{k}].message.content is missing or not a string")
    return Answer(text, choice.get("finish_reason") == "length")


def public_url(url: str) -> str:
    """``url`` without its query string, fragment and user:password part: what an error message may show."""
    p = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit((p.scheme, p.netloc.rpartition("@")[2], p.path, "", ""))


@dataclass(kw_only=True)
class APIClient:
    """One endpoint: ``complete(prompt, n)`` returns n :class:`Answer`, in as many requests as the format needs;
    ``complete_all`` sends the requests of many prompts ``concurrency`` at a time (answers in prompt order)."""

    url: str
    fmt: str = "openai"
    model: str | None = None
    key: str | None = field(default=None, repr=False)
    timeout: float = 120.0
    max_n_per_request: int | None = None
    extra_body: dict | None = None
    headers: dict | None = None
    concurrency: int = 8

    def complete(self, prompt: str, n: int, sampling: Sampling, where: str = "") -> list[Answer]:
        """n answers to ``prompt``: requests of at most max_n_per_request (None: 1) answers for a format with ``n``,
        else one per answer; a server that returns fewer than asked is asked again for the rest."""
        per_request = (self.max_n_per_request or 1) if self.fmt in TAKES_N else 1
        answers: list[Answer] = []
        while len(answers) < n:
            ask = min(per_request, n - len(answers))
            got = self.post(
                request_body(self.fmt, prompt, n=ask, sampling=sampling, model=self.model, extra_body=self.extra_body),
                where,
            )
            answers += got[:ask]
        return answers

    def complete_all(self, prompts: list[str], n: int, sampling: Sampling, where: list[str]) -> list[list[Answer]]:
        """:meth:`complete` for each prompt, ``concurrency`` prompts in flight at once."""
        if not prompts:
            return []
        with ThreadPoolExecutor(max_workers=max(1, min(self.concurrency, len(prompts)))) as pool:
            return list(pool.map(lambda p, w: self.complete(p, n, sampling, w), prompts, where))

    def post(self, body: dict, where: str = "") -> list[Answer]:
        """One request; APIError on an HTTP error, a timeout, a non-JSON body or a response without answers."""
        name = f"comparator API {public_url(self.url)} (format '{self.fmt}'{', ' + where if where else ''})"
        headers = request_headers(self.fmt, self.key, self.headers)
        request = urllib.request.Request(self.url, json.dumps(body).encode(), headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                raw = response.read().decode("utf-8", errors="replace")
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode("utf-8", errors="replace")[:500]
            raise APIError(f"{name}: HTTP {exc.code} {exc.reason}: {detail}") from None
        except (TimeoutError, socket.timeout) as exc:
            raise APIError(f"{name}: no answer within comparator_api_timeout={self.timeout} s ({exc})") from None
        except urllib.error.URLError as exc:
            raise APIError(f"{name}: request failed: {exc.reason}") from None
        try:
            return parse_response(self.fmt, json.loads(raw))
        except json.JSONDecodeError:
            raise APIError(f"{name}: the response is not JSON: {raw[:300]!r}") from None
        except ValueError as exc:
            raise APIError(f"{name}: malformed response: {exc}") from None


__all__ = ["API_FORMATS", "APIClient", "APIError", "Answer", "Sampling", "parse_response", "request_body"]
