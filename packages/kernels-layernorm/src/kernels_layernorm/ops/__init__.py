"""The op files of kernels-layernorm: ``rmsnorm.py`` (the RMSNorm family: plain, Gemma, fused
add), ``qk_rmsnorm.py`` and ``layernorm.py``."""
