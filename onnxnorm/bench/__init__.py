"""Benchmarks: kernels (CPU, CUDA) and end-to-end; each prints a markdown table of medians and
ratios.

Each benchmark is a subcommand of ``onnxnorm bench`` (:mod:`.cli`) and a subpackage of that
name: its ``__init__.py`` says what it measures and gathers its public names (imported on first
use, :mod:`onnxnorm._lazy`), its ``cli.py`` declares its options and registers it (importing
nothing heavy), its other modules are its parts, one concern each.

- ``kernels``: the CPU kernels against ORT's built-in ops, the decomposed graph, torch and a
  memory copy;
- ``e2e``: greedy generation with a KV cache for every way of getting a decoder's norms into
  ONNX Runtime;
- ``cuda``: the CUDA kernels' bandwidth against a device-to-device copy, on a GPU machine;
- :mod:`.common`: what they share (options, JSON, tables, the machine's description);
- :mod:`.timing`: how they time (the clock, interleaving, medians, paired ratios).

The native library's binding the benchmarks use is :mod:`onnxnorm._native`.
"""
