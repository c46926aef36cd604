"""Measured GEMM configs per (M, K, N), written by `python -m bench.gemm_sweep --write-table`.

`gemm_config.default_config` takes the entry nearest a prefill shape (M > 64) in log2
space, within `gemm_config.TABLE_RADIUS_LOG2`, on a GPU with PROVENANCE's SM count; the
modelled pick elsewhere and while the table is empty. Regenerate rather than edit.
"""

# The sweep: command, UTC date, GPU, its SM count, commit.
PROVENANCE: dict[str, str | int | None] = {}

# ((M, K, N), TuningConfig fields): each shape's fastest config in the sweep.
ENTRIES: tuple[tuple[tuple[int, int, int], dict[str, int | str]], ...] = ()
