#!/usr/bin/env bash
# Set up and run the whole test suite (what CI runs): the linters, the import contracts, the strict docs build, then
# pytest. Each step stops the script when it fails (set -e).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
ruff check .
ruff format --check .
lint-imports
# The docs site, built into a temporary folder outside the repository. --strict turns every warning (a broken
# link, a page missing from the nav, a docstring that does not render) into a failure; no -q, which hides warnings
# from --strict as well.
site="$(mktemp -d)"
trap 'rm -rf "$site"' EXIT
NO_MKDOCS_2_WARNING=1 mkdocs build --strict -d "$site"
# --durations: the slowest tests, printed at the end, to keep the whole command inside CI's time budget
python -m pytest -q -p no:cacheprovider --durations=25 "$@"
