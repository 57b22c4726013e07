"""The Triton kernels of kernels-attention (imported lazily by the op files: the package imports
without triton)."""
