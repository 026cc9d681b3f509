"""Count the walks from a public call to a solver step.

A walk is the chain of calls a reader follows from the public function down to the place
where one solver step runs (the solver's ``step``, or for the compiled kernel the FFI call
that runs its steps): the Python call stack at the first such point, restricted to this
project's packages (``gradsolve``, ``inference``, ``models``). Reported per walk: the files
and functions on that stack, and the returns to a file already left (a file that appears
on the stack again after another file came between).

    python tools/walks.py [-v] [name ...]   # the walks (-v: with their frames)
    python tools/walks.py --imports          # the import graph of inference/

The calls run on fresh processes' first calls (Python traces the whole way then; a later
call of a compiled function would skip it). A walk's setup (a fit before a profile, a
PEtab problem's import) runs untraced.

``--imports`` lists, from the source alone (``ast``), every import between modules of
``inference/`` (marking those made inside a function), the edges between its folders,
the import cycles (between modules and between folders), the private names (a leading
underscore) one folder imports from another, and any import of the PEtab importer
(``petab/``) by a folder of generic methods.
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
    return lambda: inference.fit(m, data, steps=2, progress=False)


def _boehm():
    import models
    return models.load_petab("Boehm_JProteomeRes2014")


def _fit_petab():
    import inference
    problem = _boehm()
    return lambda: inference.fit(problem, n_starts=2, steps=2, progress=False)


def _sample_petab():
    import inference
    problem = _boehm()
    full = getattr(problem, "full", problem)  # the sampler's sites: every parameter
    init = dict(zip(full.parameter_ids, full.nominal))
    return lambda: inference.sample(problem, num_warmup=2, num_samples=2, num_chains=1,
                                    init=init, progress=False)


def _profile_model():
    import inference
    import models
    m = models.lotka_volterra()
    data = models.load_dataset("lynx_hare")
    res = inference.fit(m, data, steps=2, progress=False)
    return lambda: inference.profile(m, res, data, parameters=["alpha"], max_steps=1,
                                     max_restarts=0, progress=False)


def _fit_population():
    import inference
    import models
    m, data = models.theophylline(), models.load_dataset("theophylline")
    return lambda: inference.fit_population(m, data, max_iterations=1, progress=False)


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
    return lambda: inference.sample(program, {"ts": ts, "obs": jnp.exp(-0.8 * ts)},
                                    num_warmup=10, num_samples=10, num_chains=1,
                                    progress=False)


WALKS = {"gs.solve": lambda: _solve, "inference.fit": _fit,
         "inference.sample(program)": _sample, "inference.fit(PEtab problem)": _fit_petab,
         "inference.sample(PEtab problem)": _sample_petab,
         "inference.profile(ODEModel)": _profile_model,
         "inference.fit_population": _fit_population}
"""Each walk: a setup (untraced) that returns the call to trace."""


def imports(root: str = ROOT) -> dict:
    """The imports between modules of ``inference/``, from the source (``ast``): a dict
    with ``edges`` (``(from, to, lazy, names)``: module paths relative to ``inference/``,
    ``lazy`` where the import sits inside a function), ``folders`` (folder -> folders it
    imports), ``cycles`` (module cycles, all imports counted), ``folder_cycles`` and
    ``private`` (``(from, to, name)`` where a folder imports a leading-underscore name
    from another folder) and ``importer`` (``(from, to)`` where a folder of `GENERIC`
    imports ``petab/``)."""
    import ast

    base = os.path.join(root, "inference")
    mods = {}
    for dirpath, _, files in os.walk(base):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(dirpath, f)
                rel = os.path.relpath(path, base)[:-3].replace(os.sep, ".")
                mods[rel.removesuffix(".__init__") if rel != "__init__" else ""] = path
    edges = []
    for mod, path in sorted(mods.items()):
        tree = ast.parse(open(path).read())
        pkg = mod.split(".") if path.endswith("__init__.py") else mod.split(".")[:-1]
        pkg = [p for p in pkg if p]

        def visit(node, lazy):
            for child in ast.iter_child_nodes(node):
                inner = lazy or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
                if isinstance(child, ast.ImportFrom) and child.level > 0:
                    up = pkg[: len(pkg) - (child.level - 1)] if child.level > 1 else pkg
                    target = ".".join(up + ([child.module] if child.module else []))
                    names = [a.name for a in child.names]
                    if child.module is None or target not in mods:  # `from .. import _x`
                        for n in names:
                            sub = ".".join([target, n]) if target else n
                            if sub in mods:
                                edges.append((mod, sub, lazy, []))
                        continue
                    edges.append((mod, target, lazy, names))
                visit(child, inner)

        visit(tree, False)
    folder = lambda m: m.split(".")[0] if "." in m else "(top)"  # noqa: E731
    folders = {}
    private = []
    for a, b, lazy, names in edges:
        fa, fb = folder(a), folder(b)
        if fa != fb and "(top)" not in (fa, fb):
            folders.setdefault(fa, set()).add(fb)
            private += [(a, b, n) for n in names if n.startswith("_")]
    graph = {}
    for a, b, _, _ in edges:
        graph.setdefault(a, set()).add(b)
    importer = sorted({(a, b) for a, b, _, _ in edges
                       if folder(b) == "petab" and folder(a) in GENERIC})
    return dict(edges=edges, folders=folders, cycles=_cycles(graph),
                folder_cycles=_cycles(folders), private=private, importer=importer)


GENERIC = ("optimize", "sampling", "population", "profiles")
"""The folders of generic methods: they reach an importer's problems (``petab/``) only
through ``problem_of``, never by importing the importer."""


def _cycles(graph: dict) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in list(graph):
        if v not in index:
            strong(v)
    return out


def print_imports() -> None:
    g = imports()
    print("inference/ folders -> the folders they import (shared top-level modules left out):")
    for f in sorted(g["folders"]):
        print(f"    {f} -> {', '.join(sorted(g['folders'][f]))}")
    print("module imports (lazy: inside a function):")
    for a, b, lazy in sorted({(a, b, lazy) for a, b, lazy, _ in g["edges"]}):
        print(f"    {a or '__init__'} -> {b}{' (lazy)' if lazy else ''}")
    print(f"module cycles: {g['cycles'] or 'none'}")
    print(f"folder cycles: {g['folder_cycles'] or 'none'}")
    print("private names imported across folders: "
          + (", ".join(f"{a} <- {b}.{n}" for a, b, n in g["private"]) or "none"))
    print(f"generic folders ({', '.join(GENERIC)}) importing petab/: "
          + (", ".join(f"{a} -> {b}" for a, b in g["importer"]) or "none"))


def main(argv):
    if "--imports" in argv:
        print_imports()
        return
    verbose = "-v" in argv
    names = [a for a in argv if a != "-v"] or list(WALKS)
    for name in names:
        try:
            call = WALKS[name]()
            stack = walk(call)[0]
        except Exception as e:  # a walk the code refuses is reported, not a crash
            print(f"{name}: refused ({type(e).__name__}: {str(e)[:200]})")
            continue
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
