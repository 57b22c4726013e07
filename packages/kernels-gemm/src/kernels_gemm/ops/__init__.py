"""The op files of kernels-gemm, one per op (declared in the group's __init__)."""
