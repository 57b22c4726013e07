"""The op file of kernels-activation: ``activation.py`` holds the four ops, which share one
compiled module and one public-function shape."""
