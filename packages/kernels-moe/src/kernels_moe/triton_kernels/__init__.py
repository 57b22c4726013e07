"""Triton kernels of kernels-moe (the Triton counterparts of ``csrc/``); imported lazily by the
op files, so the package imports without triton."""
