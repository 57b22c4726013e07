"""The op files of kernels-attention, one per op (declared in the group's __init__)."""
