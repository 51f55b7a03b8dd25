#!/usr/bin/env bash
# The GPU checks, as one script for a machine with a CUDA device (run from the repository
# root, with the project installed): the GPU-marked tests, then the variant benchmark in bf16
# at a larger shape. Results go to ${OUT:-bench/results}.
set -euo pipefail
out="${OUT:-bench/results}"
mkdir -p "$out"
python -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name())"
python -m pytest -q -m gpu tests 2>&1 | tee "$out/gpu_tests.log"
python bench/variants.py --device cuda --n-layers 16 --d-model 1024 --n-heads 16 --seq-len 1024 \
    --batch 16 --rounds 5 --steps 5 --decode-batch 32 --json "$out/variants_gpu.json" \
    2>&1 | tee "$out/variants_gpu.log"
