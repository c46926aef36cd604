"""RMSNorm's backward kernel (pallas_kernels/rms_norm_backward.py) against JAX's autodiff of
the stock norm (what a training step runs without it), per measured shape, written by
`python -m bench.norm_backward --write-table`.

Automatic dispatch (jaxnorm/backends/mosaic_norm_backward.py) takes the kernel for the
backward of a training step's RMSNorm only where the nearest entry within a factor of 2 in
M and K, same dtype, gain or not, with the residual stream's cotangent added in it or not
(an op called with `return_input=True`), and with as many cotangents of the normed x
summed in it (one per consumer: a gated MLP's gate and up GEMMs give two), measured at
most `MAX_RATIO` of stock's time and saved at least `MIN_SAVED_US` a launch; with no such
entry it declines. Regenerate rather than edit.
"""

# The run: command, UTC date, GPU, its SM count, commit.
PROVENANCE: dict[str, str | int | None] = {
    'command': 'python -m bench.norm_backward',
    'date': '2026-12-07T12:52:36+00:00',
    'device': 'NVIDIA H100 80GB HBM3',
    'sms': 132,
    'commit': '8b86dda',
}

# ((M, K), dtype name, with a gain, with the stream's cotangent added in it, cotangents of
#  the normed x summed in it, kernel / stock autodiff of the norm's backward, microseconds
#  saved a launch).
ENTRIES: tuple[tuple[tuple[int, int], str, bool, bool, int, float, float], ...] = (
    ((4096, 4096), 'bfloat16', True, False, 1, 0.634, 43.8),
    ((4096, 4096), 'bfloat16', True, True, 1, 0.416, 69.8),
    ((4096, 4096), 'bfloat16', False, False, 1, 1.002, -0.1),
    ((4096, 4096), 'bfloat16', False, True, 1, 0.666, 23.3),
    ((4096, 2048), 'bfloat16', True, False, 1, 0.613, 25.3),
    ((4096, 2048), 'bfloat16', True, True, 1, 0.419, 38.1),
    ((4096, 2048), 'bfloat16', False, False, 1, 0.954, 1.7),
    ((4096, 2048), 'bfloat16', False, True, 1, 0.642, 13.2),
    ((4096, 1024), 'bfloat16', True, False, 1, 0.586, 14.0),
    ((4096, 1024), 'bfloat16', True, True, 1, 0.466, 18.0),
    ((4096, 1024), 'bfloat16', False, False, 1, 0.812, 3.8),
    ((4096, 1024), 'bfloat16', False, True, 1, 0.639, 7.4),
    ((65536, 128), 'bfloat16', True, False, 1, 0.610, 13.9),
    ((65536, 128), 'bfloat16', False, False, 1, 0.586, 13.3),
    ((4096, 2560), 'bfloat16', True, False, 1, 0.614, 30.6),
    ((4096, 2560), 'bfloat16', True, True, 1, 0.411, 46.7),
    ((4096, 2560), 'bfloat16', False, False, 1, 0.950, 2.3),
    ((4096, 2560), 'bfloat16', False, True, 1, 0.650, 15.9),
    ((131072, 128), 'bfloat16', True, False, 1, 0.602, 25.7),
    ((131072, 128), 'bfloat16', False, False, 1, 0.589, 25.0),
    ((32768, 128), 'bfloat16', True, False, 1, 0.599, 8.9),
    ((32768, 128), 'bfloat16', False, False, 1, 0.574, 7.8),
    ((2048, 1152), 'bfloat16', True, False, 1, 0.642, 7.6),
    ((2048, 1152), 'bfloat16', True, True, 1, 0.521, 10.2),
    ((2048, 1152), 'bfloat16', False, False, 1, 0.783, 3.0),
    ((2048, 1152), 'bfloat16', False, True, 1, 0.612, 5.4),
    ((8192, 256), 'bfloat16', True, False, 1, 0.614, 5.4),
    ((8192, 256), 'bfloat16', False, False, 1, 0.611, 4.3),
    ((2048, 256), 'bfloat16', True, False, 1, 0.551, 4.0),
    ((2048, 256), 'bfloat16', False, False, 1, 0.632, 1.8),
)
