"""The op files of kernels-quantization: FP8/INT8 quantization, the Hadamard rotation."""
