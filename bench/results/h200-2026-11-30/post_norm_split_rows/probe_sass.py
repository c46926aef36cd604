"""Temporary: ptxas register/spill report and SASS opcode histogram of the plain GEMM and
post-norm picks (H200). Run: PYTHONPATH=. python3 probe_sass.py  (writes $OUT/sass)."""
import collections, os, re, subprocess, sys, tarfile, json

OUT = os.environ.get("OUT", "/tmp/probe")
# name -> (kernel, M, K, N, kind, residual, config changes); CASES=a,b picks some.
ALL_CASES = {
    "plain_8192x4096x2048": ("plain", 8192, 4096, 2048, "rms", False, {}),
    "rms_8192x4096x2048": ("post", 8192, 4096, 2048, "rms", False, {}),
    "rms_8192x4096x4096": ("post", 8192, 4096, 4096, "rms", False, {}),
    "rmsres_8192x4096x2048": ("post", 8192, 4096, 2048, "rms", True, {}),
    "lnres_8192x4096x2048": ("post", 8192, 4096, 2048, "layer", True, {}),
    "ln_8192x4096x2048": ("post", 8192, 4096, 2048, "layer", False, {}),
    "rms_cols_8192x4096x2048": ("post", 8192, 4096, 2048, "rms", False,
                                dict(tile_m=128, tile_n=128, split_rows=False)),
    "lnres_rows_8192x4096x2048": ("post", 8192, 4096, 2048, "layer", True,
                                  dict(tile_m=64, tile_n=256, split_rows=True)),
}
CASES = {k: ALL_CASES[k] for k in os.environ.get("CASES", ",".join(list(ALL_CASES)[:5])).split(",")}

def child(name):
    import jax, jax.numpy as jnp
    from pallas_kernels import plain_matmul, post_norm_matmul as pn
    import dataclasses
    what, m, k, n, kind, res, changes = ALL_CASES[name]
    x = jnp.ones((m, k), jnp.bfloat16); w = jnp.ones((k, n), jnp.bfloat16) * 0.01
    if what == "plain":
        y = plain_matmul.plain_matmul(x, w)
    else:
        cfg = dataclasses.replace(
            pn.select_gpu_config(m, k, n, jnp.bfloat16, kind=kind, residual=res), **changes)
        print(name, cfg, flush=True)
        b = jnp.ones((n,), jnp.float32); g = jnp.ones((n,), jnp.float32)
        r = jnp.ones((m, n), jnp.bfloat16) if res else None
        y = pn.post_norm_matmul(x, w, b, g, b if kind == "layer" else None, r, kind=kind,
                                eps=1e-6, config=cfg, pre_norm_sum=res)[0]
    jax.block_until_ready(y)

def main():
    if len(sys.argv) > 1:
        return child(sys.argv[1])
    root = os.path.join(OUT, "sass"); os.makedirs(root, exist_ok=True)
    summary = {}
    for name in CASES:
        d = os.path.join(root, name); os.makedirs(d, exist_ok=True)
        env = dict(os.environ, MOSAIC_GPU_DUMP_PTXAS="1", MOSAIC_GPU_DUMP_SASS="1",
                   MOSAIC_GPU_DUMP_PTX="1", MOSAIC_GPU_DUMP_TO=d)
        p = subprocess.run([sys.executable, __file__, name], env=env, capture_output=True,
                           text=True, timeout=300)
        log = p.stdout + p.stderr
        open(os.path.join(d, "log.txt"), "w").write(log)
        text = log
        for f in os.listdir(d):
            if f != "log.txt" and not f.endswith(".log"):
                text += open(os.path.join(d, f), errors="replace").read()
        regs = re.findall(r"Used \d+ registers[^\n]*", text)
        spills = re.findall(r"\d+ bytes spill stores, \d+ bytes spill loads|Spill[^\n]*", text)
        ptx = "".join(open(os.path.join(d, f)).read() for f in os.listdir(d) if f.endswith(".ptx"))
        ops = collections.Counter(op for op in re.findall(
            r"^\s+(?:@%p\d+ )?([a-z][a-z0-9_.]*)", ptx, re.M) if "f32" in op or "bf16" in op)
        summary[name] = dict(rc=p.returncode, files=os.listdir(d), regs=regs, spills=spills,
                             ops=dict(ops.most_common(60)))
        print(name, p.returncode, regs, spills, flush=True)
        print("  ", dict(ops.most_common(40)), flush=True)
        if p.returncode:
            print(log[-3000:])
    json.dump(summary, open(os.path.join(OUT, "sass_summary.json"), "w"), indent=1)
    with tarfile.open(os.path.join(OUT, "sass.tar.gz"), "w:gz") as t:
        t.add(root, arcname="sass", filter=lambda i: None if i.name.endswith(".log") and
              "mlir" in i.name else i)
    subprocess.run(["rm", "-rf", root])

if __name__ == "__main__":
    main()
