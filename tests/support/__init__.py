"""What the tests share, imported as ``from tests.support.<module> import ...`` (tests/conftest.py
puts the checkout on sys.path). No test file imports another test file (tests/test_layout.py
checks it): a piece two of them need lives here, under a public name.

- :mod:`tests.support.matrix`: the axes of the test matrix, derived once: X's numpy types and
  the (X, weight) type pairs from the op catalogue, the targets from ``onnxnorm.targets``, and
  the subsets of them the tests take.
- :mod:`tests.support.helpers`: running a model in ONNX Runtime (bfloat16 and float8 as their
  bits), comparisons with the reference, a child process's peak memory, ONNX's backend cases.
  One-node models of the ops come from ``onnxnorm.testing.graphs``.
- :mod:`tests.support.kernel_cases`: the CPU kernels' case matrices, which the instruction-set
  tests also run in child processes.
- :mod:`tests.support.cuda_harness`: the CUDA kernels' correctness matrix through their C
  launcher, and the kernels' host emulation; also a script (``python
  tests/support/cuda_harness.py --help``).
- :mod:`tests.support.gpu`: whether there is a GPU, the CUDA library and ORT's CUDA provider
  (skip markers), and a one-node model run on that provider.
- :mod:`tests.support.build`: the build tools and the editable install's build folder.
- :mod:`tests.support.processes`: Python and the ``onnxnorm`` command in a child process with
  modules hidden, and the one-line error a missing one must give.
- :mod:`tests.support.versions`: the declared minimum versions and the check run in an
  environment of exactly those.
- :mod:`tests.support.bench`: inputs of the kernel benchmark's models of the quantized ops.
- :mod:`tests.support.serve_harness`: the serve venv (.venv-serve) as the Triton tests reach it.
- ``tests/support/triton_client.py``: Triton's clients, a script the serve venv runs (not
  imported: the main venv has no tritonclient).
"""
