"""Benchmarks: kernels (CPU, CUDA) and end-to-end; each prints a markdown table of medians and ratios."""
