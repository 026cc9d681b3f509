"""Build time of the Rosenbrock kernel (Rodas5P, loop form) against the number of states
and the Jacobian's structural nonzeros.

For each model the kernel's C++ is generated (``generate``: the model's functions
translated, the step's templates filled in) and its three eager parts (replay, adjoint,
record) compiled as a first use compiles them (`gradsolve.drivers.kernel.build`: one
compiler per CPU, the parts grouped as on this machine), into an empty cache folder.
Printed per model: states, nonzeros, the source's size, the generation's seconds (wall and
CPU), the compile's wall seconds, the compilers' CPU seconds (user + system of the compiler
processes: on a loaded machine the wall time grows, the CPU time does not; with a core
per compiler group, the compile's wall time on a quiet machine is about the largest
group's CPU time, a little over half the total with two).

Models: a synthetic chain of ``d`` states (``y_i' = k_{i-1} y_{i-1} / (1 + y_{i-1}) -
k_i y_i``, the first fed by the last: ``2 d`` nonzeros) at d = 8, 25, 50, 100, and the
Boehm PEtab problem's vector field (8 states) where the ``[petab]`` extra loads it.

Usage: ``python benchmarks/bench_kernel_build.py [--states 8,25,50,100] [--no-boehm]``.
"""

from __future__ import annotations

import argparse
import resource
import tempfile
import time
from pathlib import Path

import jax

jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402

import gradsolve as gs  # noqa: E402
from gradsolve._flat import flat_field, flatten_spec  # noqa: E402
from gradsolve.drivers.kernel import build  # noqa: E402
from gradsolve.drivers.kernel.rosenbrock_source import LoopRosenbrockSource  # noqa: E402
from gradsolve.drivers.kernel.source import generate  # noqa: E402


def chain(t, y, k):
    prev = jnp.roll(y, 1)
    return k[:-1] * prev / (1.0 + prev) - k[1:] * y


def chain_problem(d: int):
    return f"chain-{d}", chain, jnp.ones((2, d)), jnp.ones((2, d + 1))


def boehm_problem():
    try:
        import models

        root = Path(__file__).resolve().parents[1] / "tests" / "data" / "petab"
        problem = models.load_petab(root / "Boehm_JProteomeRes2014", hierarchical=False)
    except Exception as e:  # noqa: BLE001 - optional
        print(f"Boehm: not loaded ({type(e).__name__}: {e})")
        return None
    y0, p, _, _ = problem._inputs(jnp.asarray(problem.nominal))
    return "boehm", problem.vector_field, y0, p


def _cpu_children() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def measure(name, f, y0, p, solver) -> dict:
    _, treedef, shapes, dtypes = flatten_spec(p)
    f_flat, p_size = flat_field(f, treedef, shapes, dtypes)
    d = y0.shape[1]
    t, c = time.perf_counter(), time.process_time()
    source = generate(f_flat, d, p_size, y0.dtype, solver)
    gen_s, gen_cpu = time.perf_counter() - t, time.process_time() - c
    src = LoopRosenbrockSource(f_flat, d, p_size, y0.dtype, solver)
    src._model()
    nnz = len(src.rows)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        key = build._key(source, build.compiler())
        todo = build._groups(build._EAGER_PARTS)
        paths = {g: build._path(folder, key, g) for g in todo}
        cpu = _cpu_children()
        t = time.perf_counter()
        build._compile_all(build.compiler(), source, paths, todo, name, folder)
        wall = time.perf_counter() - t
        cpu = _cpu_children() - cpu
    row = dict(model=name, states=d, nnz=nnz, mb=len(source) / 1e6, gen_s=gen_s,
               gen_cpu=gen_cpu, wall_s=wall, cpu_s=cpu)
    print(f"| {name} | {d} | {nnz} | {row['mb']:.2f} | {gen_s:.1f} ({gen_cpu:.1f}) | "
          f"{wall:.1f} | {cpu:.1f} |", flush=True)
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--states", default="8,25,50,100")
    ap.add_argument("--no-boehm", action="store_true")
    ap.add_argument("--solver", default="Rodas5P")
    args = ap.parse_args()
    solver = getattr(gs, args.solver)()
    print(f"{args.solver}, {build.usable_cpus()} CPUs, compiler groups "
          f"{build._groups(build._EAGER_PARTS)}")
    print("| model | states | nonzeros | source MB | generate s (CPU) | compile wall s | "
          "compile CPU s |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    cases = [] if args.no_boehm else [boehm_problem()]
    cases += [chain_problem(int(s)) for s in args.states.split(",")]
    for case in cases:
        if case is not None:
            measure(*case, solver)


if __name__ == "__main__":
    main()
