#!/usr/bin/env bash
# The GPU check (bench/gpu_check.py) on a GPU machine that has torch, transformers and accelerate but no
# network (e.g. the project's lent H200: Python 3.12). Two steps:
#
#   bash bench/gpu_check.sh fetch        # here, with network: the missing pure-Python wheels into .whl/
#   bash bench/gpu_check.sh [ARGS...]    # there: install .whl/ into /tmp/site, run the check (JSON to $OUT)
#
# vLLM is not carried (its wheel is far over what such a machine can be sent): the check uses HF generation,
# then, where vllm imports (a machine set up with KLSWEEP_GPU=1 ./dev.sh setup: requirements-gpu.lock), the vLLM
# colocate step: the same variants generating through TRL's colocate vLLM (gpu_check_vllm.json); else it says
# why it is skipped. VLLM_SIZES (default 0.5b) chooses its sizes.
set -euo pipefail
cd "$(dirname "$0")/.."
# What the GPU machine's image lacks, at the versions of this project's .venv.
PACKAGES=(trl datasets dill multiprocess omegaconf antlr4-python3-runtime hydra-core)
if [ "${1:-}" = fetch ]; then
    mapfile -t WHEELS < <(.venv/bin/python -c 'import importlib.metadata as m, sys
for p in sys.argv[1:]: print(f"{p}=={m.version(p)}")' "${PACKAGES[@]}")
    mkdir -p .whl
    grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >>.git/info/exclude
    python3 -m pip download -q --no-deps --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform any -d .whl "${WHEELS[@]}"
    for sdist in .whl/*.tar.gz; do  # pure-Python sdists (antlr4) become wheels: nothing is built there
        [ -e "$sdist" ] || continue
        .venv/bin/pip wheel -q --no-deps -w .whl "$sdist" && rm "$sdist"
    done
    ls .whl
    exit 0
fi
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 WANDB_MODE=disabled TOKENIZERS_PARALLELISM=false
python3 bench/gpu_check.py --out "${OUT:-.}/gpu_check.json" "$@"
if python3 -c 'import vllm' 2>/dev/null; then
    python3 bench/gpu_check.py --vllm --sizes "${VLLM_SIZES:-0.5b}" --out "${OUT:-.}/gpu_check_vllm.json"
else
    echo "vLLM colocate step skipped: vllm cannot be imported here (KLSWEEP_GPU=1 ./dev.sh setup installs it)"
fi
