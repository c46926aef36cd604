"""Measured decode GEMM configs per launch (M, K, (N_i...)), written by `python -m
bench.decode_gemm --write-table`.

`decode_config.decode_config` takes the entry nearest a launch's (M, K, total N) in log2
space within `decode_config.TABLE_RADIUS_LOG2`, among entries of at most as many weights
(the same count first), on a GPU with PROVENANCE's SM count; the modelled pick elsewhere.
Each entry keeps its ratio to one cuBLAS dot per weight (as stock Flax runs them), which
automatic dispatch reads (jaxnorm/backends/mosaic_dense.py). Regenerate rather than edit.
"""

# The runs: commands, UTC date of the last, GPU, its SM count, commits.
PROVENANCE: dict[str, str | int | None] = {
    'command': 'python -m bench.decode_gemm --rows 1,64 --budget-s 210 (2c4f233); python -m bench.decode_gemm --launches presets --rows 1,8 --configs 2 --budget-s 120 (f704e06); python -m bench.decode_gemm --launches gemma --rows 1,8 --configs 2 --budget-s 90 (f5ba9ca)',
    'date': '2026-12-03T14:23:58+00:00',
    'device': 'NVIDIA H200',
    'sms': 132,
    'commit': '2c4f233, f704e06, f5ba9ca',
}

# ((M, K, (N_i...)), DecodeConfig fields, ours / cuBLAS): each launch's fastest.
ENTRIES: tuple[tuple[tuple[int, int, tuple[int, ...]], dict[str, int], float], ...] = (
    ((1, 4096, (6144,)),
     {'tile_n': 64, 'tile_k': 64, 'split_k': 1, 'stages': 12, 'warpgroups': 1}, 0.912),
    ((64, 4096, (6144,)),
     {'tile_n': 64, 'tile_k': 64, 'split_k': 1, 'stages': 12, 'warpgroups': 1}, 0.740),
    ((1, 4096, (28672,)),
     {'tile_n': 256, 'tile_k': 64, 'split_k': 1, 'stages': 5, 'warpgroups': 1}, 1.014),
    ((64, 4096, (28672,)),
     {'tile_n': 256, 'tile_k': 64, 'split_k': 1, 'stages': 5, 'warpgroups': 1}, 1.015),
    ((1, 14336, (4096,)),
     {'tile_n': 128, 'tile_k': 64, 'split_k': 4, 'stages': 8, 'warpgroups': 1}, 1.022),
    ((64, 14336, (4096,)),
     {'tile_n': 64, 'tile_k': 64, 'split_k': 2, 'stages': 12, 'warpgroups': 1}, 0.878),
    ((1, 2048, (3072,)),
     {'tile_n': 64, 'tile_k': 64, 'split_k': 5, 'stages': 12, 'warpgroups': 1}, 0.372),
    ((64, 2048, (3072,)),
     {'tile_n': 64, 'tile_k': 64, 'split_k': 2, 'stages': 12, 'warpgroups': 1}, 0.890),
    ((1, 2048, (16384,)),
     {'tile_n': 128, 'tile_k': 64, 'split_k': 1, 'stages': 8, 'warpgroups': 1}, 1.000),
    ((64, 2048, (16384,)),
     {'tile_n': 128, 'tile_k': 64, 'split_k': 1, 'stages': 8, 'warpgroups': 1}, 1.008),
    ((1, 8192, (2048,)),
     {'tile_n': 128, 'tile_k': 64, 'split_k': 8, 'stages': 8, 'warpgroups': 1}, 1.046),
    ((64, 8192, (2048,)),
     {'tile_n': 64, 'tile_k': 64, 'split_k': 4, 'stages': 12, 'warpgroups': 1}, 0.796),
    ((1, 1024, (4096,)),
     {'tile_n': 64, 'tile_k': 64, 'split_k': 1, 'stages': 12, 'warpgroups': 1}, 1.144),
    ((64, 1024, (4096,)),
     {'tile_n': 64, 'tile_k': 64, 'split_k': 1, 'stages': 12, 'warpgroups': 1}, 0.639),
    ((1, 2048, (128256,)),
     {'tile_n': 128, 'tile_k': 64, 'split_k': 1, 'stages': 8, 'warpgroups': 1}, 1.021),
    ((64, 2048, (128256,)),
     {'tile_n': 256, 'tile_k': 64, 'split_k': 1, 'stages': 5, 'warpgroups': 1}, 1.003),
    ((1, 2048, (2048, 512, 512)),
     {'tile_n': 128, 'tile_k': 64, 'split_k': 1, 'stages': 8, 'warpgroups': 1}, 0.319),
    ((8, 2048, (2048, 512, 512)),
     {'tile_n': 128, 'tile_k': 64, 'split_k': 1, 'stages': 8, 'warpgroups': 1}, 0.931),
    ((1, 2048, (2048,)),
     {'tile_n': 64, 'tile_k': 64, 'split_k': 5, 'stages': 12, 'warpgroups': 1}, 0.470),
    ((8, 2048, (2048,)),
     {'tile_n': 64, 'tile_k': 64, 'split_k': 4, 'stages': 12, 'warpgroups': 1}, 1.181),
    ((8, 8192, (2048,)),
     {'tile_n': 64, 'tile_k': 64, 'split_k': 4, 'stages': 12, 'warpgroups': 1}, 1.098),
    ((1, 1024, (2048, 1024, 1024)),
     {'tile_n': 64, 'tile_k': 64, 'split_k': 1, 'stages': 12, 'warpgroups': 1}, 0.342),
    ((8, 1024, (2048, 1024, 1024)),
     {'tile_n': 128, 'tile_k': 64, 'split_k': 1, 'stages': 8, 'warpgroups': 1}, 0.692),
    ((1, 2048, (1024,)),
     {'tile_n': 64, 'tile_k': 64, 'split_k': 8, 'stages': 12, 'warpgroups': 1}, 0.536),
    ((8, 2048, (1024,)),
     {'tile_n': 64, 'tile_k': 64, 'split_k': 8, 'stages': 12, 'warpgroups': 1}, 1.128),
    ((1, 3072, (1024,)),
     {'tile_n': 64, 'tile_k': 64, 'split_k': 8, 'stages': 12, 'warpgroups': 1}, 0.348),
    ((8, 3072, (1024,)),
     {'tile_n': 64, 'tile_k': 64, 'split_k': 7, 'stages': 12, 'warpgroups': 1}, 1.277),
    ((1, 1024, (1152,)),
     {'tile_n': 64, 'tile_k': 64, 'split_k': 6, 'stages': 12, 'warpgroups': 1}, 0.773),
    ((8, 1024, (1152,)),
     {'tile_n': 64, 'tile_k': 64, 'split_k': 6, 'stages': 12, 'warpgroups': 1}, 1.389),
    ((1, 6912, (1152,)),
     {'tile_n': 128, 'tile_k': 64, 'split_k': 8, 'stages': 8, 'warpgroups': 1}, 0.924),
    ((8, 6912, (1152,)),
     {'tile_n': 64, 'tile_k': 64, 'split_k': 4, 'stages': 12, 'warpgroups': 1}, 0.888),
)
