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


def in_process_runs(root: Path, specs: dict[str, dict]) -> Callable[[str], Path]:
    """``get(name)``: the single-process run of ``specs[name]`` into ``root/name``, run on first use only."""
    done: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in done:
            done[name] = run_in_process(root / name, specs[name])
        return done[name]

    return get


class SharedLaunch:
    """One torchrun job of ``nproc`` ranks that runs several scenarios ({name: dist_worker spec}) one after another,
    each into ``root/name``: the start-up (imports, process group) is paid once. Started by the first scenario asked
    for, after ``prepare(root)``; calling it with a name returns that scenario's folder, or fails naming the
    scenario when a rank did not finish it."""

    def __init__(
        self, nproc: int, root: Path, scenarios: dict[str, dict], prepare: Callable[[Path], None] | None = None
    ) -> None:
        self.nproc, self.root, self.scenarios, self.prepare = nproc, root, scenarios, prepare
        self.result: tuple[int, str, float] | None = None

    def __call__(self, name: str) -> Path:
        assert name in self.scenarios, f"no scenario {name!r} in this launch: {sorted(self.scenarios)}"
        if self.result is None:
            if self.prepare is not None:
                self.prepare(self.root)
            timeout = 150 + 90 * len(self.scenarios)  # a scenario takes 5-20 s on 2 idle cores
            try:
                self.result = torchrun(self.nproc, self.root, {"scenarios": self.scenarios}, timeout=timeout)
            except subprocess.TimeoutExpired as e:  # recorded, so the other scenarios' tests do not wait again
                out = e.output.decode(errors="replace") if isinstance(e.output, bytes) else e.output or ""
                self.result = (-1, f"{out}\n(torchrun timed out after {timeout} s)", timeout)
        rc, log, _ = self.result
        out = self.root / name
        missing = [r for r in range(self.nproc) if not (out / f"done.rank{r}").is_file()]
        if missing:
            stopped = next(n for n in self.scenarios if not (self.root / n / f"done.rank{missing[0]}").is_file())
            raise AssertionError(
                f"scenario {name!r} of the {self.nproc}-rank launch did not finish on rank(s) {missing} "
                f"(exit code {rc}; the job stopped in scenario {stopped!r}); the log ends:\n{log[-4000:]}"
            )
        return out


def critic_params(out: Path) -> dict[int, list[list[torch.Tensor]]]:
    """critic index -> the trainable parameters every rank holding it saved."""
    found: dict[int, list] = {}
    for path in sorted(out.glob("critics.rank*.pt")):
        for i, params in torch.load(path).items():
            found.setdefault(i, []).append(params)
    return found


CLI_DRIVER = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    sys.path.insert(0, {tests!r})
    import torch, toy_env
    torch.set_num_threads(1)
    toy_env.register()
    from comlrl.cli import main
    for name, argv in json.loads(sys.argv[1]).items():  # several runs, one after another, in the same processes
        print(f"=== cli run {{name}} ===", file=sys.stderr, flush=True)
        code = main(argv)
        Path(sys.argv[2], f"{{name}}.rank{{torch.distributed.get_rank()}}.exit").write_text(str(code))
        if code:
            sys.exit(code)
""")


def cli_runs_under_torchrun(root: Path, runs: dict[str, dict]) -> tuple[Callable[[str], tuple[Path, str]], str]:
    """``comlrl train`` of the toy env with a saved tiny model on 2 ranks, 2 steps, once per ``runs`` entry (name ->
    {"sections": top-level config keys to replace, **more training fields}), all in one torchrun job. Returns
    (``get(name)``: that run's folder and config path, failing with the log when it did not exit 0 on both ranks;
    the job's log)."""
    import toy_env
    import yaml

    tiny = root / "tiny"
    tiny_model().save_pretrained(tiny)
    tiny_tokenizer().save_pretrained(tiny)
    rows = toy_env.write_rows(root / "rows.jsonl")
    found, argvs = {}, {}
    for name, fields in runs.items():
        training = dict(fields)
        sections = training.pop("sections", None)
        cfg = toy_env.write_config(root / f"{name}.yaml", rows, str(tiny), max_steps=2, save_steps=2, **training)
        if sections:
            Path(cfg).write_text(yaml.safe_dump({**yaml.safe_load(Path(cfg).read_text()), **sections}))
        found[name] = (root / name, cfg)
        argvs[name] = ["train", cfg, "--set", f"output_dir={root / name}"]
    driver = root / "driver.py"
    driver.write_text(CLI_DRIVER.format(tests=str(TESTS)))
    rc, log, _ = torchrun(2, root, {}, script=driver, args=[json.dumps(argvs), str(root)], timeout=150 + 90 * len(runs))

    def get(name: str) -> tuple[Path, str]:
        exits = [root / f"{name}.rank{r}.exit" for r in (0, 1)]
        assert all(p.is_file() and p.read_text() == "0" for p in exits), (
            f"cli run {name!r} did not exit 0 on both ranks (job exit code {rc}); the log ends:\n{log[-4000:]}"
        )
        return found[name]

    return get, log


def cli_under_torchrun(tmp_path: Path, sections: dict | None = None, **training) -> tuple[Path, str, str]:
    """``comlrl train`` of the toy env with a saved tiny model on 2 ranks, 2 steps (``training``: more training
    fields; ``sections``: top-level config keys to replace); returns (the run folder, the config's path, the log)."""
    get, log = cli_runs_under_torchrun(tmp_path, {"run": {"sections": sections, **training}})
    run_dir, cfg = get("run")
    return run_dir, cfg, log
