"""RMSNorm's backward kernel (pallas_kernels/rms_norm_backward.py): the fastest config measured
at each shape, written by `python -m bench.norm_backward --write-configs`.

`select_backward_config` takes, at the nearest entry of the same K and dtype with M within a
factor of 2, on a GPU of the run's SM count, its rows per block and its CTA count (row
blocks per CTA scaled to M); elsewhere the one-wave heuristic. Regenerate rather than edit.
"""

# The run: command, UTC date, GPU, its SM count, commit.
PROVENANCE: dict[str, str | int | None] = {
    'command': 'python -m bench.norm_backward --configs --shapes 2048x1152,4096x2048,4096x1024,65536x128,8192x256; python -m bench.norm_backward --configs --shapes 4096x4096,4096x2560,131072x128; python -m bench.norm_backward --configs --shapes 2048x256',
    'date': '2026-12-07T12:52:17+00:00',
    'device': 'NVIDIA H100 80GB HBM3',
    'sms': 132,
    'commit': '44f09e5; 32bf4ae; 8b86dda',
}

# ((M, K), dtype name, rows per block, row blocks per CTA, its time / stock's,
#  the selection's before this table / stock's): the fastest config measured.
ENTRIES: tuple[tuple[tuple[int, int], str, int, int, float, float], ...] = (
    ((2048, 1152), 'bfloat16', 2, 4, 0.482, 0.738),
    ((4096, 2048), 'bfloat16', 1, 16, 0.418, 0.463),
    ((4096, 1024), 'bfloat16', 1, 8, 0.436, 0.497),
    ((65536, 128), 'bfloat16', 16, 8, 0.619, 0.693),
    ((8192, 256), 'bfloat16', 16, 4, 0.623, 0.704),
    ((4096, 4096), 'bfloat16', 1, 16, 0.418, 0.421),
    ((4096, 2560), 'bfloat16', 1, 16, 0.409, 0.435),
    ((131072, 128), 'bfloat16', 16, 16, 0.605, 0.605),
    ((2048, 256), 'bfloat16', 8, 2, 0.580, 0.717),
)
