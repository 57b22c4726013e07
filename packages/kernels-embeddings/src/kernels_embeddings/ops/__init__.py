"""The op files of kernels-embeddings, one per op (declared in the group's __init__)."""
