"""The chains of `inference.sample`: NumPyro's NUTS/HMC kernel on the replay potential,
vectorised over chains (`ChainKernel`, the `NUTS` and `HMC` samplers' kernel; ChEES's,
``_ensemble.py``, has the same interface), and what a sampler carries: its `SampleState` (what the next
step needs) and `SampleInfo` (what the run reports).

The potential of a chain at unconstrained ``u (D,)`` is ``U(u) = -(log prior + log |dx/du|
+ log likelihood)``, from `AbstractProblem.log_density` on the chain's mesh (or an adaptive solve
under ``rerecord="always"``). NumPyro's own kernel (``numpyro.infer.hmc.hmc(
potential_fn_gen=...)``, with its dual-averaging step size and Welford mass-matrix
adaptation) runs on it; the chains are vectorised with ``jax.vmap`` (NumPyro's
``chain_method="vectorized"``), the mesh being the kernel's model argument, so one
compiled loop serves warmup and sampling alike.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Bool, Float, Int

import gradsolve as gs

from ..problem._policy import MeshPolicy
from ..problem._abstract import AbstractProblem

__all__ = ["SampleState", "SampleInfo", "Draws", "ChainKernel", "CHUNK", "spaced",
           "chain_devices"]

CHUNK = 100  # iterations per compiled loop call (the length of its draw buffers)


class Draws(NamedTuple):
    """What one loop call keeps of its iterations, per chain ``C`` and iteration ``n``
    (``step_size``: the one each transition used)."""

    z: Float[np.ndarray, "C n D"]
    diverging: Bool[np.ndarray, "C n"]
    num_steps: Int[np.ndarray, "C n"]
    step_size: Float[np.ndarray, "C n"]
    energy: Float[np.ndarray, "C n"]
    potential_energy: Float[np.ndarray, "C n"]
    accept_prob: Float[np.ndarray, "C n"]


class SampleState(NamedTuple):
    """What the sampler's next step needs, and nothing else: the chains, their mesh, where
    the run is, and what warmup has adapted. Its companion `SampleInfo` holds what the
    run reports; a checkpoint holds both.

    Attributes:
        chains: NumPyro's ``HMCState`` of the ``C`` chains (leaves with a leading axis;
            its ``adapt_state`` holds the adapted step sizes and mass matrices).
        mesh: the host mesh: one row per chain while warmup re-records, or one mesh shared
            by all chains (under ``rerecord="always"`` the potential solves and ignores it).
        capacity: the step capacity of the meshes inside the compiled loop.
        solve_max_steps: step capacity of ``gs.solve`` under ``rerecord="always"``.
        ragged: the potential's replay costs each trajectory's own steps (the compiled
            kernel), so `capacity` leaves the meshes room to grow.
        iteration: iterations done, warmup and sampling; window: warmup windows done.
        target_accept: the NUTS/HMC target acceptance probability in use (raised by the
            warmup's response to divergences); retunes: re-adaptations of the step size
            made (the chains then run the re-adapting kernel, diagonal metric, at
            ``target_accept``).
        sampling_tol_factor: the sampling mesh was recorded at this times
            ``rtol``/``atol`` (the policy's ``record_tol_factor``, or tighter where that
            mesh did not hold at warmup's last draws).
        mesh_probes: how many times the sampling draws sent the sampling mesh back to be
            re-recorded where it did not hold.

    Example:
        >>> inference.sample(model, data, checkpoint="run.pkl")
        >>> with open("run.pkl", "rb") as fh:
        ...     state = pickle.load(fh).state         # a SampleState
        >>> state.iteration, state.chains.z.shape      # 1500, (2, D)
    """

    chains: Any
    mesh: gs.Mesh
    capacity: int
    solve_max_steps: int
    ragged: bool
    iteration: int
    window: int
    target_accept: float
    retunes: int
    sampling_tol_factor: float
    mesh_probes: int


class SampleInfo(NamedTuple):
    """What a sampler run accumulates and reports (``idata``'s attributes), beside its
    `SampleState`.

    Attributes:
        draws: the sampling phase's `Draws`, one per loop call.
        init: how the chains' starting points were chosen (words); init_fit: the MAP
            fit's summary (``init="map"``; with ``init="advi"`` also the variational fit's,
            keys ``advi_*``).
        n_records, record_failures, failures_warmup, failures_sampling: counters.
        warmup_time, sampling_time: seconds.
        sampling_mesh: which mesh the sampling phase uses (words).
        late_steps: ``(chain, step size used)`` of each divergent transition in the late
            iterations of warmup (only those near the final step size count, see the
            warmup's ``counted_late``).
        adaptations: one ``(target_accept, late divergences)`` pair per finished
            step-size adaptation: the warmup's, then each re-adaptation in response.
        tail_draws: positions ``(C, n, D)`` of the warmup windows of warmup's second half
            (and of sampling draws dropped because they left the mesh), one array each,
            kept under ``rerecord="warmup"``: where the posterior's tails are judged from
            when the sampling mesh is frozen.
        error_ratios: the frozen mesh's error ratios ``(C, n)`` (requested units) at each
            of ``draws``' draws (empty where every evaluation solves adaptively).

    Example:
        >>> inference.sample(model, data, checkpoint="run.pkl")
        >>> with open("run.pkl", "rb") as fh:
        ...     info = pickle.load(fh).info           # a SampleInfo
        >>> info.adaptations                           # ((0.8, 0),): no re-adaptation
    """

    draws: tuple
    init: str
    init_fit: dict
    sampling_mesh: str
    n_records: int = 1
    record_failures: int = 0
    failures_warmup: int = 0
    failures_sampling: int = 0
    warmup_time: float = 0.0
    sampling_time: float = 0.0
    late_steps: tuple = ()
    adaptations: tuple = ()
    tail_draws: tuple = ()
    error_ratios: tuple = ()


def spaced(n: int, per: int) -> np.ndarray:
    """Up to ``per`` (at least one) evenly spaced indices of ``n`` draws, first and last
    included."""
    return np.unique(np.linspace(0, n - 1, max(1, min(n, per))).round().astype(int))


def capacity(need: int, ragged: bool = False) -> int:
    """Static step capacity of the meshes inside the sampler; a mesh that needs more
    raises it, which compiles the sampler's loop again (~3-4 s).

    On an XLA replay under vectorised chains (``vmap``) every slot is a step, so the
    capacity is kept close to the steps needed: ~15% headroom over ``need``, a multiple of
    16. Where the replay is ``ragged`` (the compiled kernel: each trajectory takes its own
    steps, the slots past them are free) it is room for 4x ``need``, a power of two, at
    least 64, so that the sampling mesh (merged from several records and recorded tighter
    than warmup's) fits the program warmup compiled."""
    if ragged:
        return max(64, 1 << max(0, 4 * int(need) - 1).bit_length())
    return int(16 * math.ceil((1.15 * need + 8) / 16))


def solve_capacity(need: int) -> int:
    """Step capacity of the in-potential ``gs.solve`` (``rerecord="always"``): room for
    1.5x the steps needed at the starting points, a power of two, at least 32."""
    return max(32, 1 << max(0, int(math.ceil(1.5 * need + 16)) - 1).bit_length())


class _FailureCounter:
    """Host-side count of potential evaluations whose solve failed (a debug callback that
    runs only on failure)."""

    def __init__(self):
        self.count = 0

    def __call__(self, failed):
        self.count += int(np.sum(np.asarray(failed)))


def chain_devices(chain_method: str, num_chains: int) -> int:
    """How many devices the chains are split over: ``1`` for ``"vectorized"``; for
    ``"parallel"`` the most local devices that divide ``num_chains`` evenly; ``"auto"`` is
    ``"parallel"`` on CPU devices when there are several (each CPU device runs its chains on
    a core of its own), ``"vectorized"`` otherwise."""
    if chain_method not in ("auto", "parallel", "vectorized"):
        raise ValueError(f"`chain_method` must be 'auto', 'parallel' or 'vectorized'; got "
                         f"{chain_method!r}")
    devices = jax.local_devices()
    if chain_method == "vectorized" or (chain_method == "auto"
                                        and devices[0].platform != "cpu"):
        return 1
    k = max(d for d in range(1, min(len(devices), num_chains) + 1) if num_chains % d == 0)
    if chain_method == "parallel" and k < 2:
        raise ValueError(
            f"`chain_method`='parallel' needs at least two devices that share the "
            f"{num_chains} chains evenly; JAX has {len(devices)} ({devices[0].platform}). "
            "On a CPU, ask JAX for one device per core before it starts: "
            "jax.config.update('jax_num_cpu_devices', os.cpu_count()) (or "
            "numpyro.set_host_device_count), first thing in the program.")
    return k


def _chain_sharding(devices: int):
    """The sharding that splits a leading chain axis over the first ``devices`` local
    devices (``None`` for one)."""
    if devices < 2:
        return None
    from jax.sharding import Mesh as DeviceMesh
    from jax.sharding import NamedSharding, PartitionSpec

    mesh = DeviceMesh(np.array(jax.local_devices()[:devices]), ("chains",))
    return NamedSharding(mesh, PartitionSpec("chains"))


def _over_devices(loop, sharding):
    """``loop`` with its chains split over ``sharding``'s devices (`_chain_sharding`;
    ``None``: ``loop`` itself) by ``jax.shard_map``, no communication between them: each
    device runs its own chains' iterations. Vectorised on one device, a NUTS step waits for
    the longest tree among all chains and runs on one core; apart, each device waits only
    for its own chains, on a core of its own."""
    if sharding is None:
        return loop
    from jax.sharding import PartitionSpec as P

    c = P("chains")
    return jax.shard_map(loop, mesh=sharding.mesh, in_specs=(c, c, P(), c),
                         out_specs=(c, c), check_vma=False)


class ChainKernel:
    """NumPyro NUTS/HMC over ``C`` vectorised chains on the potential of ``problem``.

    Args:
        problem, policy: the posterior and the mesh policy.
        num_chains, num_warmup: ``C`` and the warmup length (NumPyro's adaptation schedule).
        algo: ``"NUTS"`` or ``"HMC"``; target_accept, dense_mass, max_tree_depth: NumPyro's.
        count_failures: count failed potential evaluations with a host callback.
        devices: how many local devices the chains are split over (`chain_devices`).
        retune: a re-adaptation of the step size only: `init` then starts from given
            step sizes and mass matrices, which it keeps.
    """

    def __init__(self, problem: AbstractProblem, policy: MeshPolicy, *, num_chains: int,
                 num_warmup: int, algo: str, target_accept: float, dense_mass: bool,
                 max_tree_depth: int, count_failures: bool, solve_max_steps: int,
                 devices: int = 1, retune: bool = False):
        from numpyro.infer.hmc import hmc

        self.problem, self.policy, self.C = problem, policy, num_chains
        self.target_accept, self.retune = float(target_accept), bool(retune)
        self.settings = dict(num_warmup=num_warmup, algo=algo, dense_mass=dense_mass,
                             max_tree_depth=max_tree_depth, count_failures=count_failures,
                             solve_max_steps=solve_max_steps, devices=int(devices))
        self.failures = _FailureCounter()
        solve = policy.solves_each_evaluation

        def potential(mesh):
            def U(u):
                lp, _ = problem.log_density(u, None if solve else mesh,
                                            max_steps=solve_max_steps)
                if count_failures:
                    bad = ~jnp.isfinite(lp)
                    jax.lax.cond(bad, lambda: jax.debug.callback(self.failures, bad),
                                 lambda: None)
                return -lp
            return U

        init_kernel, sample_kernel = hmc(potential_fn_gen=potential, algo=algo)

        def init_one(u, key, mesh, step_size, inverse_mass_matrix):
            tuned = dict(inverse_mass_matrix=inverse_mass_matrix) if not retune else dict(
                step_size=step_size, inverse_mass_matrix=inverse_mass_matrix,
                adapt_mass_matrix=False)
            return init_kernel(u, int(num_warmup), dense_mass=dense_mass,
                               target_accept_prob=target_accept,
                               max_tree_depth=max_tree_depth, model_args=(mesh,), rng_key=key,
                               **tuned)

        vstep = jax.vmap(lambda st, mesh: sample_kernel(st, (mesh,), {}))
        vgrad = jax.vmap(lambda u, mesh: jax.value_and_grad(potential(mesh))(u))

        def loop(state, meshes, n, buf):
            # the meshes may have just changed: recompute the current point's potential and
            # gradient on them, so every transition uses one target throughout
            pe, g = vgrad(state.z, meshes)
            state = state._replace(potential_energy=pe, z_grad=g)

            def body(i, carry):
                st, b = carry
                used = st.adapt_state.step_size  # this transition's (warmup adapts it after)
                st = vstep(st, meshes)
                rec = Draws(st.z, st.diverging, st.num_steps, used,
                            st.energy, st.potential_energy, st.accept_prob)
                b = jax.tree_util.tree_map(lambda a, r: a.at[:, i].set(r.astype(a.dtype)),
                                           b, rec)
                return st, b

            return jax.lax.fori_loop(0, n, body, (state, buf))

        self._init = jax.jit(jax.vmap(init_one))
        self._sharding = _chain_sharding(int(devices))
        self._loop = jax.jit(_over_devices(loop, self._sharding))
        self._own_error_ratio = jax.jit(jax.vmap(problem.error_ratio))
        self._error_ratio = jax.jit(lambda u, m: jax.vmap(
            lambda uu: problem.error_ratio(uu, m))(u))

    def meshes(self, s: SampleState):
        """The chains' meshes on device, every leaf with a leading chain axis."""
        return s.mesh.chains(self.C, s.capacity)

    def init(self, u0: np.ndarray, key, s: SampleState, tuned=None, metric=None):
        """NumPyro's initial chain states at ``u0 (C, D)`` (this also builds the kernel's
        potential, so a resumed run calls it too), warmup starting from the inverse mass
        matrix ``metric`` (``(D,)``, or ``(D, D)`` for a dense kernel; default the
        identity). A `retune` kernel starts from ``tuned``, NumPyro's adaptation state of
        the chains (step sizes and mass matrices)."""
        keys = jax.random.split(key, self.C)
        C, D = self.C, self.problem.space.dim
        step = jnp.ones(C) if tuned is None else tuned.step_size
        if tuned is not None:
            imm = tuned.inverse_mass_matrix
        else:
            if metric is None:
                metric = jnp.eye(D) if self.settings["dense_mass"] else jnp.ones(D)
            imm = jnp.broadcast_to(jnp.asarray(metric), (C,) + jnp.shape(metric))
        if imm.ndim == 3 and not self.settings["dense_mass"]:
            # a dense estimate handed to a diagonal kernel (`retuned`): its marginal
            # variances, what a diagonal adaptation estimates
            imm = jnp.diagonal(imm, axis1=-2, axis2=-1)
        return self._init(jnp.asarray(u0), keys, self.meshes(s), step, imm)

    def retuned(self, target_accept: float, iterations: int) -> ChainKernel:
        """A `retune` kernel like this one at ``target_accept``, adapting the step size
        over ``iterations``, with a diagonal mass matrix (the diagonal of a dense one).

        Why diagonal: late-warmup divergences under a dense metric come from its estimate
        (a covariance from a few hundred draws of a heavy-tailed posterior, whose
        off-diagonal terms are noise in the tails); a smaller step on the same metric
        does not remove them (Michaelis–Menten, heavy-tailed: 5 divergences left after
        three re-adaptations on the dense metric, none on a diagonal one)."""
        kw = dict(self.settings, num_warmup=int(iterations), dense_mass=False)
        return ChainKernel(self.problem, self.policy, num_chains=self.C,
                           target_accept=target_accept, retune=True, **kw)

    def run(self, s: SampleState, n: int) -> tuple[SampleState, Draws, int]:
        """``n <= CHUNK`` iterations of every chain: the new state, their `Draws` (host)
        and the number of failed potential evaluations counted."""
        self.failures.count = 0
        f = jnp.result_type(float)
        C, D = self.C, self.problem.space.dim
        buf = Draws(jnp.zeros((C, CHUNK, D), f), jnp.zeros((C, CHUNK), bool),
                    jnp.zeros((C, CHUNK), jnp.int32), *(jnp.zeros((C, CHUNK), f),) * 4)
        args = (s.chains, self.meshes(s), buf)
        if self._sharding is not None:
            # every call on chain-sharded inputs: a jit specialises on its inputs'
            # placement, and NumPyro's initial states live on one device (a second
            # compile of the loop, ~4 s, when the next call gets the first one's output)
            args = jax.device_put(args, self._sharding)
        chains, out = self._loop(args[0], args[1], n, args[2])
        jax.block_until_ready(chains.z)
        draws = Draws(*(np.asarray(b)[:, :n] for b in out))
        return s._replace(chains=chains, iteration=s.iteration + n), draws, self.failures.count

    def step(self, s: SampleState) -> tuple[SampleState, Draws, int]:
        """One iteration of every chain (`run` of one): the kernel's BlackJAX-shaped
        ``step`` beside `init`."""
        return self.run(s, 1)

    def with_mesh(self, s: SampleState, mesh: gs.Mesh) -> SampleState:
        """``s`` on a new host mesh, the capacity raised if it needs more steps."""
        need = int(np.max(mesh.n_steps))
        return s._replace(mesh=mesh, capacity=capacity(need, s.ragged) if need > s.capacity
                          else s.capacity)

    def own_error_ratios(self, z: np.ndarray, count: int = 64) -> np.ndarray:
        """``(C, S)`` the replay ``error_ratio`` (requested units) of up to ``count`` of the
        draws ``z (C, S, D)``, evenly spaced, each on the mesh recorded at that draw at the
        requested tolerances (what ``gs.solve`` in the potential used; NaN at the other
        draws and where the record failed)."""
        C, S, D = z.shape
        take = spaced(S, count // C)
        pts = z[:, take].reshape(-1, D)
        mesh = self.problem.record(pts, 1.0)
        err = np.asarray(self._own_error_ratio(jnp.asarray(pts), mesh.chains(len(pts))))
        err = np.where(np.asarray(mesh.to_host().ok), err, np.nan)
        out = np.full((C, S), np.nan)
        out[:, take] = err.reshape(C, len(take))
        return out

    def error_ratios(self, mesh: gs.Mesh, z: np.ndarray, block: int = 512,
                     tol_factor: float | None = None) -> np.ndarray:
        """Replay ``error_ratio`` (requested units) of one host mesh, recorded at
        ``tol_factor`` (default: the policy's) times the tolerances, at every
        ``z (C, S, D)``, in blocks of ``block`` points (one compiled program)."""
        C, S, D = z.shape
        flat, dev, out = z.reshape(C * S, D), mesh.to_device(), []
        for i in range(0, flat.shape[0], block):
            part = flat[i:i + block]
            pad = block - part.shape[0]
            if pad:
                part = np.concatenate([part, np.repeat(part[-1:], pad, axis=0)])
            out.append(np.asarray(self._error_ratio(jnp.asarray(part), dev))[: block - pad])
        return self.policy.error_ratio(np.concatenate(out).reshape(C, S), tol_factor)
