"""What the tests share, imported as ``from tests.support.<module> import ...`` (tests/conftest.py
puts the checkout on sys.path). No test file imports another test file: a piece two of them need
lives here, under a public name.

- :mod:`tests.support.helpers`: running a model in ONNX Runtime (bfloat16 and float8 as their
  bits), comparisons with the reference, a child process's peak memory, ONNX's backend cases.
- :mod:`tests.support.cuda_harness`: the CUDA kernels' correctness matrix through their C
  launcher, and the kernels' host emulation; also a script (``python
  tests/support/cuda_harness.py --help``).
- :mod:`tests.support.serve_harness`: the serve venv (.venv-serve) as the Triton tests reach it.
- ``tests/support/triton_client.py``: Triton's clients, a script the serve venv runs (not
  imported: the main venv has no tritonclient).
"""
