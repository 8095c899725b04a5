#!/usr/bin/env bash
# The reasoning env's learning run: the embedded SmolLM2-135M team (LoRA) trained with MAGRPO on chain_sum with the
# terms split between the two agents (each sees only its own terms; the team answer is the sum of their values),
# then compared on held-out problems: the trained team against the untrained team and the single and parallel
# baselines, greedy, with paired 95% bootstrap intervals (comlrl compare).
#
#   bash benchmarks/reasoning_learning.sh [OUT]      (default OUT: runs/reasoning-learning; STEPS=40 ROWS=100)
#
# It runs in the .venv of scripts/setup.sh.
# One torch thread (OMP_NUM_THREADS=1): on shared cores, two threads stall waiting for each other.
set -euo pipefail
cd "$(dirname "$0")/.."
. .venv/bin/activate
OUT="${1:-runs/reasoning-learning}"
STEPS="${STEPS:-40}"
ROWS="${ROWS:-100}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
CONFIG="$OUT/reasoning_chain_sum.yaml"
mkdir -p "$OUT"
cat > "$CONFIG" <<YAML
name: reasoning-chain-sum
algorithm: magrpo
env:
  name: reasoning
  options:
    task: chain_sum
    roles: split
    task_config: {min_terms: 2, max_terms: 4, min_digits: 1, max_digits: 1}
data:
  split: train
  eval_split: test
  eval_limit: $ROWS
model: embedded
num_agents: 2
lora: {r: 16, lora_alpha: 32, lora_dropout: 0.0, target_modules: all-linear}
training:
  seed: 0
  learning_rate: 5.0e-4
  per_device_train_batch_size: 4
  num_generations: 4
  max_new_tokens: 64
  temperature: 0.8
  apply_chat_template: true
  max_steps: $STEPS
  logging_steps: 1
  save_steps: 20
  save_total_limit: 1
evaluation: {before: false, after: false}
YAML
start=$(date +%s)
comlrl train "$CONFIG" --set output_dir="$OUT/team"
trained=$(date +%s)
comlrl compare team=run:"$OUT/team" untrained=untrained:"$CONFIG" single=baseline:single@"$CONFIG" \
  parallel=baseline:parallel@"$CONFIG" --control untrained --rows "$ROWS" --out "$OUT/compare"
echo "train: $((trained - start)) s, compare: $(($(date +%s) - trained)) s, commit $(git rev-parse --short HEAD)"
