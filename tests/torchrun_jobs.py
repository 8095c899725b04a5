"""Jobs of tests/dist_worker.py's tiny 2-agent team under torchrun (CPU, gloo) and in one process, and readers of
what each run saved (weights, critics, metrics), for the tests that compare a multi-rank run with one process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Callable

import dist_worker
import torch
from tiny import tiny_model, tiny_tokenizer

TESTS = Path(__file__).resolve().parent


def torchrun(
    nproc: int, out: Path, spec: dict, timeout: float = 150, script: Path | None = None, args: list[str] | None = None
) -> tuple[int, str, float]:
    """(exit code, combined output, seconds) of a torchrun job on CPU."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        str(script or TESTS / "dist_worker.py"),
        *(args if args is not None else [str(out), json.dumps(spec)]),
    ]
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "OMP_NUM_THREADS": "1",
        "CUDA_VISIBLE_DEVICES": "",
    }
    start = time.monotonic()
    proc = subprocess.run(cmd, cwd=TESTS.parent, env=env, capture_output=True, text=True, timeout=timeout)
    return proc.returncode, proc.stdout + proc.stderr, time.monotonic() - start


def agent_weights(out: Path) -> dict[int, list[dict]]:
    """agent index -> the state dicts (on CPU) every rank holding it saved."""
    found: dict[int, list[dict]] = {}
    for path in sorted(out.glob("weights.rank*.pt")):
        for i, state in torch.load(path, map_location="cpu").items():
            found.setdefault(i, []).append(state)
    return found


def history(out: Path) -> list[dict]:
    """Rank 0's metrics per step, without the timings (they differ between any two runs)."""
    rows = json.loads((out / "history.rank0.json").read_text())
    return [{k: v for k, v in h.items() if not k.startswith(("time/", "perf/"))} for h in rows]


def assert_same_weights(ref: dict, got: dict, atol: float = 0.0) -> None:
    """Every copy of every agent in ``got`` equals the one-process ``ref`` (bitwise when ``atol`` is 0)."""
    assert sorted(got) == sorted(ref)
    for i, states in got.items():
        for state in states:
            for k, v in state.items():
                if atol == 0:
                    assert torch.equal(v, ref[i][0][k]), (i, k, float((v - ref[i][0][k]).abs().max()))
                else:
                    torch.testing.assert_close(v, ref[i][0][k], atol=atol, rtol=0, msg=f"agent {i} {k}")


def run_in_process(out: Path, spec: dict) -> Path:
    """The single-process run of ``spec`` (dist_worker.run in this process, one thread)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the torchrun workers: same float reductions
    try:
        dist_worker.run(out, spec)
    finally:
        torch.set_num_threads(threads)
    return out


def cached_runs(root: Path, ref_spec: dict, dist_spec: dict) -> Callable[[str], Path]:
    """``get(name)``: 'ref' runs ``ref_spec`` in this process, any other name ``dist_spec`` on 2 ranks; each once."""
    cache: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in cache:
            out = root / name
            if name == "ref":
                run_in_process(out, ref_spec)
            else:
                rc, log, _ = torchrun(2, out, dist_spec)
                assert rc == 0, log[-4000:]
            cache[name] = out
        return cache[name]

    return get


def critic_params(out: Path) -> dict[int, list[list[torch.Tensor]]]:
    """critic index -> the trainable parameters every rank holding it saved."""
    found: dict[int, list] = {}
    for path in sorted(out.glob("critics.rank*.pt")):
        for i, params in torch.load(path).items():
            found.setdefault(i, []).append(params)
    return found


CLI_DRIVER = textwrap.dedent("""
    import sys
    sys.path.insert(0, {tests!r})
    import torch, toy_env
    torch.set_num_threads(1)
    toy_env.register()
    from comlrl.cli import main
    sys.exit(main(sys.argv[1:]))
""")


def cli_under_torchrun(tmp_path: Path, sections: dict | None = None, **training) -> tuple[Path, str, str]:
    """``comlrl train`` of the toy env with a saved tiny model on 2 ranks, 2 steps (``training``: more training
    fields; ``sections``: top-level config keys to replace); returns (the run folder, the config's path, the log)."""
    import toy_env

    tiny = tmp_path / "tiny"
    tiny_model().save_pretrained(tiny)
    tiny_tokenizer().save_pretrained(tiny)
    rows = toy_env.write_rows(tmp_path / "rows.jsonl")
    cfg = toy_env.write_config(tmp_path / "toy.yaml", rows, str(tiny), max_steps=2, save_steps=2, **training)
    if sections:
        import yaml

        Path(cfg).write_text(yaml.safe_dump({**yaml.safe_load(Path(cfg).read_text()), **sections}))
    driver = tmp_path / "driver.py"
    driver.write_text(CLI_DRIVER.format(tests=str(TESTS)))
    run_dir = tmp_path / "run"
    rc, log, _ = torchrun(2, tmp_path, {}, script=driver, args=["train", cfg, "--set", f"output_dir={run_dir}"])
    assert rc == 0, log[-4000:]
    return run_dir, cfg, log
