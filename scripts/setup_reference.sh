#!/usr/bin/env bash
# Create .venv-ref with the reference library, PyPI comlrl==1.4.3 (an unrelated older project with the same
# package name, hence its own virtualenv), for benchmarks/bench_reference.py and `bench_train.py --variants reference`.
# torch is pinned to the CPU build this machine class ships on disk (a bare `torch` downloads CUDA builds);
# transformers is the version our .venv has. comlrl 1.4.3 goes in with --no-deps: of its declared dependencies it
# imports datasets, numpy, tqdm and wandb at module level (wandb unconditionally, though it is only used when a
# wandb_config is passed); openai is never imported and pyyaml/packaging come in as dependencies of the others.
set -euo pipefail
# -P below: do not put the working directory on sys.path, where our own comlrl/ would shadow the reference.
cd "$(dirname "$0")/.."
REF_VERSION=1.4.3
if [ -x .venv-ref/bin/python ] && .venv-ref/bin/python -P - "$REF_VERSION" <<'PY' 2>/dev/null; then
import sys
from importlib.metadata import version
from comlrl.trainers.reinforce.magrpo import MAGRPOTrainer  # noqa: F401 (every runtime import resolves)
sys.exit(version("comlrl") != sys.argv[1])
PY
  echo ".venv-ref already set up (comlrl $REF_VERSION)"
  exit 0
fi
TRANSFORMERS=$(.venv/bin/python -c "from importlib.metadata import version; print(version('transformers'))" 2>/dev/null || echo "5.24.0")
[ -x .venv-ref/bin/python ] || python3 -m venv .venv-ref
PIP=(.venv-ref/bin/python -m pip install -q)
"${PIP[@]}" "torch==2.13.0"
"${PIP[@]}" "transformers==$TRANSFORMERS" "datasets>=2.0.0" "numpy>=1.21.0" "tqdm>=4.65.0" "wandb>=0.15.0" \
  "pyyaml>=6.0.1" "packaging>=21.0"
"${PIP[@]}" --no-deps "comlrl==$REF_VERSION"
.venv-ref/bin/python -P -c "from comlrl.trainers.reinforce.magrpo import MAGRPOTrainer; from importlib.metadata import version; print('.venv-ref ready: comlrl', version('comlrl'))"
