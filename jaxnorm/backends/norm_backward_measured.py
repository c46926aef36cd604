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
    'date': '2026-12-04T07:51:11+00:00',
    'device': 'NVIDIA H200',
    'sms': 132,
    'commit': '15480f3',
}

# ((M, K), dtype name, with a gain, with the stream's cotangent added in it, kernel / stock autodiff of the norm's backward).
ENTRIES: tuple[tuple[tuple[int, int], str, bool, bool, float], ...] = (
    ((4096, 4096), 'bfloat16', True, False, 0.695),
    ((4096, 4096), 'bfloat16', True, True, 0.516),
    ((4096, 4096), 'bfloat16', False, False, 1.000),
    ((4096, 4096), 'bfloat16', False, True, 0.649),
    ((4096, 2048), 'bfloat16', True, False, 0.957),
    ((4096, 2048), 'bfloat16', True, True, 0.784),
    ((4096, 2048), 'bfloat16', False, False, 0.973),
    ((4096, 2048), 'bfloat16', False, True, 0.669),
    ((4096, 1024), 'bfloat16', True, False, 0.885),
    ((4096, 1024), 'bfloat16', True, True, 0.610),
    ((4096, 1024), 'bfloat16', False, False, 0.921),
    ((4096, 1024), 'bfloat16', False, True, 0.703),
    ((65536, 128), 'bfloat16', True, False, 0.697),
    ((65536, 128), 'bfloat16', False, False, 0.544),
    ((4096, 2560), 'bfloat16', True, False, 0.684),
    ((4096, 2560), 'bfloat16', True, True, 0.452),
    ((4096, 2560), 'bfloat16', False, False, 0.935),
    ((4096, 2560), 'bfloat16', False, True, 0.645),
    ((131072, 128), 'bfloat16', True, False, 0.671),
    ((131072, 128), 'bfloat16', False, False, 0.544),
    ((2048, 1152), 'bfloat16', True, False, 0.963),
    ((2048, 1152), 'bfloat16', True, True, 0.809),
    ((2048, 1152), 'bfloat16', False, False, 0.918),
    ((2048, 1152), 'bfloat16', False, True, 0.678),
    ((8192, 256), 'bfloat16', True, False, 0.812),
    ((8192, 256), 'bfloat16', False, False, 0.618),
)
