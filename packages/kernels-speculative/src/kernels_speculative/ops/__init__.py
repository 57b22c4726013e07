"""The op files of kernels-speculative: one per op (draft verification, mask bit packing)."""
