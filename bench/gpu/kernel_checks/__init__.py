"""The cases bench/gpu/check_kernels.py runs, one module per kernel family."""
