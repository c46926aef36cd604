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
    'date': '2026-12-04T08:52:42+00:00',
    'device': 'NVIDIA H200',
    'sms': 132,
    'commit': 'e94a56e',
}

# ((M, K), dtype name, with a gain, with the stream's cotangent added in it,
#  kernel / stock autodiff of the norm's backward, microseconds saved a launch).
ENTRIES: tuple[tuple[tuple[int, int], str, bool, bool, float, float], ...] = (
    ((4096, 4096), 'bfloat16', True, False, 0.681, 28.6),
    ((4096, 4096), 'bfloat16', True, True, 0.435, 50.6),
    ((4096, 4096), 'bfloat16', False, False, 1.006, -0.3),
    ((4096, 4096), 'bfloat16', False, True, 0.649, 18.1),
    ((4096, 2048), 'bfloat16', True, False, 0.710, 14.6),
    ((4096, 2048), 'bfloat16', True, True, 0.495, 25.3),
    ((4096, 2048), 'bfloat16', False, False, 0.971, 0.8),
    ((4096, 2048), 'bfloat16', False, True, 0.658, 9.4),
    ((4096, 1024), 'bfloat16', True, False, 0.666, 9.8),
    ((4096, 1024), 'bfloat16', True, True, 0.491, 14.8),
    ((4096, 1024), 'bfloat16', False, False, 0.936, 1.0),
    ((4096, 1024), 'bfloat16', False, True, 0.660, 5.3),
    ((65536, 128), 'bfloat16', True, False, 0.675, 9.5),
    ((65536, 128), 'bfloat16', False, False, 0.551, 11.4),
    ((4096, 2560), 'bfloat16', True, False, 0.633, 22.4),
    ((4096, 2560), 'bfloat16', True, True, 0.434, 34.6),
    ((4096, 2560), 'bfloat16', False, False, 0.943, 1.9),
    ((4096, 2560), 'bfloat16', False, True, 0.659, 11.5),
    ((131072, 128), 'bfloat16', True, False, 0.691, 15.8),
    ((131072, 128), 'bfloat16', False, False, 0.546, 21.8),
    ((2048, 1152), 'bfloat16', True, False, 0.905, 1.9),
    ((2048, 1152), 'bfloat16', True, True, 0.773, 4.6),
    ((2048, 1152), 'bfloat16', False, False, 0.923, 0.8),
    ((2048, 1152), 'bfloat16', False, True, 0.669, 3.4),
    ((8192, 256), 'bfloat16', True, False, 0.867, 1.4),
    ((8192, 256), 'bfloat16', False, False, 0.617, 3.0),
)
