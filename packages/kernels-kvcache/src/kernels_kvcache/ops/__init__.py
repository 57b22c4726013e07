"""The op files of kernels-kvcache, one per op (declared in the group's __init__)."""
