"""Reference transformer blocks used by the tests, the demo and the benchmarks."""
