"""`gpuwatch bench`: the benchmarks of BENCHMARKS.md, each beside a baseline of the same run."""
