"""verify: float64 references, the error model, hypothesis strategies and properties.

`check_op(op, impl, **inputs)` / `check_grad(op, impl, **inputs)` judge one
call of a jaxnorm op; `python -m verify` runs them all and prints a report.
"""

from verify.checks import OPS, check_grad, check_op

__all__ = ["OPS", "check_grad", "check_op"]
