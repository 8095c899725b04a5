"""vllm_mode='server': a LoRA team trains against a real vLLM server that this module starts on the loopback
interface (vLLM's CPU build) and stops; its adapters reach the server through runtime LoRA loading after each
step, and the server's greedy tokens then equal the trained model's."""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
import torch
from test_vllm import GREEDY, LORA, ROWS, batch, cfg, length_reward
from tiny import tiny_model, tiny_tokenizer

from comlrl import MAGRPOTrainer
from comlrl.errors import ConfigError
from comlrl.rollout.generation import TRANSFORMERS, VLLM_ENGINE, vllm_installed
from comlrl.rollout.protocol import VLLMOptions
from comlrl.rollout.vllm_server import ServerEngine

pytestmark = pytest.mark.skipif(not vllm_installed(), reason="vllm is not installed (scripts/setup.sh installs it)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """(base model folder, port) of a vLLM server serving a tiny Llama with runtime LoRA loading."""
    folder = tmp_path_factory.mktemp("served") / "base"
    tiny_model(1, hidden=128).save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    port = free_port()
    env = {**os.environ, "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True", "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(folder)]
    command += ["--host", "127.0.0.1", "--port", str(port), "--dtype", "float32", "--enforce-eager", "--seed", "0"]
    command += [
        "--max-model-len",
        "256",
        "--kv-cache-memory-bytes",
        str(2**28),
        "--logprobs-mode",
        "processed_logprobs",
    ]
    command += ["--enable-lora", "--max-lora-rank", "8", "--max-loras", "2", "--max-cpu-loras", "2"]
    log = open(folder.parent / "server.log", "w")
    process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 300
        while True:
            if process.poll() is not None:
                log.flush()
                pytest.fail(f"the vLLM server exited: {(folder.parent / 'server.log').read_text()[-3000:]}")
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail("the vLLM server did not come up within 300 s")
                time.sleep(1.0)
        yield str(folder), port
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
        log.close()


def test_lora_team_trains_against_the_server_and_its_adapters_follow(server):
    folder, port = server
    args = cfg(vllm_mode="server", vllm_server_host="127.0.0.1", vllm_server_port=port, vllm_server_timeout=30)
    t = MAGRPOTrainer(
        model=folder,
        num_agents=2,
        tokenizer=tiny_tokenizer(),
        train_dataset=ROWS,
        reward_func=length_reward,
        args=args,
        peft_config=LORA,
    )
    history = t.train()["history"]
    assert len(history) == 2 and all(any(k.endswith("rollout_kl") for k in h) for h in history), history[0].keys()
    engine = VLLM_ENGINE.engines[t.agents[0].model]
    assert isinstance(engine, ServerEngine)
    settings = dataclasses.replace(GREEDY, vllm=t.vllm_options)
    for agent in t.agents:
        b = batch(["hello world", "abc"], adapter_names=[agent.adapter] * 2)
        ours = TRANSFORMERS.sample(agent.model, b, GREEDY).ids
        assert torch.equal(VLLM_ENGINE.sample(agent.model, b, settings).ids, ours), agent.adapter
    served = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5).read())
    adapters = sorted(m["id"] for m in served["data"] if m["id"] != folder)
    assert adapters == sorted(v.name for v in engine.versions.values())  # the latest versions only
    assert min(v.lora_id for v in engine.versions.values()) > 2  # pushed again after the steps


def test_a_fully_fine_tuned_agent_is_refused_in_server_mode(server):
    with pytest.raises(ConfigError, match="vllm_mode='colocate'"):
        ServerEngine(tiny_model(hidden=128), VLLMOptions(mode="server", server_port=server[1]))


def test_no_server_fails_naming_host_port_and_timeout():
    base = tiny_model(hidden=128)
    from comlrl.engine.team import build_lora_team

    team = build_lora_team([base], [0], LORA)[0][0]
    with pytest.raises(ConfigError, match="vllm_server_timeout=1 s"):
        ServerEngine(
            team, VLLMOptions(mode="server", server_host="127.0.0.1", server_port=free_port(), server_timeout=1)
        )
