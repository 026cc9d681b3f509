"""The compiled CPU kernel: the vector field translated to C++, run through ``jax.ffi``.

The record (lanes refilled as trajectories finish), the replay and its exact discrete
adjoint share one generated source per vector field, solver and dtype
(`gradsolve.drivers.kernel.source`; for Rosenbrock methods
`gradsolve.drivers.kernel.rosenbrock_source` and the dense linear algebra of
`gradsolve.drivers.kernel.linalg`), compiled once with the system compiler and cached on
disk (`gradsolve.drivers.kernel.build`). Layout: ``driver`` (the `Kernel` driver: where it
applies, the FFI calls as JAX functions), ``codegen`` (the C++ backend of the shared jaxpr
translator), ``source`` (the kernel's C++), ``build`` (compile, cache, register, and
background builds).
"""

from .driver import Kernel, KernelBuild, kernel_allowed, kernel_target

__all__ = ["Kernel", "KernelBuild", "kernel_allowed", "kernel_target"]
