"""The op files of kernels-lplb, one per op (declared in the group's __init__)."""
