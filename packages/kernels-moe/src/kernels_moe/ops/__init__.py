"""The op files of kernels-moe: one per op (routing, token alignment, top-k reduction)."""
