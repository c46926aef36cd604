"""The decode gated kernel (pallas_kernels/decode_gated.py) against stock Flax's MLP input
(the norm, two dots, act(gate) * up) per measured shape, written by `python -m
bench.decode_groups --write-table`.

Automatic dispatch (jaxnorm/backends/mosaic_gated.py) takes the kernel at M <= 64 only where
the nearest entry within a factor of 2 in each of (M, K, d_ff) measured at most
`mosaic_dense.DECODE_MAX_RATIO` of stock's time, for the gain folded (flashified weights,
the row statistic in the kernel) or unfolded (XLA scales x by the gain first) as the call
is, and runs it with that entry's fastest config with the gain folded (whose ratio the entry
holds; the unfolded ratio is of the config dispatch ran when it was measured). None: not
timed. Regenerate rather than edit.
"""

# The runs: commands, UTC date of the last, GPU, its SM count, commits.
PROVENANCE: dict[str, str | int | None] = {
    'command': 'python -m bench.decode_groups --budget-s 130 (15a2e98); python -m bench.decode_groups --budget-s 80 --shapes 1152x6912 (f5ba9ca)',
    'date': '2026-12-03T14:24:40+00:00',
    'device': 'NVIDIA H200',
    'sms': 132,
    'commit': '15a2e98, f5ba9ca',
}

# ((M, K, d_ff), activation, kernel / stock gain folded, unfolded; folded config).
ENTRIES: tuple[tuple[tuple[int, int, int], str, float | None, float | None, dict[str, int | str] | None], ...] = (
    ((1, 2048, 8192), 'silu', 0.871, 0.971,
     {'tile_n': 64, 'tile_k': 64, 'split_k': 1, 'stages': 8, 'warpgroups': 1}),
    ((8, 2048, 8192), 'silu', 0.870, 0.967,
     {'tile_n': 64, 'tile_k': 64, 'split_k': 1, 'stages': 8, 'warpgroups': 1}),
    ((64, 2048, 8192), 'silu', 0.737, 0.834,
     {'tile_n': 64, 'tile_k': 64, 'split_k': 1, 'stages': 8, 'warpgroups': 1}),
    ((1, 1024, 3072), 'silu', 0.422, 0.462,
     {'tile_n': 64, 'tile_k': 64, 'split_k': 1, 'stages': 8, 'warpgroups': 1}),
    ((8, 1024, 3072), 'silu', 0.858, 0.953,
     {'tile_n': 64, 'tile_k': 64, 'split_k': 1, 'stages': 8, 'warpgroups': 1}),
    ((64, 1024, 3072), 'silu', 0.666, 0.770,
     {'tile_n': 64, 'tile_k': 64, 'split_k': 1, 'stages': 8, 'warpgroups': 1}),
    ((1, 2560, 9728), 'silu', 0.874, 0.967,
     {'tile_n': 128, 'tile_k': 64, 'split_k': 1, 'stages': 5, 'warpgroups': 1}),
    ((8, 2560, 9728), 'silu', 0.894, 0.993,
     {'tile_n': 128, 'tile_k': 64, 'split_k': 1, 'stages': 5, 'warpgroups': 1}),
    ((64, 2560, 9728), 'silu', 0.747, 0.832,
     {'tile_n': 128, 'tile_k': 64, 'split_k': 1, 'stages': 5, 'warpgroups': 1}),
    ((1, 4096, 14336), 'silu', 0.892, 0.934,
     {'tile_n': 128, 'tile_k': 64, 'split_k': 1, 'stages': 5, 'warpgroups': 1}),
    ((8, 4096, 14336), 'silu', 0.905, 0.941,
     {'tile_n': 128, 'tile_k': 64, 'split_k': 1, 'stages': 5, 'warpgroups': 1}),
    ((64, 4096, 14336), 'silu', 0.753, 0.792,
     {'tile_n': 128, 'tile_k': 64, 'split_k': 1, 'stages': 5, 'warpgroups': 1}),
    ((1, 1152, 6912), 'gelu_tanh', 0.501, 0.592,
     {'tile_n': 64, 'tile_k': 64, 'split_k': 1, 'stages': 8, 'warpgroups': 1}),
    ((8, 1152, 6912), 'gelu_tanh', 0.910, 1.091,
     {'tile_n': 64, 'tile_k': 64, 'split_k': 1, 'stages': 8, 'warpgroups': 1}),
    ((64, 1152, 6912), 'gelu_tanh', 0.767, 0.902,
     {'tile_n': 64, 'tile_k': 64, 'split_k': 1, 'stages': 8, 'warpgroups': 1}),
)
