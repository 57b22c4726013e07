"""The op files of kernels-communication, one per op (declared in the group's __init__)."""
