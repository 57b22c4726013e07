"""The op files of kernels-diffusion, one per op (declared in the group's __init__)."""
