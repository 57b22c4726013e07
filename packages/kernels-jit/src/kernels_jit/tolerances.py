"""How close a backend must be to the torch reference, per output dtype (tests and `check`).

(atol, rtol, max relative L2 error). Half types round each output once, so one ulp of the largest
values bounds the error: bf16 keeps 8 significant bits, fp16 11, fp8 e4m3 4.
"""

from __future__ import annotations

TOLERANCES: dict[str, tuple[float, float, float]] = {
    "float64": (1e-10, 1e-10, 1e-10),
    "float32": (1e-5, 1e-5, 1e-5),
    "float16": (1e-3, 1e-3, 1e-3),
    "bfloat16": (1.6e-2, 1.6e-2, 8e-3),
    "float8_e4m3fn": (0.0, 0.13, 0.07),
}
