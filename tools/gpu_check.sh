#!/usr/bin/env bash
# GPU check of the onnxnorm CUDA kernels, for a fresh GPU machine with python3 + torch (CUDA),
# nvcc and CMake but no internet and nothing of this project installed. Its steps, in the order of
# what their results are worth; each prints its table as it ends, and one that fails does not stop
# the next (only those that need the build are skipped when the build fails):
#   machine      GPU, driver, nvcc, torch;
#   build        the CPU and CUDA libraries into the build folder (cmake, ONNXNORM_CUDA=ON; for
#                the GPU present only, unless ONNXNORM_CUDA_ARCHITECTURES says otherwise);
#   correctness  tests/cuda/test_cuda.py and tests/cuda/test_cuda_rotary.py but their ONNX Runtime
#                tests: the correctness matrix of tests/support/cuda_harness.py (every op x dtype x
#                rounding order x optional input against the numpy reference through the C
#                launcher; the quantized ops' values, scale and zero point exactly the reference's;
#                GatedRMSNorm's gates and groups, L2Norm's per-head rows), the rotary ops' matrix
#                of tests/support/cuda_rotary.py, bad arguments, streams;
#   bandwidth    python -m onnxnorm.bench.cuda: the bandwidth tables of bfloat16 and float16 (the
#                float ops against a copy, torch and, with onnxruntime-gpu, ONNX Runtime's CUDA
#                ops; then the norms of hybrid models), also written as Markdown and JSON; then
#                the rotary ops' rows (tests/support/cuda_rotary.py --bench: RMSNormRotary of Q
#                and K of 32 and 8 heads of 128, for 1, 8 and 512 tokens);
#   ort          the ONNX Runtime tests of tests/cuda/test_cuda.py, tests/cuda/test_cuda_rotary.py
#                and tests/cuda/test_cuda_ort.py on the
#                CUDA execution provider, with onnxruntime-gpu installed from the parts that
#                tools/gpu_carry.py cut (build/carry/, carried over several calls) when they are
#                all there, else with whatever onnxruntime the machine has (skipped without its
#                CUDA provider);
#   runtimes     tools/gpu_runtimes.py: a small float32 and float16 Llama-style decoder written
#                --for ort-cuda, tensorrt and webgpu, run on ONNX Runtime's CUDA provider with
#                the onnxnorm library (and on the CUDA devices of its plugin API), on TensorRT
#                (ONNX Runtime's TensorRT provider, the TensorRT RTX plugin, the tensorrt
#                package's parser: whichever is here) and on the WebGPU plugin without CPU
#                fallback, against the CPU provider: parity and where the nodes ran, one row
#                each, a runtime not here a skipped row (the same onnxruntime-gpu);
#   gqa          the float16 Qwen3 folder of onnxruntime-genai's model builder written --for
#                ort-cuda (its Q/K norms in GroupQueryAttention's q_norm_weight / k_norm_weight)
#                against the same folder with the library's norms, both on the CUDA provider:
#                parity in a prompt and a decode step, and how many values agree bit for bit
#                (tests/fusion/test_rotary_gqa.py; the same onnxruntime-gpu);
#   e2e          onnxnorm bench e2e on the CUDA provider: float16 Llama- and Gemma-2-style
#                decoders, and the onnxruntime-genai model builder's float16 folders before and
#                after onnxnorm genai, with and without CUDA graphs (the same onnxruntime-gpu and
#                onnxruntime-genai-cuda; GPU_CHECK_E2E_ARGS replaces its default arguments).
# Usage: tools/gpu_check.sh [--steps LIST] [BUILD_DIR]   (default: every step, build/gpu-check)
# A later call on the same (still warm) machine can run later steps alone, e.g. --steps ort,e2e:
# they use the build folder an earlier call left.
# Environment: PYTHON (default python3), ONNXNORM_CUDA_ARCHITECTURES, ONNXRUNTIME_INCLUDE_DIR
# (else third_party/onnxruntime/include, which tools/get_ort_headers.sh fills where there is
# internet: carry it along to machines without), GPU_CHECK_REPS (default 30), OUT (a folder that
# also gets each step's tables and logs, and summary.md).
# GPU_CHECK_DRY_RUN=1 runs every step up to the first one that needs a GPU and checks the rest
# without running it: the commands are printed, the test modules are collected and the benchmarks'
# command lines parsed (tests/cuda/test_cuda.py does this on every test run, so the script cannot
# rot between the rare sessions that have a GPU).
# Exit status: non-zero when a step failed (a skipped step is no failure).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
root="$PWD"
start=$SECONDS
all_steps="machine,build,correctness,bandwidth,ort,runtimes,gqa,e2e"
steps="$all_steps"
build=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --steps) steps="$2"; shift 2 ;;
    --steps=*) steps="${1#*=}"; shift ;;
    -*) echo "gpu_check: unknown option $1 (usage: tools/gpu_check.sh [--steps LIST] [BUILD_DIR])" >&2; exit 2 ;;
    *) build="$1"; shift ;;
  esac
done
for s in ${steps//,/ }; do
  if [[ ",$all_steps," != *",$s,"* ]]; then
    echo "gpu_check: unknown step $s (steps: $all_steps)" >&2
    exit 2
  fi
done
build="${build:-build/gpu-check}"
python="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1
dry="${GPU_CHECK_DRY_RUN:-0}"
out="${OUT:-}"
mkdir -p "$build" ${out:+"$out"}
build="$(cd "$build" && pwd)"
lib="$build/onnxnorm/lib"
summary=()
failed=0

want() { [[ ",$steps," == *",$1,"* ]]; }
step() { printf '\n=== %s (%ds)\n' "$*" $((SECONDS - start)); }
# runs a command, or in a dry run prints it
run() { if [[ "$dry" == 1 ]]; then printf 'dry run: %s\n' "$*"; else "$@"; fi; }
# the outcome of a step: ok, FAILED (status) or skipped (why)
record() {
  local outcome="$2"
  [[ "$dry" == 1 && "$outcome" == ok ]] && outcome="ok (dry run)"
  summary+=("| $1 | $outcome | $((SECONDS - step_start)) s |")
  [[ "$outcome" == FAILED* ]] && failed=1
  return 0
}
# copies files into OUT, where set
keep() { if [[ -n "$out" ]]; then for f in "$@"; do [[ -f "$f" ]] && cp "$f" "$out/"; done; fi; return 0; }
have_build() { [[ "$dry" == 1 || -f "$lib/libonnxnorm_ops.so" ]]; }

# the package from the source tree, the libraries from the build folder (the CUDA library is the
# one next to the CPU library)
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
export ONNXNORM_LIBRARY="$lib/libonnxnorm_ops.so"

if want machine; then
  step "machine"; step_start=$SECONDS
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || true
  { nvcc --version 2>/dev/null || echo "nvcc: not found"; } | tail -1
  "$python" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "device", torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)' \
    && record machine ok || record machine "FAILED (no torch)"
fi

if want build; then
  step "build"; step_start=$SECONDS
  if [[ -z "${ONNXNORM_CUDA_ARCHITECTURES:-}" ]]; then
    cc="$("$python" -c 'import torch; m, n = torch.cuda.get_device_capability(0); print(f"{m}{n}")' 2>/dev/null || true)"
    export ONNXNORM_CUDA_ARCHITECTURES="${cc:+${cc}-real}"
    export ONNXNORM_CUDA_ARCHITECTURES="${ONNXNORM_CUDA_ARCHITECTURES:-80-real;90-real;90-virtual}"
  fi
  echo "CUDA architectures: $ONNXNORM_CUDA_ARCHITECTURES"
  generator=()
  command -v ninja >/dev/null && generator=(-G Ninja)
  configure=(cmake -S . -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DONNXNORM_CUDA=ON
             -DONNXNORM_CUDA_ARCHITECTURES="$ONNXNORM_CUDA_ARCHITECTURES")
  if [[ "$dry" == 1 ]]; then
    run "${configure[@]}"
    run cmake --build "$build" -j "$(nproc)"
    record build ok
  elif [[ -z "${ONNXRUNTIME_INCLUDE_DIR:-}" && ! -f /usr/include/onnxruntime/onnxruntime_c_api.h && \
          ! -f third_party/onnxruntime/include/onnxruntime_c_api.h ]]; then
    echo "gpu_check: no ONNX Runtime headers: run tools/get_ort_headers.sh where there is internet and" \
         "bring third_party/onnxruntime/include along, or set ONNXRUNTIME_INCLUDE_DIR" >&2
    record build "FAILED (no ONNX Runtime headers)"
  elif ! "${configure[@]}" >"$build/configure.log" 2>&1; then
    cat "$build/configure.log"
    record build "FAILED (configure)"
  else
    grep -E "onnxnorm:" "$build/configure.log" || true
    if cmake --build "$build" -j "$(nproc)" >"$build/build.log" 2>&1; then
      tail -3 "$build/build.log"
      ls -l "$lib"
      record build ok
    else
      tail -40 "$build/build.log"
      keep "$build/build.log"
      record build "FAILED (build)"
    fi
  fi
fi

# pytest with xdist's workers where it is installed
pytest_args=(-m pytest -q -rs -p no:cacheprovider)
# (not in a dry run, which only collects)
[[ "$dry" != 1 ]] && "$python" -c "import xdist" 2>/dev/null && pytest_args+=(-n 4)
# runs a test selection: collected only in a dry run; its log kept
tests() {
  local name="$1"; shift
  if [[ "$dry" == 1 ]]; then
    "$python" "${pytest_args[@]}" "$@" --collect-only >"$build/$name.log" 2>&1 || { cat "$build/$name.log"; return 1; }
    printf 'dry run: %s %s (%s)\n' "$python" "${pytest_args[*]} $*" "$(tail -1 "$build/$name.log")"
  else
    "$python" "${pytest_args[@]}" "$@" 2>&1 | tee "$build/$name.log"
    local status=${PIPESTATUS[0]}
    keep "$build/$name.log"
    return "$status"
  fi
}

# onnxruntime-gpu from the carried parts (once), the CUDA libraries of torch's environment on the
# loader's path for its CUDA provider; echoes why not where it has no CUDA provider
ort_ready=""
ort_gpu() {
  [[ -n "$ort_ready" ]] && { [[ "$ort_ready" == yes ]]; return; }
  ort_ready=no
  local site="$build/ort-gpu"
  if [[ -f build/carry/manifest.json ]]; then
    run "$python" tools/gpu_carry.py install --target "$site"
    local status=$?
    if [[ $status == 3 ]]; then
      echo "onnxruntime-gpu: parts still missing (tools/gpu_carry.py prepare; carry the rest)"
    elif [[ $status != 0 ]]; then
      echo "onnxruntime-gpu: tools/gpu_carry.py install failed ($status)"
    fi
  fi
  [[ -d "$site/onnxruntime" ]] && export PYTHONPATH="$site:$PYTHONPATH"
  local libs
  libs="$("$python" -c 'import glob, os, site; print(":".join(sorted({d for p in site.getsitepackages() for d in glob.glob(os.path.join(p, "nvidia", "**", "lib"), recursive=True)})))' 2>/dev/null || true)"
  [[ -n "$libs" ]] && export LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  # a session that asks for the CUDA provider alone must get it (ORT falls back to the CPU
  # quietly where the provider's libraries do not load)
  "$python" - <<'EOF' && ort_ready=yes
import sys

import onnxruntime as ort
from onnx import TensorProto, helper

print("onnxruntime", ort.__version__, ort.__file__, ort.get_available_providers())
if "CUDAExecutionProvider" not in ort.get_available_providers():
    sys.exit("no CUDA provider in this onnxruntime")
x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "probe", [x], [
    helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
try:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CUDAExecutionProvider"])
except Exception as e:  # noqa: BLE001 - reported
    sys.exit(f"the CUDA provider does not start: {e}")
if sess.get_providers()[0] != "CUDAExecutionProvider":
    sys.exit(f"the CUDA provider did not load (session providers {sess.get_providers()})")
print("the CUDA provider starts")
try:
    import onnxruntime_genai as og

    print("onnxruntime-genai", og.__version__)
except ImportError:
    print("no onnxruntime-genai: the e2e step's genai rows will say so")
EOF
  [[ "$ort_ready" == yes ]]
}

if want correctness; then
  step "correctness (tests/cuda/test_cuda.py)"; step_start=$SECONDS
  if ! have_build; then
    record correctness "skipped (no build in $build)"
  else
    # (the host-emulation tests are for machines without a GPU: the GPU tests cover them here;
    # the ONNX Runtime tests are the ort step's)
    tests correctness tests/cuda/test_cuda.py tests/cuda/test_cuda_rotary.py -k "not host_emulation and not test_ort_" \
      && record correctness ok || record correctness "FAILED ($?)"
  fi
fi

if want bandwidth; then
  step "bandwidth"; step_start=$SECONDS
  bench=(-m onnxnorm.bench.cuda --reps "${GPU_CHECK_REPS:-30}" --json "$build/cuda_bench.json")
  rotary_bench=(tests/support/cuda_rotary.py --bench --reps "${GPU_CHECK_REPS:-30}" --json "$build/cuda_rotary_bench.json")
  if ! have_build; then
    record bandwidth "skipped (no build in $build)"
  elif [[ "$dry" == 1 ]]; then
    "$python" "${bench[@]}" --help >/dev/null && printf 'dry run: %s %s\n' "$python" "${bench[*]}" \
      && "$python" "${rotary_bench[@]}" --help >/dev/null \
      && printf 'dry run: %s %s\n' "$python" "${rotary_bench[*]}" \
      && record bandwidth ok || record bandwidth "FAILED (options)"
  else
    # (ONNX Runtime's CUDA ops are a contender where onnxruntime-gpu is ready)
    ort_gpu || echo "the ONNX Runtime columns: n/a"
    "$python" "${bench[@]}" | tee "$build/cuda_bench.md"
    status=${PIPESTATUS[0]}
    # the rotary ops' rows (no contenders: a device copy of Q and K as the yardstick)
    "$python" "${rotary_bench[@]}" | tee "$build/cuda_rotary_bench.md"
    rotary_status=${PIPESTATUS[0]}
    [[ $status == 0 ]] && status=$rotary_status
    keep "$build/cuda_bench.md" "$build/cuda_bench.json" "$build/cuda_rotary_bench.md" "$build/cuda_rotary_bench.json"
    [[ $status == 0 ]] && record bandwidth ok || record bandwidth "FAILED ($status)"
  fi
fi

if want ort; then
  step "ort (ONNX Runtime's CUDA execution provider)"; step_start=$SECONDS
  if ! have_build; then
    record ort "skipped (no build in $build)"
  elif [[ "$dry" == 1 ]]; then
    ort_gpu || true
    tests ort -rP tests/cuda/test_cuda.py tests/cuda/test_cuda_rotary.py tests/cuda/test_cuda_ort.py \
      -k "test_ort_ or test_cuda_ort" && record ort ok || record ort "FAILED (collection)"
  elif ! ort_gpu; then
    record ort "skipped (no onnxruntime with a working CUDA provider)"
  else
    tests ort -rP tests/cuda/test_cuda.py tests/cuda/test_cuda_rotary.py tests/cuda/test_cuda_ort.py \
      -k "test_ort_ or test_cuda_ort" && record ort ok || record ort "FAILED ($?)"
  fi
fi

if want runtimes; then
  step "runtimes (the --for forms on CUDA, TensorRT and WebGPU)"; step_start=$SECONDS
  runtimes=(tools/gpu_runtimes.py --work "$build/runtimes" --markdown "$build/runtimes.md"
            --json "$build/runtimes.json")
  if ! have_build; then
    record runtimes "skipped (no build in $build)"
  elif [[ "$dry" == 1 ]]; then
    # (the models exported and lowered on the CPU, nothing run)
    if "$python" "${runtimes[@]}" --dry-run >"$build/runtimes.log" 2>&1; then
      printf 'dry run: %s %s (%s forms lowered)\n' "$python" "${runtimes[*]}" \
        "$(grep -c '^lowered: ' "$build/runtimes.log")"
      record runtimes ok
    else
      cat "$build/runtimes.log"
      record runtimes "FAILED (dry run)"
    fi
  else
    # (its rows say which runtime is missing; TensorRT's libraries from pip on the loader's path)
    ort_gpu || echo "no onnxruntime with a working CUDA provider: the CUDA rows say so"
    trt_libs="$("$python" -c 'import glob, os, site; print(":".join(sorted(d for p in site.getsitepackages() for d in glob.glob(os.path.join(p, "tensorrt*_libs")))))' 2>/dev/null || true)"
    LD_LIBRARY_PATH="${trt_libs:+$trt_libs:}${LD_LIBRARY_PATH:-}" "$python" "${runtimes[@]}" 2>&1 \
      | tee "$build/runtimes.log"
    status=${PIPESTATUS[0]}
    keep "$build/runtimes.md" "$build/runtimes.json" "$build/runtimes.log"
    case $status in
      0) record runtimes ok ;;
      3) record runtimes "skipped (no GPU runtime here: $build/runtimes.md)" ;;
      *) record runtimes "FAILED ($status)" ;;
    esac
  fi
fi

if want gqa; then
  step "gqa (the Q/K norms in GroupQueryAttention, --for ort-cuda)"; step_start=$SECONDS
  gqa_test=tests/fusion/test_rotary_gqa.py::test_gpu_gqa_norms_match_the_library
  if ! have_build; then
    record gqa "skipped (no build in $build)"
  elif [[ "$dry" == 1 ]]; then
    tests gqa -rP "$gqa_test" && record gqa ok || record gqa "FAILED (collection)"
  elif ! ort_gpu; then
    record gqa "skipped (no onnxruntime with a working CUDA provider)"
  else
    tests gqa -rP "$gqa_test" && record gqa ok || record gqa "FAILED ($?)"
  fi
fi

if want e2e; then
  step "e2e (generation on the CUDA provider)"; step_start=$SECONDS
  # shellcheck disable=SC2206 # the arguments are words
  e2e_args=(${GPU_CHECK_E2E_ARGS:---models llama,gemma2 --dtypes float16 --devices cuda,cuda-graph --genai fp16 --repeats 3})
  e2e=(-m onnxnorm bench e2e "${e2e_args[@]}" --json "$build/e2e.json")
  if ! have_build; then
    record e2e "skipped (no build in $build)"
  elif [[ "$dry" == 1 ]]; then
    # (the options parsed by the command's own parser)
    "$python" -c 'import sys; from onnxnorm import cli; cli.parser("bench").parse_args(sys.argv[1:])' \
      bench e2e "${e2e_args[@]}" && printf 'dry run: %s %s\n' "$python" "${e2e[*]}" \
      && record e2e ok || record e2e "FAILED (options)"
  elif ! ort_gpu; then
    record e2e "skipped (no onnxruntime with a working CUDA provider)"
  else
    "$python" "${e2e[@]}" 2>&1 | tee "$build/e2e.md"
    status=${PIPESTATUS[0]}
    keep "$build/e2e.md" "$build/e2e.json"
    [[ $status == 0 ]] && record e2e ok || record e2e "FAILED ($status)"
  fi
fi

step "summary"
{
  echo "| step | outcome | time |"
  echo "|---|---|---|"
  printf '%s\n' "${summary[@]}"
} | tee "$build/summary.md"
keep "$build/summary.md"
exit "$failed"
