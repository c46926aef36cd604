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
    'date': '2026-12-07T09:54:35+00:00',
    'device': 'NVIDIA H100 80GB HBM3',
    'sms': 132,
    'commit': '32bf4ae',
}

# ((M, K), dtype name, with a gain, with the stream's cotangent added in it,
#  kernel / stock autodiff of the norm's backward, microseconds saved a launch).
ENTRIES: tuple[tuple[tuple[int, int], str, bool, bool, float, float], ...] = (
    ((4096, 4096), 'bfloat16', True, False, 0.631, 43.9),
    ((4096, 4096), 'bfloat16', True, True, 0.421, 69.0),
    ((4096, 4096), 'bfloat16', False, False, 1.003, -0.2),
    ((4096, 4096), 'bfloat16', False, True, 0.665, 23.2),
    ((4096, 2048), 'bfloat16', True, False, 0.613, 25.2),
    ((4096, 2048), 'bfloat16', True, True, 0.420, 37.7),
    ((4096, 2048), 'bfloat16', False, False, 0.959, 1.5),
    ((4096, 2048), 'bfloat16', False, True, 0.644, 13.1),
    ((4096, 1024), 'bfloat16', True, False, 0.557, 15.5),
    ((4096, 1024), 'bfloat16', True, True, 0.436, 19.7),
    ((4096, 1024), 'bfloat16', False, False, 0.815, 3.7),
    ((4096, 1024), 'bfloat16', False, True, 0.643, 7.2),
    ((65536, 128), 'bfloat16', True, False, 0.615, 13.7),
    ((65536, 128), 'bfloat16', False, False, 0.580, 13.5),
    ((4096, 2560), 'bfloat16', True, False, 0.613, 30.5),
    ((4096, 2560), 'bfloat16', True, True, 0.410, 46.5),
    ((4096, 2560), 'bfloat16', False, False, 0.957, 2.0),
    ((4096, 2560), 'bfloat16', False, True, 0.651, 15.8),
    ((131072, 128), 'bfloat16', True, False, 0.599, 25.6),
    ((131072, 128), 'bfloat16', False, False, 0.588, 24.9),
    ((2048, 1152), 'bfloat16', True, False, 0.604, 9.0),
    ((2048, 1152), 'bfloat16', True, True, 0.492, 11.5),
    ((2048, 1152), 'bfloat16', False, False, 0.786, 2.9),
    ((2048, 1152), 'bfloat16', False, True, 0.606, 5.4),
    ((8192, 256), 'bfloat16', True, False, 0.632, 5.1),
    ((8192, 256), 'bfloat16', False, False, 0.603, 4.4),
)
