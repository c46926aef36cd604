"""Probe: why the decode GEMM is slower at M < 64 than at M = 64 (bench/results, decode-gemm).

    PYTHONPATH=. python bench/gpu/decode_box_probe.py --out $OUT   # H200

The same config at each shape, x's TMA box three ways: 64 rows with TMA zero-filling
the rows past M (the kernel before this probe), M rounded up to 8 rows (TMA
zero-fills at most 7), and x padded to those 8 rows in XLA first (no fill at all;
the pad's kernel counts). cuBLAS's `x @ w` in the same interleaved rounds.
Each variant is checked against XLA's float32 product before it is timed.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import jax
import jax.numpy as jnp

from bench import decode_gemm as dg
from bench import timing
from pallas_kernels import decode_matmul as dm
from pallas_kernels.padding import pad_rows

SHAPES = [(4096, 6144), (14336, 4096), (2048, 16384)]
ROWS = (1, 8, 64)


def _variant(config, box: int, pad: bool):
    def fn(x, ws, r):
        (w,) = ws
        m = x.shape[0]
        xr = pad_rows(x, box) if pad else x
        rr = pad_rows(r, box) if pad else r
        if config.split_k == 1:
            (y,) = dm._build(xr, [w], config=config, has_bias=False, interpret=False,
                             x_box=box)(xr, w, rr)
            return (y[:m],)
        (p,) = dm._build(xr, [w], config=config, has_bias=False, interpret=False,
                         x_box=box)(xr, w)
        return ((jnp.sum(p[:, :m], axis=0) * r[:, None]).astype(x.dtype),)
    return fn


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for k, n in SHAPES:
        for m in ROWS:
            config = dm.decode_config(m, k, (n,), sms=132)
            box = dm.x_box_rows(m)
            variants = {"xla": dg._xla, "box64": _variant(config, 64, False),
                        "box8": _variant(config, box, False),
                        "box8_padded": _variant(config, box, True)}
            key = jax.random.key(m + k + n)
            first = dg._inputs(key, m, k, (n,))
            copies = timing.rotation_copies(sum(a.nbytes for a in jax.tree.leaves(first)))
            sets = [first] + [dg._inputs(jax.random.fold_in(key, c), m, k, (n,))
                              for c in range(1, copies)]
            row = dict(shape=[m, k, n], config=dg._label(config), box=box, errors={}, us={})
            for name, fn in variants.items():
                if name != "xla":
                    row["errors"][name] = dg.worst_error(jax.jit(fn)(*first), *first)
            samples = {name: [] for name in variants}
            for _ in range(2):
                for name, fn in variants.items():
                    samples[name].append(timing.measure(fn, sets, repeats=args.repeats,
                                                        warmup=1).best_us)
            row["us"] = {name: min(v) for name, v in samples.items()}
            row["ratio"] = {name: row["us"][name] / row["us"]["xla"] for name in variants}
            rows.append(row)
            print(json.dumps(row), flush=True)
            (args.out / "decode-box-probe.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
