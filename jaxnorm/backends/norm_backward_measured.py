"""RMSNorm's backward kernel (pallas_kernels/rms_norm_backward.py) against JAX's autodiff of
the stock norm (what a training step runs without it), per measured shape, written by
`python -m bench.norm_backward --write-table`.

Automatic dispatch (jaxnorm/backends/mosaic_norm_backward.py) takes the kernel for the
backward of a training step's RMSNorm only where the nearest entry within a factor of 2 in
M and K, same dtype, measured at most `MAX_RATIO` of stock's time. Empty: the kernel has not
been timed on a GPU yet, so automatic dispatch declines it everywhere. Regenerate rather
than edit.
"""

# The run: command, UTC date, GPU, its SM count, commit.
PROVENANCE: dict[str, str | int | None] = {
    'command': None,
    'date': None,
    'device': None,
    'sms': None,
    'commit': None,
}

# ((M, K), dtype name, with a gain, kernel / stock autodiff of the norm's backward).
ENTRIES: tuple[tuple[tuple[int, int], str, bool, float], ...] = ()
