"""Temporary: plain GEMM with warpgroups splitting the CTA's columns (128 x 128 each, the
default) against rows (64 x 256 each, CUTLASS's cooperative layout). PYTHONPATH=."""
import dataclasses, json, os, sys
import jax, jax.numpy as jnp, numpy as np
sys.path.insert(0, "tests/gpu_norms")
import run_norms_gpu as R
from pallas_kernels import _gemm_core as core, plain_matmul as pm

SMOKE = R.SMOKE
shapes = [(256, 512, 512)] if SMOKE else [(8192, 4096, 2048), (8192, 4096, 4096),
                                          (4096, 4096, 2048), (8192, 4096, 1024)]
out = []
for m, k, n in shapes:
    rng = np.random.default_rng(m + n)
    base = core.default_config(m, k, (n,))
    rows = dataclasses.replace(base, tile_m=64, tile_n=256, wg_dimension=core.MatmulDimension.M)
    copies = [(R.rand(rng, (m, k)), R.rand(rng, (k, n), R.BF16, 1 / np.sqrt(k)))
              for _ in range(R.copies_for((m * k + k * n) * 2))]
    x, w = copies[0]
    ref = jnp.dot(x, w, preferred_element_type=jnp.float32)
    for name, cfg in (("cols", base), ("rows", rows), ("cols", base), ("rows", rows)):
        fn = lambda x, w, cfg=cfg: pm.plain_matmul(x, w, config=cfg, interpret=SMOKE)
        err = R.rel_err(fn(x, w), ref)
        us = R.time_us(fn, copies)
        item = dict(shape=(m, k, n), split=name, us=round(us, 1), rel_err=err, config=str(cfg))
        print(item, flush=True)
        out.append(item)
json.dump(out, open(os.path.join(R.OUT, "split.json"), "w"), indent=1)
