"""The op files of kernels-sampling: one per op (top-k/top-p/min-p filtering, seeded sampling)."""
