"""The op files of kernels-kv-canary: ``kv_canary_write`` and ``kv_canary_verify``."""
