"""The op files of kernels-mamba: causal conv1d (prefill, decode), the SSM state update."""
