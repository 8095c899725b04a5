"""MADPO's text comparators: comparator='api' against a real local HTTP server (OpenAI chat / Anthropic messages
shapes), the request / response translation of every format, and comparator_generation='centralized'."""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from test_madpo import ROWS, cfg, length_reward
from tiny import tiny_model, tiny_tokenizer

from comlrl.algorithms.preference import TaggedCentralizedComparatorAdapter, centralized_prompt
from comlrl.configs.preference import MADPOConfig
from comlrl.engine.api_client import (
    Answer,
    APIClient,
    APIError,
    Sampling,
    parse_response,
    public_url,
    request_body,
    request_headers,
)
from comlrl.errors import CentralizedComparatorParseError, ConfigError
from comlrl.trainers.madpo import MADPOTrainer
from comlrl.trainers.pairs import read_jsonl, shard_path

KEY_ENV, KEY = "COMLRL_TEST_COMPARATOR_KEY", "sk-test-not-a-real-key"
FORMATTERS = [lambda row: "A: " + row["prompt"], lambda row: "B: " + row["prompt"]]
SAMPLING = Sampling(max_new_tokens=6, temperature=0.7, top_p=0.9)


def api_text(prompt: str, k: int) -> str:
    """The server's k-th answer to a prompt: agent B's answers are longer, so the length reward prefers them."""
    return ("short" if prompt.startswith("A:") else "a much longer answer") + f" #{k}"


def tagged(k: int) -> str:
    return f"Sure.\n<agent_1>a{k}</agent_1>\n<agent_2>{'b' * (k + 5)}</agent_2>"


class Handler(BaseHTTPRequestHandler):
    """OpenAI chat/completions (/v1/chat/completions), Anthropic messages (/v1/messages), a centralized OpenAI
    endpoint whose first choice never parses (/central/...), an HTTP 500 (/fail), a response without 'choices'
    (/missing) and a slow one (/slow)."""

    def do_POST(self):  # noqa: N802 (http.server's name)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.requests.append({"path": self.path, "headers": dict(self.headers), "body": body})
        if self.path.startswith("/fail"):
            return self._send(500, {"error": "overloaded"})
        if self.path == "/slow":
            time.sleep(1.5)
        if self.path == "/missing":
            return self._send(200, {"id": "x", "object": "chat.completion"})
        if self.path == "/v1/messages":
            text = api_text(body["messages"][0]["content"], 0)
            return self._send(200, {"content": [{"type": "text", "text": text}], "stop_reason": "end_turn"})
        prompt = body["messages"][0]["content"]
        texts = [tagged(k) if self.path.startswith("/central") else api_text(prompt, k) for k in range(body["n"])]
        if self.path.startswith("/central"):
            texts[0] = "I will not use the tags."
        choices = [{"index": k, "message": {"role": "assistant", "content": t}} for k, t in enumerate(texts)]
        return self._send(200, {"choices": [dict(c, finish_reason="stop") for c in choices]})

    def _send(self, status, data):
        raw = json.dumps(data).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.requests = []
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd, f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def api_trainer(tmp_path, url, adapter=None, **kw):
    base = dict(comparator="api", comparator_api_url=url, comparator_api_key_env=KEY_ENV, num_rounds=1)
    base.update(steps_per_round=1, comparator_api_model="test-model")
    base.update(kw)
    extra = {"centralized_comparator_adapter": adapter} if adapter else {}
    return MADPOTrainer(
        model=tiny_model(),
        num_agents=2,
        tokenizer=tiny_tokenizer(),
        train_dataset=ROWS,
        reward_func=length_reward,
        formatters=FORMATTERS,
        args=cfg(tmp_path, **base),
        **extra,
    )


# ---------------------------------------------------------------------------- request / response translation
def test_request_bodies_of_every_format():
    assert request_body("openai", "hi", n=3, sampling=SAMPLING, model="gpt", extra_body={"seed": 1}) == {
        "model": "gpt",
        "messages": [{"role": "user", "content": "hi"}],
        "n": 3,
        "max_tokens": 6,
        "temperature": 0.7,
        "top_p": 0.9,
        "seed": 1,
    }
    assert request_body("openai_responses", "hi", n=1, sampling=SAMPLING, model="o") == {
        "model": "o",
        "input": "hi",
        "max_output_tokens": 6,
        "temperature": 0.7,
    }
    assert request_body(
        "anthropic", "hi", n=1, sampling=SAMPLING, model="claude", extra_body={"temperature": None}
    ) == {
        "model": "claude",
        "max_tokens": 6,
        "messages": [{"role": "user", "content": "hi"}],
    }  # extra_body overrides, and a None drops the field
    generic = request_body("generic", "hi", n=2, sampling=SAMPLING)  # no model: left out
    assert generic == {
        "prompt": "hi",
        "n": 2,
        "num_return_sequences": 2,
        "max_new_tokens": 6,
        "temperature": 0.7,
        "top_p": 0.9,
    }
    with pytest.raises(ValueError, match="one completion per request"):
        request_body("anthropic", "hi", n=2, sampling=SAMPLING)


def test_responses_of_every_format():
    chat = {"choices": [{"message": {"content": "a"}, "finish_reason": "stop"}, {"message": {"content": "b"}}]}
    assert parse_response("openai", chat) == [Answer("a"), Answer("b")]
    cut = {"choices": [{"message": {"content": "a"}, "finish_reason": "length"}]}
    assert parse_response("openai", cut) == [Answer("a", truncated=True)]
    msg = {
        "content": [{"type": "thinking", "thinking": "..."}, {"type": "text", "text": "c"}],
        "stop_reason": "end_turn",
    }
    assert parse_response("anthropic", msg) == [Answer("c")]
    assert parse_response("anthropic", {"content": [{"type": "text", "text": "c"}], "stop_reason": "max_tokens"}) == [
        Answer("c", True)
    ]
    assert parse_response("openai_responses", {"output_text": "d"}) == [Answer("d")]
    output = {"output": [{"type": "message", "content": [{"type": "output_text", "text": "e"}]}], "status": "completed"}
    assert parse_response("openai_responses", output) == [Answer("e")]
    assert parse_response("generic", {"completions": ["f", {"text": "g", "truncated": True}]}) == [
        Answer("f"),
        Answer("g", True),
    ]
    for fmt, bad in (
        ("openai", {"choices": []}),
        ("openai", {"choices": [{"message": {}}]}),
        ("anthropic", {"content": [{"type": "tool_use"}]}),
        ("openai_responses", {"output": []}),
        ("generic", {"completions": [3]}),
        ("generic", ["not an object"]),
    ):
        with pytest.raises(ValueError):
            parse_response(fmt, bad)


def test_headers_carry_the_key_as_each_format_expects():
    assert request_headers("openai", "k", {"X-Trace": "t"}) == {
        "Content-Type": "application/json",
        "X-Trace": "t",
        "Authorization": "Bearer k",
    }
    h = request_headers("anthropic", "k")
    assert h["x-api-key"] == "k" and h["anthropic-version"] == "2023-06-01" and "Authorization" not in h
    assert request_headers("anthropic", None, {"Anthropic-Version": "2024-01-01"})["Anthropic-Version"] == "2024-01-01"
    assert "Authorization" not in request_headers("generic", None)
    assert (
        public_url("https://user:pw@api.example.com:8443/v1/chat?key=abc#x") == "https://api.example.com:8443/v1/chat"
    )


def test_client_asks_again_for_the_answers_a_request_did_not_give(server):
    httpd, url = server
    client = APIClient(url=url + "/v1/chat/completions", fmt="openai", model="m", max_n_per_request=2)
    answers = client.complete("A: hello", 5, SAMPLING)
    assert [a.text for a in answers] == [api_text("A: hello", k) for k in (0, 1, 0, 1, 0)]
    assert [r["body"]["n"] for r in httpd.requests] == [2, 2, 1]
    one = APIClient(url=url + "/v1/messages", fmt="anthropic", model="claude", key="k")
    assert len(one.complete("B: x", 3, SAMPLING)) == 3 and len(httpd.requests) == 6  # no n: one request per answer


# ---------------------------------------------------------------------------- a MADPO round against the server
@pytest.mark.parametrize("fmt", ["openai", "anthropic"])
def test_api_comparator_round_pairs_the_team_with_the_api_answers(tmp_path, server, monkeypatch, fmt):
    httpd, url = server
    monkeypatch.setenv(KEY_ENV, KEY)
    path = "/v1/chat/completions" if fmt == "openai" else "/v1/messages"
    extra = dict(comparator_api_max_n_per_request=2) if fmt == "openai" else {}
    t = api_trainer(
        tmp_path,
        url + path,
        comparator_api_format=fmt,
        comparator_api_extra_body={"seed": 7},
        comparator_api_headers={"X-Trace": "madpo"},
        **extra,
    )
    out = t.train()
    records = read_jsonl(shard_path(tmp_path / "run", 0))
    prompts = {p for r in records for p in r["prompts"]}
    rows = {r["row"] for r in records}
    # one request per (row, agent) prompt for 3 answers: n=2 then n=1 (openai); one per answer (anthropic)
    assert len(httpd.requests) == 4 * 2 * (2 if fmt == "openai" else 3)
    for req in httpd.requests:
        headers, body = {k.lower(): v for k, v in req["headers"].items()}, req["body"]
        assert req["path"] == path and headers["x-trace"] == "madpo"
        assert body["model"] == "test-model" and body["seed"] == 7 and body["max_tokens"] == 6
        assert body["messages"][0]["content"][:3] in ("A: ", "B: ")
        if fmt == "openai":
            assert headers["authorization"] == f"Bearer {KEY}" and body["n"] in (1, 2)
        else:
            assert headers["x-api-key"] == KEY and headers["anthropic-version"] and "authorization" not in headers
            assert "n" not in body
    assert prompts <= {req["body"]["messages"][0]["content"] for req in httpd.requests}
    assert len(rows) >= 1
    eos = t.agents[0].tokenizer.eos_token_id
    sides = 0
    for r in records:
        assert r["chosen_side"] != r["rejected_side"]  # pairs only across team vs API
        for key in ("chosen", "rejected"):
            if r[f"{key}_side"] == 1:
                sides += 1
                ks = 1 if fmt == "anthropic" else 2
                assert r[key][0] in {api_text("A:", k) for k in range(ks)}
                assert r[key][1] in {api_text("B:", k) for k in range(ks)}
                ids = r[f"{key}_ids"][1]  # re-tokenized by the team's tokenizer, finished: ends with EOS
                assert ids[-1] == eos and t.agents[1].tokenizer.decode(ids[:-1]) == r[key][1]
    assert sides and out["history"][0]["comparator/reward/mean"] > 0
    summary = read_jsonl(tmp_path / "run" / "pairs" / "rounds.jsonl")[0]
    assert len(summary["comparator_rewards"]) == 4 * 3
    assert "comparator/parse_failures" not in out["history"][0]
    for f in (tmp_path / "run").rglob("*"):  # the key is in no file the run wrote
        assert not f.is_file() or KEY.encode() not in f.read_bytes(), f


def test_api_errors_name_the_url_status_and_row_never_the_key(tmp_path, server, monkeypatch):
    httpd, url = server
    monkeypatch.setenv(KEY_ENV, KEY)
    with pytest.raises(APIError, match=r"/fail \(format 'openai', round 0, row \d+, agent \d\): HTTP 500") as e:
        api_trainer(tmp_path, url + "/fail?token=abc").train()
    assert KEY not in str(e.value) and "token=abc" not in str(e.value) and "overloaded" in str(e.value)
    with pytest.raises(APIError, match="malformed response: missing or empty 'choices'"):
        api_trainer(tmp_path, url + "/missing", overwrite_output_dir=True).train()
    slow = APIClient(url=url + "/slow", fmt="openai", timeout=0.3)
    with pytest.raises(APIError, match="no answer within comparator_api_timeout=0.3"):
        slow.complete("A: x", 1, SAMPLING, "round 2, row 5, agent 1")
    monkeypatch.delenv(KEY_ENV)
    with pytest.raises(ConfigError, match=KEY_ENV):
        api_trainer(tmp_path, url + "/v1/chat/completions", overwrite_output_dir=True)


def test_api_config_checks():
    ok = dict(comparator="api", comparator_api_url="https://api.example.com/v1/chat/completions")
    assert MADPOConfig(**ok).comparator_api_format == "openai"
    with pytest.raises(ConfigError, match="comparator_api_url.*required"):
        MADPOConfig(comparator="api")
    with pytest.raises(ConfigError, match="comparator_api_url"):
        MADPOConfig(comparator_api_url="https://api.example.com/v1/chat/completions")
    with pytest.raises(ConfigError, match="comparator_api_url"):
        MADPOConfig(comparator="api", comparator_api_url="api.example.com")
    with pytest.raises(ConfigError, match="comparator_api_format"):
        MADPOConfig(**ok, comparator_api_format="gemini")
    with pytest.raises(ConfigError, match="comparator_api_max_n_per_request"):
        MADPOConfig(**ok, comparator_api_format="anthropic", comparator_api_max_n_per_request=4)
    with pytest.raises(ConfigError, match="comparator_api_timeout"):
        MADPOConfig(**ok, comparator_api_timeout=0)
    with pytest.raises(ConfigError, match="comparator_api_headers") as e:
        MADPOConfig(**ok, comparator_api_headers={"Authorization": "Bearer sk-live-123"})
    assert "sk-live-123" not in str(e.value)
    with pytest.raises(ConfigError, match="comparator_api_key_env") as e:
        MADPOConfig(**ok, comparator_api_key_env="sk-live-123")  # the key pasted instead of the name
    assert "sk-live-123" not in str(e.value)
    with pytest.raises(ConfigError, match="comparator_generation"):
        MADPOConfig(comparator_generation="centralized")  # the team answers each prompt on its own
    with pytest.raises(ConfigError, match="comparator_generation"):
        MADPOConfig(**ok, comparator_generation="centralized_sequential")


# ---------------------------------------------------------------------------- centralized generation
def test_centralized_api_comparator_splits_roles_and_drops_what_does_not_parse(tmp_path, server, monkeypatch):
    httpd, url = server
    monkeypatch.setenv(KEY_ENV, KEY)
    t = api_trainer(
        tmp_path,
        url + "/central/v1/chat/completions",
        comparator_generation="centralized",
        comparator_api_max_n_per_request=3,
    )
    out = t.train()
    assert len(httpd.requests) == 4  # one request per row, for all 3 joint answers
    for req in httpd.requests:
        content = req["body"]["messages"][0]["content"]
        assert "[Agent 1]\nA: Task" in content and "[Agent 2]\nB: Task" in content and "<agent_2>" in content
    records = read_jsonl(shard_path(tmp_path / "run", 0))
    assert records and all(r["chosen_side"] != r["rejected_side"] for r in records)
    seen = 0
    for r in records:
        for key in ("chosen", "rejected"):
            if r[f"{key}_side"] == 1:  # only the parsed answers (choices 1 and 2), split by role
                seen += 1
                assert r[key] in (["a1", "b" * 6], ["a2", "b" * 7])
    assert seen
    assert out["history"][0]["comparator/parse_failures"] == 4.0  # choice 0 of each row
    summary = read_jsonl(tmp_path / "run" / "pairs" / "rounds.jsonl")[0]
    assert len(summary["comparator_rewards"]) == 4 * 2


class HalvesAdapter:
    """A custom adapter: the comparator's completion, first half for agent 1, second half for agent 2."""

    def __init__(self):
        self.prompts = []

    def build_prompt(self, batch_item, agent_prompts):
        self.prompts.append(list(agent_prompts))
        return "Both: " + " | ".join(agent_prompts)

    def parse_completion(self, completion, batch_item, num_agents):
        if not completion:
            raise CentralizedComparatorParseError("empty")
        half = len(completion) // 2
        return [completion[:half], completion[half:]]


def test_centralized_model_comparator_uses_the_adapter_and_fails_when_nothing_parses(tmp_path):
    other = tmp_path / "other"
    tiny_model(seed=5).save_pretrained(other)
    tiny_tokenizer().save_pretrained(other)
    common = dict(comparator="model", comparator_model=str(other), comparator_generation="centralized")
    adapter = HalvesAdapter()
    t = MADPOTrainer(
        model=tiny_model(),
        num_agents=2,
        tokenizer=tiny_tokenizer(),
        train_dataset=ROWS,
        reward_func=length_reward,
        formatters=FORMATTERS,
        args=cfg(tmp_path, num_rounds=1, steps_per_round=1, **common),
        centralized_comparator_adapter=adapter,
    )
    t.train()
    assert len(adapter.prompts) == 4 and all(p[0].startswith("A: ") and p[1].startswith("B: ") for p in adapter.prompts)
    records = read_jsonl(shard_path(tmp_path / "run", 0))
    for r in records:
        for key in ("chosen", "rejected"):
            if r[f"{key}_side"] == 1:
                assert r[key][0] + r[key][1]  # the two halves of one non-empty completion
    # the default adapter: the tiny model never writes the tags, so the round has nothing to compare with
    t = MADPOTrainer(
        model=tiny_model(),
        num_agents=2,
        tokenizer=tiny_tokenizer(),
        train_dataset=ROWS,
        reward_func=length_reward,
        args=cfg(tmp_path, num_rounds=1, steps_per_round=1, overwrite_output_dir=True, **common),
    )
    with pytest.raises(CentralizedComparatorParseError, match="round 0: none of the centralized comparator's 12"):
        t.train()


def test_tagged_adapter_is_the_centralized_baselines_format():
    adapter = TaggedCentralizedComparatorAdapter()
    assert adapter.build_prompt({}, ["p1", "p2"]) == centralized_prompt(["p1", "p2"])
    assert adapter.parse_completion("<agent_2> y </agent_2><agent_1>x</agent_1>", {}, 2) == ["x", "y"]
    for bad in ("no tags", "<agent_1>x</agent_1>", "<agent_0>x</agent_0><agent_1>y</agent_1>"):
        with pytest.raises(CentralizedComparatorParseError):
            adapter.parse_completion(bad, {}, 2)
