"""The data shipped inside the package (comlrl/envs/data/): it loads through each environment with no
source and no network, equals the benchmark files it was copied from, and is what every example
config (the quick start included) trains on, without reading the benchmark folder next to the repo."""

import builtins
import fnmatch
import gzip
import io
import logging
import os
from pathlib import Path

import pytest

import comlrl.envs as envs
from comlrl import runconfig, runs
from comlrl.envs import DatasetError
from comlrl.envs.coding.classeval import task_from_row as class_task
from comlrl.envs.coding.tasks import task_from_row as code_task
from comlrl.envs.core import loaders
from comlrl.envs.core.packaged import PACKAGED, read_packaged

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "configs"
DATA = REPO / "comlrl" / "envs" / "data"
SHARED_FILES = {  # packaged file -> the file of ../shared/data it is a gzip of
    "tldr_posts.jsonl.gz": "tldr_posts_extra.jsonl",
    "arxiv_abstracts.jsonl.gz": "arxiv_abstracts.jsonl",
    "mbpp.jsonl.gz": "mbpp.jsonl",
    "classeval.json.gz": "classeval.json",
}
# name -> (default split, rows, fields of the loaded rows)
EXPECTED = {
    "tldr": ("train", 100, {"prompt", "completion"}),
    "arxiv": ("train", 200, {"abstract", "article_id"}),
    "mbpp": (
        "test",
        500,
        {"task_id", "prompt", "entry_point", "test", "test_list", "test_setup_code", "canonical_solution"},
    ),
    "classeval": (
        "test",
        100,
        {"task_id", "skeleton", "class_name", "imports", "constructor", "methods", "test", "canonical_solution"},
    ),
}


@pytest.fixture
def no_hub(monkeypatch):
    """Any attempt to reach the Hugging Face Hub fails the test."""

    def refuse(*args, **kwargs):
        raise AssertionError(f"tried the hub: {args}")

    monkeypatch.setattr(loaders, "load_hub", refuse)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_packaged_rows_load_through_the_env(name, no_hub, caplog):
    split, count, fields = EXPECTED[name]
    env = envs.make(name)
    with caplog.at_level(logging.INFO, logger="comlrl.envs"):
        ds = env.load_dataset()
    assert ds.num_rows == count and set(ds.column_names) == fields
    assert f"{name}: {count} rows from package data comlrl/envs/data/{PACKAGED[name].file} (split '{split}')" in (
        caplog.text
    )
    row = ds[0]
    prompts = [fmt(row) for fmt in env.formatters()]
    assert len(prompts) == 2 and all(p.strip() for p in prompts)
    if name == "tldr":
        assert all(r["prompt"] and not r["prompt"].endswith("TL;DR:") and r["completion"] for r in ds)
    elif name == "arxiv":
        assert all(r["abstract"] for r in ds) and ds["article_id"][:2] == ["0704.0001", "0704.0002"]
    elif name == "mbpp":
        task = code_task(row)
        assert task.task_id == "11" and task.entry_point and task.tests and task.canonical_solution
    else:
        task = class_task(row)
        assert task.task_id == "ClassEval_0" and task.methods and "unittest" in task.test and task.canonical_solution


def test_mbpp_packaged_splits_are_the_papers(no_hub):
    env = envs.make("mbpp")
    ids = {s: [int(t) for t in env.load_dataset(split=s)["task_id"]] for s in PACKAGED["mbpp"].splits}
    assert {s: (v[0], v[-1], len(v)) for s, v in ids.items()} == {
        "prompt": (1, 10, 10),
        "test": (11, 510, 500),
        "validation": (511, 600, 90),
        "train": (601, 974, 374),
    }
    assert sorted(sum(ids.values(), [])) == list(range(1, 975))  # disjoint, every task once
    assert env.load_dataset(split="train", limit=3)["task_id"] == ["601", "602", "603"]


def test_unknown_packaged_split_names_the_ones_there_are(no_hub):
    message = r"tldr_posts\.jsonl\.gz has the split\(s\) 'train', not 'test'; pass a source"
    with pytest.raises(DatasetError, match=message):
        envs.make("tldr").load_dataset(split="test")


@pytest.mark.parametrize("packaged, original", sorted(SHARED_FILES.items()))
def test_packaged_files_are_the_benchmark_files(packaged, original, shared_data):
    assert gzip.decompress((DATA / packaged).read_bytes()) == (shared_data / original).read_bytes()
    assert read_packaged(packaged) == loaders.read_json_records(str(shared_data / original))


def test_tldr_packaged_rows_equal_the_benchmark_posts(shared_data, caplog):
    env = envs.make("tldr")
    packaged = env.load_dataset()
    caplog.clear()  # the packaged load above is logged too when an earlier test left INFO on
    with caplog.at_level(logging.INFO, logger="comlrl.envs"):
        explicit = env.load_dataset(str(shared_data / "tldr_posts_extra.jsonl"))  # an explicit source still works
    assert packaged.to_list() == explicit.to_list()
    assert "tldr_posts_extra.jsonl" in caplog.text and "package data" not in caplog.text


def test_quickstart_trains_on_the_first_64_posts_and_evaluates_on_the_next_4(no_hub):
    cfg = runconfig.load_config(CONFIGS / "quickstart.yaml")
    env = runs.make_env(cfg)
    train, evaluation = runs.load_data(cfg, env)
    posts = envs.make("tldr").load_dataset().to_list()
    assert train.to_list() == posts[:64] and evaluation.to_list() == posts[64:68]
    assert not set(train["prompt"]) & set(evaluation["prompt"])


def _outside_repo_shared(path) -> bool:
    if isinstance(path, int):  # a file descriptor
        return False
    full = os.path.abspath(os.fsdecode(path))
    return "shared" in full and not full.startswith(str(REPO) + os.sep)


def test_every_config_resolves_its_data_without_touching_shared(monkeypatch, no_hub):
    touched = []

    def watch(fn):
        def wrapper(*args, **kwargs):
            touched.extend(args[:1])
            return fn(*args, **kwargs)

        return wrapper

    loaded = {}
    for path in sorted(CONFIGS.glob("*.yaml")):
        cfg = runconfig.load_config(path)
        d = cfg.data
        assert not any(_outside_repo_shared(s) for s in (d.source, d.eval_source) if s), path.name
        if isinstance(d.source, str) and loaders.looks_like_hub_id(d.source):
            assert cfg.env.name == "coophumaneval", path.name  # the one env with no offline data
            continue
        key = (cfg.env.name, d.source, d.split, d.limit, d.eval_split, d.eval_limit)
        if key in loaded:
            continue
        with monkeypatch.context() as m:
            for module, name in ((builtins, "open"), (io, "open"), (os, "stat"), (os, "scandir"), (os, "listdir")):
                m.setattr(module, name, watch(getattr(module, name)))
            train, evaluation = runs.load_data(cfg, runs.make_env(cfg))
        loaded[key] = path.name
        assert train.num_rows > 0 and evaluation is not None and evaluation.num_rows == d.eval_limit, path.name
        if cfg.env.name == "mbpp":  # trains on MBPP's train split, evaluates on its test split
            assert int(train["task_id"][0]) == 601 and evaluation["task_id"][0] == "11"
    assert {k[0] for k in loaded} == set(envs.list_envs()) - {"coophumaneval"}
    opened = [os.fsdecode(p) for p in touched if not isinstance(p, int)]
    assert not [p for p in opened if _outside_repo_shared(p)]
    assert {f for f in SHARED_FILES if any(p.endswith(f) for p in opened)} == set(SHARED_FILES)  # read the package


def test_library_and_main_job_never_name_the_benchmark_folder():
    files = [p for p in (REPO / "comlrl").rglob("*") if p.is_file() and p.suffix in (".py", ".md", ".txt", ".toml")]
    files += list(CONFIGS.glob("*.yaml")) + [CONFIGS / "make_configs.py", REPO / "scripts" / "quickstart.sh"]
    assert len(files) > 20
    named = [(str(p.relative_to(REPO)), s) for p in files for s in ("../shared", "shared/data") if s in p.read_text()]
    assert named == []


def test_every_packaged_file_is_declared_as_package_data():
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    patterns = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["comlrl.envs"]
    files = sorted(p.relative_to(DATA.parent).as_posix() for p in DATA.iterdir() if p.is_file())
    assert {spec.file for spec in PACKAGED.values()} <= {Path(f).name for f in files}
    assert [f for f in files if not any(fnmatch.fnmatch(f, pat) for pat in patterns)] == []
    assert sum((DATA / spec.file).stat().st_size for spec in PACKAGED.values()) < 450_000  # a few hundred KB
    sources = (DATA / "SOURCES.md").read_text()
    assert all(spec.file in sources for spec in PACKAGED.values()) and "Licence" in sources
