"""RMSNorm's backward kernel (pallas_kernels/rms_norm_backward.py) against JAX's autodiff of
the stock norm (what a training step runs without it), per measured shape, written by
`python -m bench.norm_backward --write-table`.

Automatic dispatch (jaxnorm/backends/mosaic_norm_backward.py) takes the kernel for the
backward of a training step's RMSNorm only where the nearest entry within a factor of 2 in
M and K, same dtype, gain or not, and with the residual stream's cotangent added in it or
not (an op called with `return_input=True`), measured at most `MAX_RATIO` of stock's time;
with no such entry it declines. Regenerate rather than edit.
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
#  kernel / stock autodiff of the norm's backward).
ENTRIES: tuple[tuple[tuple[int, int], str, bool, bool, float], ...] = (
    ((4096, 4096), 'bfloat16', True, False, 0.681),
    ((4096, 4096), 'bfloat16', True, True, 0.435),
    ((4096, 4096), 'bfloat16', False, False, 1.006),
    ((4096, 4096), 'bfloat16', False, True, 0.649),
    ((4096, 2048), 'bfloat16', True, False, 0.710),
    ((4096, 2048), 'bfloat16', True, True, 0.495),
    ((4096, 2048), 'bfloat16', False, False, 0.971),
    ((4096, 2048), 'bfloat16', False, True, 0.658),
    ((4096, 1024), 'bfloat16', True, False, 0.666),
    ((4096, 1024), 'bfloat16', True, True, 0.491),
    ((4096, 1024), 'bfloat16', False, False, 0.936),
    ((4096, 1024), 'bfloat16', False, True, 0.660),
    ((65536, 128), 'bfloat16', True, False, 0.675),
    ((65536, 128), 'bfloat16', False, False, 0.551),
    ((4096, 2560), 'bfloat16', True, False, 0.633),
    ((4096, 2560), 'bfloat16', True, True, 0.434),
    ((4096, 2560), 'bfloat16', False, False, 0.943),
    ((4096, 2560), 'bfloat16', False, True, 0.659),
    ((131072, 128), 'bfloat16', True, False, 0.691),
    ((131072, 128), 'bfloat16', False, False, 0.546),
    ((2048, 1152), 'bfloat16', True, False, 0.905),
    ((2048, 1152), 'bfloat16', True, True, 0.773),
    ((2048, 1152), 'bfloat16', False, False, 0.923),
    ((2048, 1152), 'bfloat16', False, True, 0.669),
    ((8192, 256), 'bfloat16', True, False, 0.867),
    ((8192, 256), 'bfloat16', False, False, 0.617),
)
