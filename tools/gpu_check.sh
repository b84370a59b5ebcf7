#!/usr/bin/env bash
# GPU check of the onnxnorm CUDA kernels, for a fresh GPU machine with python3 + torch (CUDA),
# nvcc and CMake but no internet and nothing of this project installed:
#   1. builds the CPU and CUDA libraries into a build folder (cmake, ONNXNORM_CUDA=ON; for the
#      GPU present only, unless ONNXNORM_CUDA_ARCHITECTURES says otherwise);
#   2. runs tests/test_cuda.py: the correctness matrix of tests/cuda_harness.py (every op x dtype
#      x rounding order x optional input against the numpy reference through the C launcher; the
#      quantized ops' quantized values, scale and zero point exactly the reference's;
#      GatedRMSNorm's gates and groups and L2Norm's per-head rows), bad arguments, streams, and,
#      where onnxruntime offers the CUDA execution provider, the ORT custom ops on it (the CPU
#      library registers them and loads the CUDA library next to it), GatedRMSNorm and L2Norm
#      included;
#   3. prints the bandwidth table (python -m onnxnorm.bench.cuda: the float ops, then the norms of
#      hybrid models, Qwen3-Next's and Mamba2's gated norms and L2Norm of q/k, for a decoded token
#      and a 512-token prefill) and writes it, with its JSON, into the build folder.
# Usage: tools/gpu_check.sh [BUILD_DIR]        (default build/gpu-check)
# Environment: PYTHON (default python3), ONNXNORM_CUDA_ARCHITECTURES, ONNXRUNTIME_INCLUDE_DIR
# (else third_party/onnxruntime/include, which tools/get_ort_headers.sh fills where there is
# internet: carry it along to machines without), GPU_CHECK_REPS (default 30).
# GPU_CHECK_DRY_RUN=1 runs every step up to the first one that needs a GPU and checks the rest
# without running it: the commands are printed, the test module is collected and the benchmark's
# command line parsed (tests/test_cuda.py does this on every test run, so the script cannot
# rot between the rare sessions that have a GPU).
# Exit status: non-zero when the build or a test fails. Takes about 2-4 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"
start=$SECONDS
build="${1:-build/gpu-check}"
python="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1

step() { printf '\n=== %s (%ds)\n' "$*" $((SECONDS - start)); }
dry="${GPU_CHECK_DRY_RUN:-0}"
# runs a command, or in a dry run prints it
run() { if [[ "$dry" == 1 ]]; then printf 'dry run: %s\n' "$*"; else "$@"; fi; }

step "machine"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || true
if [[ "$dry" == 1 ]]; then
  { nvcc --version 2>/dev/null || echo "nvcc: not found"; } | tail -1
else
  nvcc --version | tail -1
fi
"$python" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "device", torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)'

if [[ -z "${ONNXNORM_CUDA_ARCHITECTURES:-}" ]]; then
  cc="$("$python" -c 'import torch; m, n = torch.cuda.get_device_capability(0); print(f"{m}{n}")' 2>/dev/null || true)"
  export ONNXNORM_CUDA_ARCHITECTURES="${cc:+${cc}-real}"
  export ONNXNORM_CUDA_ARCHITECTURES="${ONNXNORM_CUDA_ARCHITECTURES:-80-real;90-real;90-virtual}"
fi
if [[ "$dry" != 1 && -z "${ONNXRUNTIME_INCLUDE_DIR:-}" && \
      ! -f /usr/include/onnxruntime/onnxruntime_c_api.h && \
      ! -f third_party/onnxruntime/include/onnxruntime_c_api.h ]]; then
  echo "gpu_check: no ONNX Runtime headers: run tools/get_ort_headers.sh where there is internet and" \
       "bring third_party/onnxruntime/include along, or set ONNXRUNTIME_INCLUDE_DIR" >&2
  exit 2
fi

step "build (CUDA architectures ${ONNXNORM_CUDA_ARCHITECTURES})"
mkdir -p "$build"
build="$(cd "$build" && pwd)"
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
configure=(cmake -S . -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DONNXNORM_CUDA=ON
           -DONNXNORM_CUDA_ARCHITECTURES="$ONNXNORM_CUDA_ARCHITECTURES")
if [[ "$dry" == 1 ]]; then
  run "${configure[@]}"
else
  "${configure[@]}" >"$build/configure.log" 2>&1 || { cat "$build/configure.log"; exit 1; }
  grep -E "onnxnorm:" "$build/configure.log" || true
fi
run cmake --build "$build" -j "$(nproc)"
lib="$build/onnxnorm/lib"
run ls -l "$lib"

# the package from the source tree, the libraries from the build folder (the CUDA library is the
# one next to the CPU library)
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
export ONNXNORM_LIBRARY="$lib/libonnxnorm_ops.so"

step "tests (tests/test_cuda.py)"
status=0
"$python" -c 'import onnxruntime as o; print("onnxruntime", o.__version__, o.get_available_providers())' || true
# (the host-emulation tests are for machines without a GPU: the GPU tests cover them here)
tests=(-m pytest -q -rs -p no:cacheprovider tests/test_cuda.py -k "not host_emulation")
if [[ "$dry" == 1 ]]; then
  "$python" "${tests[@]}" --collect-only >"$build/collect.log" || { cat "$build/collect.log"; exit 1; }
  printf 'dry run: %s %s (%s)\n' "$python" "${tests[*]}" "$(tail -1 "$build/collect.log")"
else
  "$python" "${tests[@]}" || status=$?
fi

step "bandwidth"
bench=(-m onnxnorm.bench.cuda --reps "${GPU_CHECK_REPS:-30}" --json "$build/cuda_bench.json")
if [[ "$dry" == 1 ]]; then
  "$python" "${bench[@]}" --help >/dev/null
  printf 'dry run: %s %s\n' "$python" "${bench[*]}"
else
  "$python" "${bench[@]}" | tee "$build/cuda_bench.md" || status=$?
fi

step "done: status $status"
exit "$status"
