"""``python -m kernels_jit``: the ``kernels-jit`` command (doctor, list, AOT build)."""

import sys

from kernels_jit.cli import main

sys.exit(main())
