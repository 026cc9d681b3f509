"""Count the walks from a public call to a solver step.

A walk is the chain of calls a reader follows from the public function down to the place
where one solver step runs (the solver's ``step``, or for the compiled kernel the FFI call
that runs its steps): the Python call stack at the first such point, restricted to this
project's packages (``gradsolve``, ``inference``, ``models``). Reported per walk: the files
and functions on that stack, and the returns to a file already left (a file that appears
on the stack again after another file came between).

    python tools/walks.py [-v] [name]   # the three walks (-v: with their frames)

The calls run on fresh processes' first calls (Python traces the whole way then; a later
call of a compiled function would skip it).
"""

from __future__ import annotations

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = tuple(os.path.join(ROOT, p) + os.sep for p in ("gradsolve", "inference", "models"))


class Found(Exception):
    pass


def _ours(code) -> bool:
    return code.co_filename.startswith(PACKAGES)


def _is_step(frame) -> bool:
    code = frame.f_code
    if not _ours(code):
        return False
    if code.co_name == "step" and os.sep + "_solver" + os.sep in code.co_filename:
        return True
    return False


def walk(call):
    """Run ``call()`` and return the project frames on the stack at every solver step
    (or kernel FFI call) it reaches, outermost first, as ``(relative file, function)``:
    the distinct stacks, longest first."""
    hit = []

    def profile(frame, event, arg):
        stop = event == "call" and _is_step(frame)
        if event == "c_call" or event == "call":
            name = getattr(arg, "__name__", "") if event == "c_call" else frame.f_code.co_name
            if event == "call" and name == "ffi_call" and frame.f_back is not None and \
                    _ours(frame.f_back.f_code):
                stop = True
        if stop:
            f = frame if _ours(frame.f_code) else frame.f_back
            stack = []
            while f is not None:
                if _ours(f.f_code):
                    stack.append((os.path.relpath(f.f_code.co_filename, ROOT), f.f_code.co_name))
                f = f.f_back
            stack = stack[::-1]
            if stack not in hit:
                hit.append(stack)

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    if not hit:
        raise RuntimeError("no solver step was reached")
    return sorted(hit, key=lambda s: (-summary(s)[0], -len(s)))


def summary(stack):
    files, returns, seen, last = [], 0, set(), None
    for file, _ in stack:
        if file != last:
            if file in seen:
                returns += 1
            seen.add(file)
            files.append(file)
            last = file
    return len(seen), len(stack), returns


def _solve():
    import jax
    import jax.numpy as jnp
    import gradsolve as gs

    def f(t, y, p):
        return -p["k"] * y

    def loss(k):
        params = {"k": k}
        return gs.solve(f, 0.0, 5.0, jnp.ones((4, 1)), params, ts=jnp.linspace(0.0, 5.0, 6),
                        jumps=(jnp.array([1.0, 2.0]), jnp.ones((2, 1))),
                        driver=gs.drivers.Kernel()).ys.sum()

    jax.grad(loss)(jnp.linspace(0.5, 1.0, 4))


def _fit():
    import inference
    import models
    m = models.lotka_volterra()
    data = models.load_dataset("lynx_hare")
    inference.fit(m, data, steps=2, progress=False)


def _sample():
    import jax.numpy as jnp
    import numpyro
    import numpyro.distributions as dist
    import inference

    def f(t, y, p):
        return -p["k"] * y

    def program(data):
        ts, obs = data["ts"], data["obs"]
        k = numpyro.sample("k", dist.LogNormal(0.0, 0.5))
        params = {"k": k}
        ys = inference.ode("y", f, 0.0, 4.0, jnp.ones(1), params, ts=ts)
        numpyro.sample("obs", dist.Normal(ys.ys[:, 0], 0.05), obs=obs)

    ts = jnp.linspace(0.5, 4.0, 8)
    inference.sample(program, {"ts": ts, "obs": jnp.exp(-0.8 * ts)}, num_warmup=10,
                     num_samples=10, num_chains=1, progress=False)


WALKS = {"gs.solve": _solve, "inference.fit": _fit, "inference.sample(program)": _sample}


def main(argv):
    verbose = "-v" in argv
    names = [a for a in argv if a != "-v"] or list(WALKS)
    for name in names:
        stack = walk(WALKS[name])[0]
        n_files, n_funcs, returns = summary(stack)
        print(f"{name}, the call stack at a solver step: {n_files} files, {n_funcs} "
              f"functions, {returns} returns to a file already left")
        if verbose:
            for file, fn in stack:
                print(f"    {file}:{fn}")




if __name__ == "__main__":
    import jax
    jax.config.update("jax_enable_x64", True)
    main(sys.argv[1:])
