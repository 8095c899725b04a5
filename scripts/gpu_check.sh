#!/usr/bin/env bash
# Set up, print the GPU environment, and run the checks that need a GPU (tests/gpu/test_cuda.py, marker `cuda`; then
# tests/rollout/test_vllm.py when CUDA and vllm are both there). The NCCL checks (data parallel and FSDP sharding, in
# tests/gpu/test_cuda.py) need 2 GPUs and skip with one. FSDP offload (shards and gradients in CPU memory, so the process
# group needs a CPU backend too) with gradient-norm clipping: test_nccl_fsdp_offload_two_gpus_clips_gradients on
# 2 GPUs, test_fsdp_offload_one_gpu_world_of_one_clips_gradients on one (a world of one rank).
# On a machine without CUDA every test skips with its reason and this exits 0. Extra arguments go to pytest;
# COMLRL_TEST_DEVICE=cpu runs the same checks on CPU (the NCCL one still skips).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh  # keeps an installed torch (e.g. a CUDA build); installs the CPU pin only if torch is missing
. .venv/bin/activate
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi -L || true
else
  echo "nvidia-smi: not found"
fi
python - <<'EOF'
import torch

cuda = torch.cuda.is_available()
print(f"torch {torch.__version__}, built for CUDA {torch.version.cuda}")
print(f"cuda available: {cuda}, device count: {torch.cuda.device_count() if cuda else 0}")
if cuda:
    print(f"bf16 supported: {torch.cuda.is_bf16_supported()}")
    for i in range(torch.cuda.device_count()):
        print(f"  cuda:{i}: {torch.cuda.get_device_name(i)}")
EOF
python -m pytest -q -p no:cacheprovider -m cuda -rs tests/gpu/test_cuda.py "$@"
# vLLM rollouts on the GPU (tests/rollout/test_vllm.py, use_vllm=True): only with CUDA and the `vllm` package (the `vllm`
# extra, docs/vllm.md). setup.sh installs vLLM's CPU build only where no vllm imports; that one cannot use the GPU.
# Sleep mode (vllm_enable_sleep_mode) with two engines in one process: test_sleep_mode_refuses_a_second_engine_on_cuda
# (refused before vLLM starts it, the first engine intact), test_vllm_sleep_mode_allocator_holds_one_engine_per_process
# (vLLM's one allocator per process refuses a second engine: why the refusal), and
# test_colocated_on_cuda_with_sleep_mode_follows_the_steps (one engine sleeps and wakes; closed, it frees the claim).
# The importance weight under top-p / top-k / repetition penalty against vLLM's GPU sampler kernels (Triton top-k /
# top-p): test_importance_weights_are_one_where_vllm_and_the_decode_loop_agree.
if ! python -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
  echo "tests/rollout/test_vllm.py: skipped on the GPU (torch sees no CUDA device)"
elif ! python -c "import vllm" >/dev/null 2>&1; then
  echo "tests/rollout/test_vllm.py: skipped on the GPU (vllm does not import; pip install 'comlrl[vllm]' after the CUDA torch)"
else
  python -m pytest -q -p no:cacheprovider -rs tests/rollout/test_vllm.py "$@"
fi
