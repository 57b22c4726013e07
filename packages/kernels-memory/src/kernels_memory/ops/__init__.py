"""The op files of kernels-memory: KV slot allocation, request-to-token tables, block copies."""
