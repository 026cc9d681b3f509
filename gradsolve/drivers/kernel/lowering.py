"""The kernel's FFI calls lowered with their attributes where XLA cannot lose them.

`jax.ffi.ffi_call` lowers a typed FFI call as a StableHLO ``custom_call`` with
``api_version = 1`` and its attributes in the discardable ``mhlo.backend_config``
dictionary; XLA's conversion to HLO reads that dictionary as "typed FFI". In large
programs (a population fit's objective: its gradient and the conditional modes'
implicit derivative, eleven kernel calls in one module) XLA's passes rebuilt some of those
calls without the discardable attribute, and they ran as *untyped* custom calls that no
handler serves ("No registered implementation for untyped custom call to
gradsolve_…_fwd"; jax 0.10.2, measured). The fix is to state what the call is in the op's
own attributes: ``api_version = 4`` (typed FFI) and ``backend_config`` the dictionary,
which StableHLO allows for that version. `install` wraps the lowering of JAX's ``ffi_call``
primitive to do this for the kernel's targets (``gradsolve_*``) only; every other call
lowers as JAX lowers it.
"""

from __future__ import annotations

from jax._src.ffi import ffi_call_p
from jax._src.interpreters import mlir
from jax._src.lib.mlir import ir

_PREFIX = "gradsolve_"
_installed = False


def _typed(rule):
    def lowering(ctx, *operands, target_name: str, **params):
        outs = rule(ctx, *operands, target_name=target_name, **params)
        if target_name.startswith(_PREFIX):
            flat = [v for out in outs for v in (out if isinstance(out, (list, tuple))
                                                  else (out,))]
            if flat:
                op = flat[0].owner
                attrs = getattr(op, "operation", op).attributes
                if "mhlo.backend_config" in attrs:
                    attrs["backend_config"] = attrs["mhlo.backend_config"]
                    del attrs["mhlo.backend_config"]
                    attrs["api_version"] = ir.IntegerAttr.get(
                        ir.IntegerType.get_signless(32), 4)
        return outs
    return lowering


def install() -> None:
    """Lower the kernel's FFI calls as typed FFI in the op's own attributes (idempotent)."""
    global _installed
    if _installed:
        return
    entry = mlir._lowerings[ffi_call_p]
    mlir.register_lowering(ffi_call_p, _typed(entry.rule), inline=entry.inline)
    _installed = True
