import sys

from kernels_ops.cli import main

sys.exit(main())
