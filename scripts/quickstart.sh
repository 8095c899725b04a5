#!/usr/bin/env bash
# Set up and run the main job: a short real training run of the embedded SmolLM2 team, ending with a report.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
comlrl train configs/quickstart.yaml "$@"
