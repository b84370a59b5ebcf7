#!/usr/bin/env bash
# The native library and its C++ kernel tests built with AddressSanitizer and
# UndefinedBehaviorSanitizer (CMake option ONNXNORM_SANITIZE; CPU kernels only) in build/sanitize,
# then run: ctest (custom_ops/tests/kernel_tests.cc: every op, type pair, optional input, width,
# alignment and instruction set), and a short campaign of the property tests
# (tests/ops/test_properties.py, hypothesis profile "sanitize") through ONNX Runtime against the
# sanitized libonnxnorm_ops.so, which also covers the ORT glue (shapes, weights, threads). The
# first report ends the run with a non-zero exit (docs/reliability.md).
#
#   tools/sanitize.sh [pytest arguments]      (make sanitize)
#
# Environment: PYTHON (default .venv/bin/python), ONNXNORM_SANITIZE_BUILD (default build/sanitize),
# ONNXNORM_HYPOTHESIS_EXAMPLES (examples per op of the campaign; default: the profile's, 150),
# ONNXNORM_SANITIZE_FLAGS (optimization and debug flags; default "-O1 -g1": line numbers in
# reports; the test suite builds with "-O0 -g0 -DONNXNORM_NO_FORCE_INLINE", which compiles in a
# fraction of the time and checks every memory access where it is written), ASAN_OPTIONS for
# ctest (default: stack-use-after-return detection on; the test suite turns it off).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build=${ONNXNORM_SANITIZE_BUILD:-$root/build/sanitize}
python=${PYTHON:-$root/.venv/bin/python}
# cmake, ninja and ctest as pip installs them next to the interpreter, else from PATH
PATH="$(dirname "$python"):$PATH"
export PATH
jobs=$(nproc 2>/dev/null || echo 2)

generator=()
if [ ! -f "$build/CMakeCache.txt" ] && command -v ninja >/dev/null; then
  generator=(-G Ninja)
fi
cmake -S "$root" -B "$build" "${generator[@]}" -DONNXNORM_SANITIZE=ON -DONNXNORM_CUDA=OFF \
  -DONNXNORM_BUILD_TESTS=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="${ONNXNORM_SANITIZE_FLAGS:--O1 -g1}" >/dev/null
cmake --build "$build" --parallel "$jobs" --target onnxnorm_ops onnxnorm_kernel_tests onnxnorm_kernel_bench \
  onnxnorm_rotary_bench

export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
echo "== C++ kernel tests (ctest), sanitized"
ASAN_OPTIONS=${ASAN_OPTIONS:-detect_stack_use_after_return=1} ctest --test-dir "$build" --output-on-failure --parallel "$jobs"

# Python itself is not built with the sanitizers: their runtime has to be loaded before anything
# else, and Python's own allocations are not leak-checked.
cxx=$(sed -n 's/^CMAKE_CXX_COMPILER:[A-Z]*=//p' "$build/CMakeCache.txt")
runtime=$("$cxx" -print-file-name=libasan.so)
if [ ! -f "$runtime" ]; then
  runtime=$("$cxx" -print-file-name=libclang_rt.asan-x86_64.so)
fi
if [ ! -f "$runtime" ]; then
  echo "sanitize: cannot find the AddressSanitizer runtime of $cxx" >&2
  exit 1
fi
# (libstdc++ too: the ASan runtime resolves its C++ exception interceptor when it loads, and
# ONNX Runtime's Python module throws)
runtime="$runtime $("$cxx" -print-file-name=libstdc++.so)"
library="$build/onnxnorm/lib/libonnxnorm_ops.so"
echo "== property tests through ONNX Runtime against $library, sanitized"
LD_PRELOAD="$runtime" ASAN_OPTIONS=detect_leaks=0 ONNXNORM_LIBRARY="$library" \
  ONNXNORM_HYPOTHESIS_PROFILE=sanitize \
  "$python" -m pytest -q -p no:cacheprovider "$root/tests/ops/test_properties.py" "$@"
echo "sanitize: no reports"
