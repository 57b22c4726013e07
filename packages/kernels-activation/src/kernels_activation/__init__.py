"""kernels-activation: gated activations (SiLU/GELU and-mul) and relu2 for LLM inference.

Importing this package registers metadata only (no torch, no compilation); each op loads on
first attribute access::

    import kernels_activation
    y = kernels_activation.silu_and_mul(x)        # x [..., 2d] -> y [..., d]
"""

from kernels_activation.version import __version__
from kernels_jit.registry import Backend, OpSpec, lazy_attributes, register_group

_FLOATS = ("float32", "float16", "bfloat16")
_MODULE = "kernels_activation.activation"


def _op(name: str, description: str, samples: str) -> OpSpec:
    return OpSpec(
        group="activation",
        name=name,
        public=f"{_MODULE}:{name}",
        description=description,
        samples=f"{_MODULE}:{samples}",
        dtypes=_FLOATS,
        backends=(
            Backend(
                "cuda",
                f"{_MODULE}:_{name}_cuda",
                devices=("cuda",),
                dtypes=_FLOATS,
                eligible=f"{_MODULE}:_row_layout",
                description="CUDA C++ via kernels-jit: 16-byte packs, flat grid over all rows",
            ),
            Backend(
                "torch",
                f"{_MODULE}:_{name}_torch",
                devices=("cpu", "cuda"),
                description="pure-torch reference",
            ),
        ),
    )


OPS = register_group(
    "activation",
    [
        _op(
            "silu_and_mul",
            "silu(x[..., :d]) * x[..., d:], x [..., 2d] -> [..., d]",
            "samples_gated",
        ),
        _op(
            "gelu_and_mul", "gelu(x[..., :d]) * x[..., d:] with the exact erf GELU", "samples_gated"
        ),
        _op(
            "gelu_tanh_and_mul",
            "gelu(x[..., :d]) * x[..., d:] with the tanh-approximated GELU",
            "samples_gated",
        ),
        _op("relu2", "relu(x)^2, same shape (in place with out=x)", "samples_relu2"),
    ],
)

__all__ = ["OPS", "__version__", "gelu_and_mul", "gelu_tanh_and_mul", "relu2", "silu_and_mul"]
__getattr__ = lazy_attributes(__name__, OPS)
