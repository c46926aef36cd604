"""The decode gated kernel (pallas_kernels/decode_gated.py) against stock Flax's MLP input
(the norm, two dots, act(gate) * up) per measured shape, written by `python -m
bench.decode_groups --write-table`.

Automatic dispatch (jaxnorm/backends/mosaic_gated.py) takes the kernel at M <= 64 only where
the nearest entry within a factor of 2 in each of (M, K, d_ff) measured at most
`mosaic_dense.DECODE_MAX_RATIO` of stock's time, for the gain folded (flashified weights,
the row statistic in the kernel) or unfolded (XLA scales x by the gain first) as the call
is. None: not timed. Regenerate rather than edit.
"""

# The runs: commands, UTC date of the last, GPU, its SM count, commits.
PROVENANCE: dict[str, str | int | None] = {
    'command': 'python -m bench.decode_groups --budget-s 80 (GROUPS_LIMIT=100 bash scripts/h200.sh decode-groups)',
    'date': '2026-12-01T20:26:32+00:00',
    'device': 'NVIDIA H200',
    'sms': 132,
    'commit': '5cda483',
}

# ((M, K, d_ff), activation, kernel / stock with the gain folded, unfolded).
ENTRIES: tuple[tuple[tuple[int, int, int], str, float | None, float | None], ...] = (
    ((1, 2048, 8192), 'silu', 0.888, None),
    ((8, 2048, 8192), 'silu', 0.873, None),
    ((64, 2048, 8192), 'silu', 0.743, None),
    ((1, 1024, 3072), 'silu', 0.423, None),
    ((8, 1024, 3072), 'silu', 0.847, None),
    ((64, 1024, 3072), 'silu', 0.664, None),
    ((1, 2560, 9728), 'silu', 0.851, None),
    ((8, 2560, 9728), 'silu', 0.897, None),
    ((64, 2560, 9728), 'silu', 0.742, None),
    ((1, 4096, 14336), 'silu', 0.895, None),
    ((8, 4096, 14336), 'silu', 0.890, None),
)
