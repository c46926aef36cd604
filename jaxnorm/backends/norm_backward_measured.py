"""RMSNorm's backward kernel (pallas_kernels/rms_norm_backward.py) against JAX's autodiff of
the stock norm (what a training step runs without it), per measured shape, written by
`python -m bench.norm_backward --write-table`.

Automatic dispatch (jaxnorm/backends/mosaic_norm_backward.py) takes the kernel for the
backward of a training step's RMSNorm only where the nearest entry within a factor of 2 in
M and K, same dtype, gain or not, and with the residual stream's cotangent added in it or
not (an op called with `return_input=True`), measured at most `MAX_RATIO` of stock's time
and saved at least `MIN_SAVED_US` a launch; with no such entry it declines. Regenerate
rather than edit.
"""

# The run: command, UTC date, GPU, its SM count, commit.
PROVENANCE: dict[str, str | int | None] = {
    'command': 'python -m bench.norm_backward',
    'date': '2026-12-07T09:34:59+00:00',
    'device': 'NVIDIA H100 80GB HBM3',
    'sms': 132,
    'commit': '81c9493',
}

# ((M, K), dtype name, with a gain, with the stream's cotangent added in it,
#  kernel / stock autodiff of the norm's backward, microseconds saved a launch).
ENTRIES: tuple[tuple[tuple[int, int], str, bool, bool, float, float], ...] = (
    ((4096, 4096), 'bfloat16', True, False, 0.631, 43.8),
    ((4096, 4096), 'bfloat16', True, True, 0.422, 68.7),
    ((4096, 4096), 'bfloat16', False, False, 1.002, -0.1),
    ((4096, 4096), 'bfloat16', False, True, 0.662, 23.4),
    ((4096, 2048), 'bfloat16', True, False, 0.616, 25.0),
    ((4096, 2048), 'bfloat16', True, True, 0.416, 37.9),
    ((4096, 2048), 'bfloat16', False, False, 0.959, 1.5),
    ((4096, 2048), 'bfloat16', False, True, 0.647, 12.9),
    ((4096, 1024), 'bfloat16', True, False, 0.560, 15.4),
    ((4096, 1024), 'bfloat16', True, True, 0.438, 19.6),
    ((4096, 1024), 'bfloat16', False, False, 0.815, 3.7),
    ((4096, 1024), 'bfloat16', False, True, 0.642, 7.3),
    ((65536, 128), 'bfloat16', True, False, 0.612, 13.8),
    ((65536, 128), 'bfloat16', False, False, 0.583, 13.4),
    ((4096, 2560), 'bfloat16', True, False, 0.611, 30.6),
    ((4096, 2560), 'bfloat16', True, True, 0.442, 43.9),
    ((4096, 2560), 'bfloat16', False, False, 0.932, 3.1),
    ((4096, 2560), 'bfloat16', False, True, 0.662, 15.2),
    ((131072, 128), 'bfloat16', True, False, 0.598, 25.8),
    ((131072, 128), 'bfloat16', False, False, 0.586, 25.0),
    ((2048, 1152), 'bfloat16', True, False, 0.608, 8.8),
    ((2048, 1152), 'bfloat16', True, True, 0.495, 11.4),
    ((2048, 1152), 'bfloat16', False, False, 0.785, 3.0),
    ((2048, 1152), 'bfloat16', False, True, 0.606, 5.4),
    ((8192, 256), 'bfloat16', True, False, 0.632, 5.1),
    ((8192, 256), 'bfloat16', False, False, 0.602, 4.4),
)
