"""Measured GEMM configs per (M, K, N), written by `python -m bench.gemm_sweep --write-table`.

`gemm_config.default_config` takes the entry nearest a prefill shape (M > 64) in log2
space, within `gemm_config.TABLE_RADIUS_LOG2`, on a GPU with PROVENANCE's SM count; the
modelled pick elsewhere and while the table is empty. Regenerate rather than edit.
"""

# The sweep: command, UTC date, GPU, its SM count, commit.
PROVENANCE: dict[str, str | int | None] = {
    'command': 'python -m bench.gemm_sweep --out /root/out/sweep --budget-s 400',
    'date': '2026-12-01T15:13:10+00:00',
    'device': 'NVIDIA H200',
    'sms': 132,
    'commit': '6d23f88',
}

# ((M, K, N), TuningConfig fields): each shape's fastest config in the sweep.
ENTRIES: tuple[tuple[tuple[int, int, int], dict[str, int | str]], ...] = (
    ((8192, 4096, 6144),  # 1.012x cuBLAS
     {'tile_m': 64, 'tile_n': 256, 'tile_k': 64, 'max_concurrent_steps': 3, 'epi_tile_m': 64,
      'epi_tile_n': 128, 'grid_minor_dim': 'M', 'grid_tile_width': 8, 'wg_dimension': 'M',
      'cluster_dimension': None}),
    ((8192, 4096, 4096),  # 0.995x cuBLAS
     {'tile_m': 64, 'tile_n': 256, 'tile_k': 64, 'max_concurrent_steps': 3, 'epi_tile_m': 64,
      'epi_tile_n': 128, 'grid_minor_dim': 'M', 'grid_tile_width': 8, 'wg_dimension': 'M',
      'cluster_dimension': None}),
    ((8192, 4096, 28672),  # 0.887x cuBLAS
     {'tile_m': 64, 'tile_n': 256, 'tile_k': 64, 'max_concurrent_steps': 3, 'epi_tile_m': 64,
      'epi_tile_n': 64, 'grid_minor_dim': 'M', 'grid_tile_width': 8, 'wg_dimension': 'M',
      'cluster_dimension': None}),
    ((8192, 14336, 4096),  # 0.951x cuBLAS
     {'tile_m': 64, 'tile_n': 256, 'tile_k': 64, 'max_concurrent_steps': 4, 'epi_tile_m': 64,
      'epi_tile_n': 32, 'grid_minor_dim': 'N', 'grid_tile_width': 8, 'wg_dimension': 'M',
      'cluster_dimension': 'M'}),
    ((8192, 2048, 3072),  # 1.002x cuBLAS
     {'tile_m': 64, 'tile_n': 256, 'tile_k': 64, 'max_concurrent_steps': 3, 'epi_tile_m': 64,
      'epi_tile_n': 128, 'grid_minor_dim': 'M', 'grid_tile_width': 8, 'wg_dimension': 'M',
      'cluster_dimension': None}),
    ((8192, 2048, 2048),  # 1.001x cuBLAS
     {'tile_m': 64, 'tile_n': 256, 'tile_k': 64, 'max_concurrent_steps': 3, 'epi_tile_m': 64,
      'epi_tile_n': 128, 'grid_minor_dim': 'M', 'grid_tile_width': 8, 'wg_dimension': 'M',
      'cluster_dimension': None}),
    ((8192, 2048, 16384),  # 1.018x cuBLAS
     {'tile_m': 64, 'tile_n': 256, 'tile_k': 64, 'max_concurrent_steps': 3, 'epi_tile_m': 64,
      'epi_tile_n': 128, 'grid_minor_dim': 'M', 'grid_tile_width': 8, 'wg_dimension': 'M',
      'cluster_dimension': None}),
    ((8192, 8192, 2048),  # 0.972x cuBLAS
     {'tile_m': 64, 'tile_n': 256, 'tile_k': 64, 'max_concurrent_steps': 3, 'epi_tile_m': 64,
      'epi_tile_n': 128, 'grid_minor_dim': 'M', 'grid_tile_width': 8, 'wg_dimension': 'M',
      'cluster_dimension': None}),
    ((8192, 1024, 4096),  # 1.027x cuBLAS
     {'tile_m': 64, 'tile_n': 256, 'tile_k': 64, 'max_concurrent_steps': 3, 'epi_tile_m': 64,
      'epi_tile_n': 128, 'grid_minor_dim': 'M', 'grid_tile_width': 8, 'wg_dimension': 'M',
      'cluster_dimension': None}),
    ((8192, 2048, 1024),  # 1.018x cuBLAS
     {'tile_m': 128, 'tile_n': 128, 'tile_k': 64, 'max_concurrent_steps': 4, 'epi_tile_m': 64,
      'epi_tile_n': 32, 'grid_minor_dim': 'M', 'grid_tile_width': 8, 'wg_dimension': 'N',
      'cluster_dimension': None}),
)
