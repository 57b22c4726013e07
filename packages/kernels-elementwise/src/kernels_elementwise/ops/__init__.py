"""The op files of kernels-elementwise: one per op, each read top to bottom (module declarations,
backends, the :class:`~kernels_jit.dispatch.Op`, the public function, samples)."""
