"""The decode attention-input kernel (pallas_kernels/decode_attention_input.py) against stock
Flax's attention input (the norm, three dots, per-head QK-norm, RoPE) per measured shape,
written by `python -m bench.decode_attention_bench --write-table`.

Automatic dispatch (jaxnorm/backends/mosaic_attention_input.py) takes the kernel at M <= 64
only where the nearest entry of the same head_dim, within a factor of 2 in each of M, K and
the q/k/v width, measured at most `mosaic_dense.DECODE_MAX_RATIO` of stock's time, for the
gain folded (flashified weights, the row statistic in the kernel) or unfolded (XLA scales x
by the gain first) as the call is, and runs it with that entry's fastest folded config
(whose ratio the entry holds; the unfolded ratio is of the config dispatch ran when it was
measured); ENTRIES_WITHOUT_QK_NORM serves the models without QK-norm (Llama). None: not
timed. Regenerate rather than edit.
"""

# The runs: commands, UTC date of the last, GPU, its SM count, commits.
PROVENANCE: dict[str, str | int | None] = {
    'command': 'python -m bench.decode_attention_bench --budget-s 170 --rows 1,8 (0a5ca5f); --budget-s 90 --presets gemma3-1b --rows 8 (d7f4da4); --budget-s 150 --presets llama3-8b --rows 1,8 (56bd506)',
    'date': '2026-12-02T05:56:13+00:00',
    'device': 'NVIDIA H200',
    'sms': 132,
    'commit': '0a5ca5f, d7f4da4, 56bd506',
}

# ((M, K, q heads, kv heads, head_dim), kernel / stock gain folded, unfolded; folded config).
ENTRIES: tuple[tuple[tuple[int, int, int, int, int], float | None, float | None, dict[str, int | str] | None], ...] = (
    ((1, 1024, 16, 8, 128), 0.399, 0.406,
     {'tile_n': 64, 'tile_k': 64, 'split_k': 1, 'stages': 7, 'warpgroups': 1}),
    ((8, 1024, 16, 8, 128), 0.836, 0.866,
     {'tile_n': 64, 'tile_k': 64, 'split_k': 1, 'stages': 7, 'warpgroups': 1}),
    ((1, 2560, 32, 8, 128), 0.469, 0.416,
     {'tile_n': 64, 'tile_k': 64, 'split_k': 1, 'stages': 7, 'warpgroups': 1}),
    ((8, 2560, 32, 8, 128), 0.946, 0.858,
     {'tile_n': 64, 'tile_k': 64, 'split_k': 1, 'stages': 7, 'warpgroups': 1}),
    ((1, 1152, 4, 1, 256), 0.656, 0.672,
     {'tile_n': 128, 'tile_k': 64, 'split_k': 1, 'stages': 3, 'warpgroups': 1}),
    ((8, 1152, 4, 1, 256), 1.413, 1.465,
     {'tile_n': 128, 'tile_k': 64, 'split_k': 1, 'stages': 3, 'warpgroups': 1}),
)

# The same without QK-norm (Llama: q and k only rotated).
ENTRIES_WITHOUT_QK_NORM: tuple[tuple[tuple[int, int, int, int, int], float | None, float | None, dict[str, int | str] | None], ...] = (
    ((1, 4096, 32, 8, 128), 0.512, 0.417,
     {'tile_n': 64, 'tile_k': 64, 'split_k': 1, 'stages': 7, 'warpgroups': 1}),
    ((8, 4096, 32, 8, 128), 1.258, 1.043,
     {'tile_n': 64, 'tile_k': 64, 'split_k': 1, 'stages': 7, 'warpgroups': 1}),
)
