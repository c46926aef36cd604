"""Measured GEMM configs per (M, K, N), written by `python -m bench.gemm_sweep --write-table`.

`gemm_config.default_config` takes the entry nearest a prefill shape (M > 64) in log2
space, within `gemm_config.TABLE_RADIUS_LOG2`, on a GPU with PROVENANCE's SM count; the
modelled pick elsewhere and while the table is empty. Regenerate rather than edit.
"""

# The sweeps: commands, UTC date of the last, GPU, its SM count, commits.
PROVENANCE: dict[str, str | int | None] = {
    'command': 'python -m bench.gemm_sweep --around-table --budget-s 215 --out /tmp/h200/gemm_sweep; python -m bench.gemm_sweep --screen-all --shapes 4096x1024x6144,8192x1024x6144,8192x1024x4096,4096x1024x4096,8192x2048x16384 --budget-s 245 --out /tmp/h200/gemm_screen; python -m bench.gemm_sweep --around-table --shapes 4096x4096x2560,4096x2560x19456,4096x9728x2560 --budget-s 90 --out /root/out; python -m bench.gemm_sweep --screen-all --no-cluster --shapes 4096x4096x2560,4096x9728x2560 --budget-s 135 --out /root/out; python -m bench.gemm_sweep --screen-all --no-cluster --shapes 4096x1152x1536,2048x1152x1536 --budget-s 105 --out /root/out',
    'date': '2026-12-04T16:51:09+00:00',
    'device': 'NVIDIA H200',
    'sms': 132,
    'commit': '3b18c7c; 3b18c7c; 3b18c7c; 3b18c7c; 22cbc57',
}

# ((M, K, N), TuningConfig fields): each shape's fastest config in the sweep.
ENTRIES: tuple[tuple[tuple[int, int, int], dict[str, int | str]], ...] = (
    ((8192, 4096, 6144),  # 1.004x cuBLAS
     {'tile_m': 64, 'tile_n': 256, 'tile_k': 64, 'max_concurrent_steps': 3, 'epi_tile_m': 64,
      'epi_tile_n': 128, 'grid_minor_dim': 'M', 'grid_tile_width': 8, 'wg_dimension': 'M',
      'cluster_dimension': None, 'wgmma_in_flight': 0}),
    ((8192, 4096, 4096),  # 0.986x cuBLAS
     {'tile_m': 64, 'tile_n': 256, 'tile_k': 64, 'max_concurrent_steps': 3, 'epi_tile_m': 64,
      'epi_tile_n': 128, 'grid_minor_dim': 'M', 'grid_tile_width': 8, 'wg_dimension': 'M',
      'cluster_dimension': None, 'wgmma_in_flight': 0}),
    ((8192, 4096, 28672),  # 0.940x cuBLAS
     {'tile_m': 64, 'tile_n': 256, 'tile_k': 64, 'max_concurrent_steps': 3, 'epi_tile_m': 64,
      'epi_tile_n': 64, 'grid_minor_dim': 'M', 'grid_tile_width': 8, 'wg_dimension': 'M',
      'cluster_dimension': None, 'wgmma_in_flight': 0}),
    ((8192, 14336, 4096),  # 0.974x cuBLAS
     {'tile_m': 64, 'tile_n': 256, 'tile_k': 64, 'max_concurrent_steps': 4, 'epi_tile_m': 64,
      'epi_tile_n': 32, 'grid_minor_dim': 'N', 'grid_tile_width': 8, 'wg_dimension': 'M',
      'cluster_dimension': 'M', 'wgmma_in_flight': 0}),
    ((8192, 2048, 3072),  # 0.998x cuBLAS
     {'tile_m': 64, 'tile_n': 256, 'tile_k': 64, 'max_concurrent_steps': 3, 'epi_tile_m': 64,
      'epi_tile_n': 128, 'grid_minor_dim': 'M', 'grid_tile_width': 8, 'wg_dimension': 'M',
      'cluster_dimension': None, 'wgmma_in_flight': 0}),
    ((8192, 2048, 2048),  # 1.000x cuBLAS
     {'tile_m': 64, 'tile_n': 256, 'tile_k': 64, 'max_concurrent_steps': 3, 'epi_tile_m': 64,
      'epi_tile_n': 128, 'grid_minor_dim': 'M', 'grid_tile_width': 8, 'wg_dimension': 'M',
      'cluster_dimension': None, 'wgmma_in_flight': 0}),
    ((8192, 2048, 16384),  # 1.021x cuBLAS
     {'tile_m': 64, 'tile_n': 256, 'tile_k': 64, 'max_concurrent_steps': 3, 'epi_tile_m': 64,
      'epi_tile_n': 128, 'grid_minor_dim': 'M', 'grid_tile_width': 8, 'wg_dimension': 'M',
      'cluster_dimension': None, 'wgmma_in_flight': 0}),
    ((8192, 8192, 2048),  # 1.003x cuBLAS
     {'tile_m': 64, 'tile_n': 256, 'tile_k': 64, 'max_concurrent_steps': 3, 'epi_tile_m': 64,
      'epi_tile_n': 128, 'grid_minor_dim': 'M', 'grid_tile_width': 8, 'wg_dimension': 'M',
      'cluster_dimension': None, 'wgmma_in_flight': 1}),
    ((8192, 1024, 4096),  # 1.038x cuBLAS
     {'tile_m': 64, 'tile_n': 256, 'tile_k': 64, 'max_concurrent_steps': 3, 'epi_tile_m': 64,
      'epi_tile_n': 128, 'grid_minor_dim': 'M', 'grid_tile_width': 8, 'wg_dimension': 'M',
      'cluster_dimension': None, 'wgmma_in_flight': 1}),
    ((8192, 2048, 1024),  # 1.005x cuBLAS
     {'tile_m': 128, 'tile_n': 128, 'tile_k': 64, 'max_concurrent_steps': 4, 'epi_tile_m': 64,
      'epi_tile_n': 32, 'grid_minor_dim': 'M', 'grid_tile_width': 8, 'wg_dimension': 'N',
      'cluster_dimension': None, 'wgmma_in_flight': 0}),
    ((8192, 1024, 6144),  # 1.047x cuBLAS
     {'tile_m': 64, 'tile_n': 256, 'tile_k': 64, 'max_concurrent_steps': 3, 'epi_tile_m': 64,
      'epi_tile_n': 128, 'grid_minor_dim': 'M', 'grid_tile_width': 8, 'wg_dimension': 'M',
      'cluster_dimension': None, 'wgmma_in_flight': 0}),
    ((8192, 3072, 1024),  # 0.995x cuBLAS
     {'tile_m': 128, 'tile_n': 128, 'tile_k': 64, 'max_concurrent_steps': 4, 'epi_tile_m': 64,
      'epi_tile_n': 32, 'grid_minor_dim': 'M', 'grid_tile_width': 8, 'wg_dimension': 'N',
      'cluster_dimension': None, 'wgmma_in_flight': 1}),
    ((8192, 2560, 6144),  # 1.014x cuBLAS
     {'tile_m': 64, 'tile_n': 256, 'tile_k': 64, 'max_concurrent_steps': 3, 'epi_tile_m': 64,
      'epi_tile_n': 128, 'grid_minor_dim': 'M', 'grid_tile_width': 8, 'wg_dimension': 'M',
      'cluster_dimension': None, 'wgmma_in_flight': 0}),
    ((8192, 4096, 2560),  # 0.988x cuBLAS
     {'tile_m': 64, 'tile_n': 256, 'tile_k': 64, 'max_concurrent_steps': 3, 'epi_tile_m': 64,
      'epi_tile_n': 128, 'grid_minor_dim': 'M', 'grid_tile_width': 8, 'wg_dimension': 'M',
      'cluster_dimension': None, 'wgmma_in_flight': 0}),
    ((8192, 2560, 19456),  # 0.980x cuBLAS
     {'tile_m': 64, 'tile_n': 256, 'tile_k': 64, 'max_concurrent_steps': 3, 'epi_tile_m': 64,
      'epi_tile_n': 128, 'grid_minor_dim': 'M', 'grid_tile_width': 8, 'wg_dimension': 'M',
      'cluster_dimension': None, 'wgmma_in_flight': 0}),
    ((8192, 9728, 2560),  # 1.004x cuBLAS
     {'tile_m': 64, 'tile_n': 256, 'tile_k': 64, 'max_concurrent_steps': 3, 'epi_tile_m': 64,
      'epi_tile_n': 128, 'grid_minor_dim': 'M', 'grid_tile_width': 8, 'wg_dimension': 'M',
      'cluster_dimension': None, 'wgmma_in_flight': 1}),
    ((4096, 4096, 6144),  # 0.980x cuBLAS
     {'tile_m': 64, 'tile_n': 256, 'tile_k': 64, 'max_concurrent_steps': 3, 'epi_tile_m': 64,
      'epi_tile_n': 128, 'grid_minor_dim': 'M', 'grid_tile_width': 8, 'wg_dimension': 'M',
      'cluster_dimension': None, 'wgmma_in_flight': 0}),
    ((4096, 4096, 4096),  # 0.997x cuBLAS
     {'tile_m': 64, 'tile_n': 256, 'tile_k': 64, 'max_concurrent_steps': 3, 'epi_tile_m': 64,
      'epi_tile_n': 128, 'grid_minor_dim': 'M', 'grid_tile_width': 8, 'wg_dimension': 'M',
      'cluster_dimension': None, 'wgmma_in_flight': 0}),
    ((4096, 4096, 28672),  # 0.987x cuBLAS
     {'tile_m': 64, 'tile_n': 256, 'tile_k': 64, 'max_concurrent_steps': 3, 'epi_tile_m': 64,
      'epi_tile_n': 64, 'grid_minor_dim': 'M', 'grid_tile_width': 8, 'wg_dimension': 'M',
      'cluster_dimension': None, 'wgmma_in_flight': 0}),
    ((4096, 14336, 4096),  # 1.014x cuBLAS
     {'tile_m': 64, 'tile_n': 256, 'tile_k': 64, 'max_concurrent_steps': 4, 'epi_tile_m': 64,
      'epi_tile_n': 32, 'grid_minor_dim': 'N', 'grid_tile_width': 8, 'wg_dimension': 'M',
      'cluster_dimension': 'M', 'wgmma_in_flight': 1}),
    ((4096, 2048, 3072),  # 1.001x cuBLAS
     {'tile_m': 64, 'tile_n': 256, 'tile_k': 64, 'max_concurrent_steps': 3, 'epi_tile_m': 64,
      'epi_tile_n': 128, 'grid_minor_dim': 'M', 'grid_tile_width': 8, 'wg_dimension': 'M',
      'cluster_dimension': None, 'wgmma_in_flight': 0}),
    ((4096, 2048, 2048),  # 0.998x cuBLAS
     {'tile_m': 64, 'tile_n': 256, 'tile_k': 64, 'max_concurrent_steps': 3, 'epi_tile_m': 64,
      'epi_tile_n': 128, 'grid_minor_dim': 'M', 'grid_tile_width': 8, 'wg_dimension': 'M',
      'cluster_dimension': None, 'wgmma_in_flight': 0}),
    ((4096, 2048, 16384),  # 1.010x cuBLAS
     {'tile_m': 64, 'tile_n': 256, 'tile_k': 64, 'max_concurrent_steps': 3, 'epi_tile_m': 64,
      'epi_tile_n': 128, 'grid_minor_dim': 'M', 'grid_tile_width': 8, 'wg_dimension': 'M',
      'cluster_dimension': None, 'wgmma_in_flight': 0}),
    ((4096, 8192, 2048),  # 0.975x cuBLAS
     {'tile_m': 64, 'tile_n': 256, 'tile_k': 64, 'max_concurrent_steps': 3, 'epi_tile_m': 64,
      'epi_tile_n': 128, 'grid_minor_dim': 'M', 'grid_tile_width': 8, 'wg_dimension': 'M',
      'cluster_dimension': None, 'wgmma_in_flight': 1}),
    ((4096, 1024, 4096),  # 1.027x cuBLAS
     {'tile_m': 64, 'tile_n': 256, 'tile_k': 64, 'max_concurrent_steps': 3, 'epi_tile_m': 64,
      'epi_tile_n': 128, 'grid_minor_dim': 'M', 'grid_tile_width': 8, 'wg_dimension': 'M',
      'cluster_dimension': None, 'wgmma_in_flight': 0}),
    ((4096, 2048, 1024),  # 0.935x cuBLAS
     {'tile_m': 128, 'tile_n': 128, 'tile_k': 64, 'max_concurrent_steps': 4, 'epi_tile_m': 64,
      'epi_tile_n': 32, 'grid_minor_dim': 'M', 'grid_tile_width': 8, 'wg_dimension': 'N',
      'cluster_dimension': None, 'wgmma_in_flight': 1}),
    ((4096, 1024, 6144),  # 1.048x cuBLAS
     {'tile_m': 64, 'tile_n': 256, 'tile_k': 64, 'max_concurrent_steps': 3, 'epi_tile_m': 64,
      'epi_tile_n': 64, 'grid_minor_dim': 'M', 'grid_tile_width': 8, 'wg_dimension': 'M',
      'cluster_dimension': None, 'wgmma_in_flight': 0}),
    ((4096, 3072, 1024),  # 0.914x cuBLAS
     {'tile_m': 128, 'tile_n': 128, 'tile_k': 64, 'max_concurrent_steps': 4, 'epi_tile_m': 64,
      'epi_tile_n': 32, 'grid_minor_dim': 'M', 'grid_tile_width': 8, 'wg_dimension': 'N',
      'cluster_dimension': None, 'wgmma_in_flight': 0}),
    ((4096, 2560, 6144),  # 1.009x cuBLAS
     {'tile_m': 128, 'tile_n': 128, 'tile_k': 64, 'max_concurrent_steps': 4, 'epi_tile_m': 64,
      'epi_tile_n': 32, 'grid_minor_dim': 'M', 'grid_tile_width': 8, 'wg_dimension': 'N',
      'cluster_dimension': None, 'wgmma_in_flight': 1}),
    ((4096, 4096, 2560),  # 1.052x cuBLAS
     {'tile_m': 128, 'tile_n': 64, 'tile_k': 64, 'max_concurrent_steps': 5, 'epi_tile_m': 64,
      'epi_tile_n': 64, 'grid_minor_dim': 'M', 'grid_tile_width': 4, 'wg_dimension': 'N',
      'cluster_dimension': None, 'wgmma_in_flight': 0}),
    ((4096, 2560, 19456),  # 1.018x cuBLAS
     {'tile_m': 64, 'tile_n': 256, 'tile_k': 64, 'max_concurrent_steps': 3, 'epi_tile_m': 64,
      'epi_tile_n': 128, 'grid_minor_dim': 'M', 'grid_tile_width': 8, 'wg_dimension': 'M',
      'cluster_dimension': None, 'wgmma_in_flight': 0}),
    ((4096, 9728, 2560),  # 1.071x cuBLAS
     {'tile_m': 128, 'tile_n': 64, 'tile_k': 64, 'max_concurrent_steps': 5, 'epi_tile_m': 64,
      'epi_tile_n': 64, 'grid_minor_dim': 'M', 'grid_tile_width': 4, 'wg_dimension': 'N',
      'cluster_dimension': None, 'wgmma_in_flight': 0}),
    ((4096, 1152, 1536),  # 0.863x cuBLAS
     {'tile_m': 128, 'tile_n': 64, 'tile_k': 64, 'max_concurrent_steps': 5, 'epi_tile_m': 64,
      'epi_tile_n': 64, 'grid_minor_dim': 'M', 'grid_tile_width': 4, 'wg_dimension': 'N',
      'cluster_dimension': None, 'wgmma_in_flight': 0, 'pingpong': False}),
    ((2048, 1152, 1536),  # 0.959x cuBLAS
     {'tile_m': 64, 'tile_n': 256, 'tile_k': 64, 'max_concurrent_steps': 3, 'epi_tile_m': 64,
      'epi_tile_n': 64, 'grid_minor_dim': 'N', 'grid_tile_width': 8, 'wg_dimension': 'M',
      'cluster_dimension': None, 'wgmma_in_flight': 0, 'pingpong': False}),
)
