"""The documentation's code runs: README / docs code blocks compile, their imports exist, and the
bring-your-own-environment example (docs/custom_environment.md, examples/custom_environment.py) trains.

The docs site holds together: mkdocs.yml's nav lists every page, every ``::: module`` of the API pages imports,
the generated config reference is current. (The strict build itself, ``mkdocs build --strict``, runs in
scripts/test.sh.)"""

from __future__ import annotations

import ast
import importlib
import re
import runpy
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DOCS_DIR = REPO / "docs"
DOCS = [REPO / "README.md", *sorted(DOCS_DIR.rglob("*.md"))]
EXAMPLE = REPO / "examples" / "custom_environment.py"


def python_blocks(path: Path) -> list[tuple[int, str]]:
    """(line number, code) of every ```python block of a markdown file."""
    out, lines = [], path.read_text(encoding="utf-8").splitlines()
    start = None
    for n, line in enumerate(lines, 1):
        stripped = line.strip()
        if start is None and re.fullmatch(r"```(python|py)", stripped):
            start = n
        elif start is not None and stripped == "```":
            out.append((start, "\n".join(lines[start : n - 1])))
            start = None
    return out


def is_module(name: str) -> bool:
    try:
        importlib.import_module(name)
    except ModuleNotFoundError:
        return False
    return True


BLOCKS = [
    pytest.param(path, line, code, id=f"{path.name}:{line}") for path in DOCS for line, code in python_blocks(path)
]


def test_readme_has_python_blocks():
    assert python_blocks(REPO / "README.md"), "README.md lost its Python examples"


@pytest.mark.parametrize("path, line, code", BLOCKS)
def test_code_block_compiles(path, line, code):
    compile(code, f"{path.name}:{line}", "exec")


@pytest.mark.parametrize("path, line, code", BLOCKS)
def test_code_block_imports_exist(path, line, code):
    """Every ``from comlrl... import X`` of a block names something that exists (and ``import comlrl.x`` a module)."""
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "comlrl":
            module = importlib.import_module(node.module)
            for alias in node.names:  # a name of the module, or a submodule (`from comlrl import envs`)
                assert alias.name == "*" or hasattr(module, alias.name) or is_module(f"{node.module}.{alias.name}"), (
                    f"{path.name}:{line}: `from {node.module} import {alias.name}`: no such name"
                )
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "comlrl":
                    importlib.import_module(alias.name)


def test_readme_imports_trainers_from_the_top_level():
    text = (REPO / "README.md").read_text(encoding="utf-8")
    assert "from comlrl import MAGRPOConfig, MAGRPOTrainer" in text


def test_readme_examples_need_no_file_beside_the_repository():
    """The README's Python examples use packaged data or rows in memory, never ../shared (tests and benchmarks only)."""
    for line, code in python_blocks(REPO / "README.md"):
        assert "shared" not in code, f"README.md:{line} reads ../shared"


def test_custom_environment_example_trains(tmp_path, capsys):
    main = runpy.run_path(str(EXAMPLE), run_name="example")["main"]
    result = main(["--tiny", "--output-dir", str(tmp_path / "run")])
    assert [m["step"] for m in result["history"]] == [1, 2]
    assert result["metrics"] is result["history"][-1]
    assert 0.0 <= result["metrics"]["reward/mean"] <= 3.0
    out = capsys.readouterr().out
    assert "trained 2 steps" in out and "eval/reward/mean" in out
    assert len((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()) == 2
    assert sorted(p.name for p in (tmp_path / "run" / "final").iterdir() if p.is_dir()) == ["agent_0", "agent_1"]


def test_custom_environment_guide_shows_the_example():
    """The guide's code is the example's (the file adds only the --tiny model and the command line)."""
    guide = (REPO / "docs" / "custom_environment.md").read_text(encoding="utf-8")
    example = EXAMPLE.read_text(encoding="utf-8")
    for name in ("def title_prompt", "def sentence_prompt", "def team_reward", "def revise", "def content_words"):
        start = example.index(name)
        body = example[start : example.index("\n\n\n", start)]
        assert body in guide, f"docs/custom_environment.md's {name} differs from examples/custom_environment.py"


# --- the docs site (mkdocs.yml) ---


def nav_pages(nav) -> list[str]:
    """Every page path of a mkdocs nav (nested lists of {title: path or list})."""
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, list):
        return [p for item in nav for p in nav_pages(item)]
    if isinstance(nav, dict):
        return [p for value in nav.values() for p in nav_pages(value)]
    return []


def test_nav_lists_every_page():
    nav = nav_pages(yaml.safe_load((REPO / "mkdocs.yml").read_text(encoding="utf-8"))["nav"])
    pages = sorted(p.relative_to(DOCS_DIR).as_posix() for p in DOCS_DIR.rglob("*.md"))
    assert sorted(set(pages) - set(nav)) == [], "docs pages missing from mkdocs.yml's nav (add them)"
    assert sorted(set(nav) - set(pages)) == [], "mkdocs.yml's nav names pages that do not exist"
    assert len(nav) == len(set(nav)), "a page is listed twice in mkdocs.yml's nav"


API_REFS = [
    pytest.param(match.group(1), id=f"{path.name}:{match.group(1)}")
    for path in sorted(DOCS_DIR.rglob("*.md"))
    for match in re.finditer(r"^::: *([\w.]+)", path.read_text(encoding="utf-8"), re.M)
]


def test_api_pages_exist():
    assert len(API_REFS) >= 30, "the API reference lost its ::: entries"


@pytest.mark.parametrize("name", API_REFS)
def test_api_reference_names_a_module(name):
    assert name.split(".")[0] == "comlrl", f"::: {name}: not a comlrl module"
    importlib.import_module(name)  # an object path (comlrl.x.Class) would fail here: the API pages list modules


def test_config_reference_is_current():
    render = runpy.run_path(str(DOCS_DIR / "gen_config_table.py"), run_name="gen_config_table")["render"]
    current = (DOCS_DIR / "config_reference.md").read_text(encoding="utf-8")
    assert current == render(), (
        "docs/config_reference.md is stale (a config field changed): run `python docs/gen_config_table.py`"
    )


def test_layout_page_names_every_import_contract():
    text = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    names = re.findall(r"^\[\[tool\.importlinter\.contracts\]\]\s*\nname = \"(.+)\"", text, re.M)
    assert names, "no import-linter contracts found in pyproject.toml"
    layout = (DOCS_DIR / "layout.md").read_text(encoding="utf-8")
    missing = [n for n in names if n not in layout]
    assert not missing, f"docs/layout.md does not describe the import-linter contracts {missing}"


def test_readme_links_exist():
    text = (REPO / "README.md").read_text(encoding="utf-8")
    links = re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", text)
    missing = [link for link in links if not (REPO / link).exists()]
    assert links and not missing, f"README.md links to missing files {missing}"


def test_docstrings_render_as_markdown():
    """docs/griffe_sphinx.py: the rewrites that keep `mkdocs build --strict` free of autorefs warnings and tables."""
    to_markdown = runpy.run_path(str(DOCS_DIR / "griffe_sphinx.py"))["to_markdown"]
    assert to_markdown("advantages[agent][turn] and `x[a][b]`") == "advantages[agent]\\[turn] and `x[a][b]`"
    assert to_markdown("see :func:`f` and :mod:`.m`") == "see `f` and `.m`"
    assert to_markdown("Example::\n\n    f(x)\n\nafter") == "Example:\n\n```text\nf(x)\n```\n\nafter"
    table = "=====  ===\nname   b\n=====  ===\n``x``  y\n=====  ===\nafter"
    assert to_markdown(table) == "```text\n=====  ===\nname   b\n=====  ===\nx      y\n=====  ===\n```\nafter"
