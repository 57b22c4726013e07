"""The op files of kernels-grammar, one per op (declared in the group's __init__)."""
