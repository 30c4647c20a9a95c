#!/usr/bin/env bash
# GPU check for torchtpu: build with the system python, run a fast subset of the tests on
# the CUDA platform, then the benchmarks with the large configs (GPT-2 124M seq 1024 bf16,
# ResNet-50 224x224). Meant for a machine with an NVIDIA GPU whose python3 already has
# torch (CUDA), jax and jax's CUDA plugin; needs no network and no venv.
#
#     bash bench/gpu_check.sh                  # from anywhere; results in bench/results/
#     OUT=/some/dir bash bench/gpu_check.sh    # also copies bench/results/ there
#
# Budget: ~8 minutes on an H200 including the build (stages are cut to fit DEADLINE_S). Every stage has its own `timeout`
# and the whole script a deadline (DEADLINE_S); a stage that fails or times out does not
# stop the later ones. Each benchmark stage writes its own bench/results/cuda-<tag>.*.
#
# Knobs (environment): PY (python3), JOBS (nproc), DEADLINE_S (470), SIZE (full),
# TORCHTPU_PLATFORM (cuda), SKIP_BUILD=1, SKIP_TESTS=1, EXTRA_ARGS (appended to bench/run.py).
set -x
set -u
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PY:-python3}
JOBS=${JOBS:-$(nproc)}
SIZE=${SIZE:-full}
DEADLINE_S=${DEADLINE_S:-470}
export TORCHTPU_PLATFORM=${TORCHTPU_PLATFORM:-cuda}
export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH}
export XLA_PYTHON_CLIENT_PREALLOCATE=false
export TORCHTPU_FALLBACK=warn
T0=$(date +%s)
mkdir -p bench/results
LOG=bench/results/gpu_check.log
: > "$LOG"
exec > >(tee -a "$LOG") 2>&1

elapsed() { echo $(( $(date +%s) - T0 )); }
stage() { set +x; echo; echo "=== [$(elapsed) s] $*"; set -x; }
# limit SECONDS: the stage's own limit, cut to what is left before the deadline.
limit() { local left=$(( DEADLINE_S - $(elapsed) )); (( left < $1 )) && echo $(( left > 5 ? left : 5 )) || echo "$1"; }
copy_out() {
  set +x
  echo "=== [$(elapsed) s] done; stage results:"; cat bench/results/gpu_check.status 2>/dev/null
  if [ -n "${OUT:-}" ]; then mkdir -p "$OUT" && cp -r bench/results "$OUT/" && echo "copied bench/results to $OUT"; fi
}
trap copy_out EXIT
: > bench/results/gpu_check.status
record() { echo "$1 rc=$2 at $(elapsed)s" >> bench/results/gpu_check.status; }

stage "versions"
uname -a
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || nvidia-smi || true
"$PY" - <<'EOF'
import sys
print("python", sys.version)
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available(),
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
import jax, jaxlib
print("jax", jax.__version__, "jaxlib", jaxlib.__version__)
print("jax devices", jax.devices())
for name in ("pytest", "matplotlib", "triton"):
    try:
        mod = __import__(name); print(name, getattr(mod, "__version__", "?"))
    except Exception as exc:
        print(name, "missing:", exc)
EOF
g++ --version | head -1
command -v ccache || true

if [ "${SKIP_BUILD:-0}" != 1 ]; then
  stage "build (system python, no venv)"
  # `make extension` compiles with this python's torch and creates no venv (`make build`
  # would install the pinned dependencies into .venv first).
  rm -rf build torchtpu/_native
  timeout "$(limit 240)" make extension PY="$PY" JOBS="$JOBS"
  rc=$?; record build $rc
  ls -la torchtpu/_native/* || true
fi

stage "import"
timeout "$(limit 90)" "$PY" -c "
import torch, torchtpu
print('torchtpu', torchtpu.__version__, 'platform', torchtpu.platform())
x = torch.randn(64, 64, device='tpu'); y = (x @ x).sum()
print('matmul ok', float(y), float((x.cpu() @ x.cpu()).sum()))
print(torchtpu.metrics.report())
"
record import $?

stage "python -m torchtpu (versions, platform, devices)"
timeout "$(limit 60)" "$PY" -m torchtpu
record report $?

if [ "${SKIP_TESTS:-0}" != 1 ] && "$PY" -c "import pytest" 2>/dev/null; then
  stage "tests (fast subset, TORCHTPU_PLATFORM=$TORCHTPU_PLATFORM)"
  timeout "$(limit 100)" "$PY" -m pytest -q -x -p no:cacheprovider --durations=5 \
    tests/test_smoke.py tests/test_device.py tests/test_engine.py \
    tests/ops/test_elementwise.py tests/ops/test_nn.py tests/ops/test_loss.py
  record tests $?
fi

# The PJRT runtime (TORCHTPU_RUNTIME=pjrt: jax's CUDA plugin driven through the PJRT C API,
# no Python on the launch path), then both runtimes side by side: launch cost in strict mode
# against PyTorch eager, and the GPT step in strict, fused and compiled mode.
stage "pjrt runtime: report and fast tests"
TORCHTPU_RUNTIME=pjrt timeout "$(limit 60)" "$PY" -m torchtpu
record pjrt-report $?
if [ "${SKIP_TESTS:-0}" != 1 ] && "$PY" -c "import pytest" 2>/dev/null; then
  TORCHTPU_RUNTIME=pjrt timeout "$(limit 100)" "$PY" -m pytest -q -x -p no:cacheprovider --durations=5 \
    tests/test_smoke.py tests/test_device.py tests/ops/test_elementwise.py tests/test_jax_interop.py
  record pjrt-tests $?
fi
stage "bench: jaxlib vs pjrt runtime side by side"
timeout "$(limit 150)" "$PY" bench/runtimes.py --size "$SIZE" --rounds 2
record bench-runtimes $?

BENCH=("$PY" bench/run.py --size "$SIZE" --warmup 2 --repeats 5 --child-timeout 120 ${EXTRA_ARGS:-})

stage "bench: GPT-2 124M bf16, all variants"
timeout "$(limit 200)" "${BENCH[@]}" --models gpt --skip firststep,scaling,input,distributed --tag gpt
record bench-gpt $?

stage "bench: ResNet-50, all variants"
timeout "$(limit 150)" "${BENCH[@]}" --models resnet --skip firststep,scaling,perop,input,distributed --tag resnet
record bench-resnet $?

stage "bench: first step cold / warm cache (GPT fused)"
timeout "$(limit 100)" "${BENCH[@]}" --models gpt --skip main,scaling,perop,input,distributed --firststep gpt:tpu-fused --tag firststep
record bench-firststep $?

stage "bench: input pipeline, prefetch vs none"
timeout "$(limit 90)" "${BENCH[@]}" --models gpt --skip main,firststep,scaling,perop,distributed --tag input
record bench-input $?

# DDP/FSDP2 under torchrun needs one GPU per process (2 processes vs 1).
if (( $(nvidia-smi -L 2>/dev/null | wc -l) >= 2 )); then
  stage "bench: distributed (torchrun, 2 processes vs 1)"
  timeout "$(limit 150)" "$PY" bench/distributed.py --size "$SIZE"
  record bench-distributed $?
fi

if (( DEADLINE_S - $(elapsed) > 60 )); then
  stage "bench: LM scaling (fused), with what time is left"
  timeout "$(limit 200)" "${BENCH[@]}" --models gpt --variants tpu-fused --skip main,firststep,perop,input,distributed --tag scaling
  record bench-scaling $?
fi
