"""`EnsembleKernel`: BlackJAX's jittered HMC with ChEES adaptation over ``C`` chains that
step in lockstep, on the replay potential.

Each iteration draws ONE number of leapfrog steps for every chain (the adapted
trajectory length over the step size, jittered by a Halton sequence that all chains
share), so the ``C`` chains' potentials and gradients are one ensemble evaluation per
leapfrog step (``jax.vmap`` over chains, each chain on its row of the mesh), with no
chain waiting for another's tree. The transition kernel is BlackJAX's
(``blackjax.mcmc.dynamic_hmc.build_kernel``) and so are the adaptation's updates
(``blackjax.adaptation.chees_adaptation.base``: dual averaging of the harmonic-mean
acceptance across chains for the step size, Adam on the ChEES criterion for the
trajectory length, their moving averages used after warmup); this module arranges them
in chunks of iterations (`CHUNK`), between which the run loop re-records the meshes.

Metric: the chains run in whitened coordinates ``x = L^-1 (u - mu)`` with an identity
mass matrix, which is HMC on ``u`` with inverse mass matrix ``L L^T`` (the Jacobian of a
fixed affine map is a constant). ``L`` starts from the run's initial metric (the
curvature at the MAP point, or the identity) and is re-estimated between warmup windows
from the pooled draws of every chain in the latest window (Stan's regularisation toward
a small multiple of the identity), dense under the same rule as NUTS. BlackJAX's own
ChEES metric is diagonal; whitening by a dense estimate keeps the correlated rates of an
ODE (lynx-hare) from forcing short steps along their ridges.

Memory: the loop evaluates the chains in blocks of ``chain_block`` (`blocked`: ``jax.vmap``
over a block, ``lax.map`` over the blocks), so its temporaries are those of one block, not
of all ``C`` chains. Under ``rerecord="always"`` each evaluation of a population program is
a ``gs.solve`` whose record and replay hold every trajectory at the site's full step
capacity (16,384 by default), and on a TPU each chain's ensemble is padded to at least
1,024 trajectories (8 x 128 lanes) under ``jax.vmap``: theophylline (12 subjects, 2
states) asks ~270 MB of temporaries per chain, 33 GB at 128 chains in one block. By default
the block is all chains; where the compiled loop does not fit in the device's memory
(``RESOURCE_EXHAUSTED``) `run` halves it (a divisor of ``C``) and runs again. The draws do
not depend on the block: every chain's transition is the same arithmetic in any block.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ._chains import CHUNK, ChainKernel, Draws, SampleState, _FailureCounter

__all__ = ["EnsembleKernel", "EnsembleChains", "EnsembleAdapt"]


class EnsembleAdapt(NamedTuple):
    """The lockstep chains' adaptation.

    Attributes:
        step_size: ``(C,)`` the step size the sampling phase uses (every chain the same;
            in whitened coordinates).
        inverse_mass_matrix: ``(C, D)`` the metric's marginal variances in ``u``.
        chees: BlackJAX's ``ChEESAdaptationState`` (shared by the chains).
        mu, L: the whitening ``u = mu + L x`` (``(D,)``, ``(D, D)``).
        left: adaptation iterations left (0: sampling with the adapted values).
    """

    step_size: Any
    inverse_mass_matrix: Any
    chees: Any
    mu: Any
    L: Any
    left: Any


class EnsembleChains(NamedTuple):
    """The chains' state: ``z (C, D)`` positions in ``u``, BlackJAX's
    ``DynamicHMCState`` (batched, in whitened coordinates), the adaptation and one key per
    chain."""

    z: Any
    hmc: Any
    adapt_state: EnsembleAdapt
    rng_key: Any


def blocked(fn, block: int):
    """``jax.vmap(fn)`` over the leading (chain) axis of every leaf of its arguments,
    ``block`` chains at a time: ``lax.map`` over ``C / block`` blocks, each a ``jax.vmap``
    of ``fn``, so the temporaries are one block's. ``block`` must divide ``C``; a block of
    ``C`` or more is the plain ``jax.vmap``."""
    vf = jax.vmap(fn)

    def run(*args):
        C = jax.tree_util.tree_leaves(args)[0].shape[0]
        if block >= C:
            return vf(*args)
        nb = C // block
        split = jax.tree_util.tree_map(lambda a: a.reshape((nb, block) + a.shape[1:]), args)
        out = jax.lax.map(lambda a: vf(*a), split)
        return jax.tree_util.tree_map(lambda a: a.reshape((C,) + a.shape[2:]), out)

    return run


def _divisor_block(C: int, block: int | None) -> int:
    """The largest divisor of ``C`` that is at most ``block`` (``None``: ``C``)."""
    b = C if block is None else max(1, min(int(block), C))
    while C % b:
        b -= 1
    return b


HALTON_BITS = 20
"""Bits of the Halton sequence that jitters the trajectory length (period 2**20)."""


def _regularised(cov: np.ndarray, n: int, dense: bool) -> np.ndarray:
    """Stan's regularisation of a metric estimated from ``n`` draws: shrunk towards
    ``1e-3`` times the identity by ``5 / (n + 5)``."""
    w = n / (n + 5.0)
    if dense:
        return w * cov + 1e-3 * (1 - w) * np.eye(cov.shape[0])
    return w * cov + 1e-3 * (1 - w)


class EnsembleKernel(ChainKernel):
    """ChEES-HMC (BlackJAX) over ``C`` lockstep chains on the potential of ``problem``.

    The interface is `ChainKernel`'s (`init`, `run`, `retuned`, the meshes and error
    ratios), so the run loop of `inference.sample` drives either.

    Args:
        problem, policy: the posterior and the mesh policy.
        num_chains, num_warmup: ``C`` and the adaptation's length.
        target_accept: the harmonic-mean acceptance the step size is adapted towards.
        dense_mass: a dense whitening (else diagonal).
        count_failures: count failed potential evaluations with a host callback.
        learning_rate, max_leapfrog_steps, jitter_amount: the ChEES adaptation's.
        retune: a re-adaptation: `init` starts from a previous adaptation (``tuned``),
            keeping its whitening's diagonal.
        chain_block: how many chains the loop evaluates at once (`blocked`; ``None``: all,
            halved where the compiled loop runs out of device memory); a number that does
            not divide ``C`` is lowered to one that does. The draws are the same for any.
    """

    def __init__(self, problem, policy, *, num_chains: int, num_warmup: int,
                 target_accept: float, dense_mass: bool, count_failures: bool,
                 solve_max_steps: int, learning_rate: float, max_leapfrog_steps: int,
                 jitter_amount: float, retune: bool = False, devices: int = 1,
                 chain_block: int | None = None):
        import optax
        from blackjax.adaptation import chees_adaptation
        from blackjax.mcmc import dynamic_hmc

        self.problem, self.policy, self.C = problem, policy, int(num_chains)
        self.target_accept, self.retune = float(target_accept), bool(retune)
        self.num_warmup = int(num_warmup)
        self.settings = dict(num_warmup=int(num_warmup), algo="ChEES", dense_mass=dense_mass,
                             count_failures=count_failures, solve_max_steps=solve_max_steps,
                             devices=1, learning_rate=learning_rate,
                             max_leapfrog_steps=max_leapfrog_steps,
                             jitter_amount=jitter_amount)
        self.failures = _FailureCounter()
        self._sharding = None
        if chain_block is not None and (isinstance(chain_block, bool) or not isinstance(
                chain_block, (int, np.integer)) or chain_block < 1):
            raise ValueError(f"`chain_block` must be None or an int >= 1, got {chain_block!r}")
        self.chain_block = _divisor_block(self.C, chain_block)
        solve = policy.solves_each_evaluation
        D = problem.space.dim

        def jitter(i):
            return (dynamic_hmc.halton_sequence(i, HALTON_BITS) * jitter_amount
                    + (1.0 - jitter_amount))

        step_fn = dynamic_hmc.build_kernel(
            next_random_arg_fn=lambda i: i + 1,
            integration_steps_fn=lambda i, n: jnp.asarray(jnp.ceil(jitter(i) * n), int))
        self._chees_init, chees_update = chees_adaptation.base(
            jitter, lambda i: i + 1, optax.adam(learning_rate), float(target_accept),
            0.5, int(max_leapfrog_steps))
        self._optim_init = optax.adam(learning_rate).init

        def log_p(x, mesh, mu, L):
            lp, _ = problem.log_density(mu + L @ x, None if solve else mesh,
                                        max_steps=solve_max_steps)
            if count_failures:
                bad = ~jnp.isfinite(lp)
                jax.lax.cond(bad, lambda: jax.debug.callback(self.failures, bad),
                             lambda: None)
            return lp

        ones = jax.device_put(np.ones(D, jnp.result_type(float)))
        self._log_p, self._step_fn, self._chees_update, self._ones = (
            log_p, step_fn, chees_update, ones)
        self._solves = solve
        self._loop = self._build_loop(self.chain_block)
        self._own_error_ratio = jax.jit(jax.vmap(problem.error_ratio))
        self._error_ratio = jax.jit(lambda u, m: jax.vmap(
            lambda uu: problem.error_ratio(uu, m))(u))

    def _build_loop(self, block: int):
        """The compiled loop of ``n`` lockstep iterations, the chains evaluated ``block``
        at a time (`blocked`)."""
        log_p, step_fn, chees_update, ones = (self._log_p, self._step_fn,
                                              self._chees_update, self._ones)

        def loop(chains: EnsembleChains, meshes, n, buf):
            if self._solves:  # the potential solves: the meshes are not read
                meshes = None
            a = chains.adapt_state
            mu, L = a.mu, a.L
            # the meshes or the whitening may have just changed: the current points'
            # density and gradient on them, so every transition uses one target
            x = jax.scipy.linalg.solve_triangular(L, (chains.z - mu).T, lower=True).T
            lp, g = blocked(jax.value_and_grad(
                lambda xx, m: log_p(xx, m, mu, L)), block)(x, meshes)
            hmc = chains.hmc._replace(position=x, logdensity=lp, logdensity_grad=g)

            def body(i, carry):
                st, ch, left, keys, b = carry
                adapting = left > 0
                eps = jnp.where(adapting, ch.step_size,
                                jnp.exp(ch.log_step_size_moving_average))
                length = jnp.where(adapting, ch.trajectory_length,
                                   jnp.exp(ch.log_trajectory_length_moving_average))
                split = jax.vmap(jax.random.split)(keys)
                keys, step_keys = split[:, 0], split[:, 1]
                new, info = blocked(lambda k, s, m: step_fn(
                    k, s, lambda xx: log_p(xx, m, mu, L), eps, ones,
                    integration_steps_params=(length / eps,)), block)(step_keys, st, meshes)
                updated = chees_update(ch, info.proposal.position, info.proposal.momentum,
                                       st.position, info.acceptance_rate,
                                       info.is_divergent, ones)
                ch = jax.tree_util.tree_map(lambda u, o: jnp.where(adapting, u, o),
                                            updated, ch)
                rec = Draws(mu + new.position @ L.T, info.is_divergent,
                            info.num_integration_steps, jnp.broadcast_to(eps, (self.C,)),
                            info.energy, -new.logdensity, info.acceptance_rate)
                b = jax.tree_util.tree_map(lambda arr, r: arr.at[:, i].set(r.astype(arr.dtype)),
                                           b, rec)
                return new, ch, left - adapting.astype(left.dtype), keys, b

            st, ch, left, keys, buf = jax.lax.fori_loop(
                0, n, body, (hmc, a.chees, a.left, chains.rng_key, buf))
            eps = jnp.exp(ch.log_step_size_moving_average)
            adapt = a._replace(chees=ch, left=left,
                               step_size=jnp.broadcast_to(eps, (self.C,)).astype(x.dtype))
            z = mu + st.position @ L.T
            return EnsembleChains(z, st, adapt, keys), buf

        return jax.jit(loop)

    # ------------------------------------------------------------------ state
    def _adapt(self, mu, L, chees, left) -> EnsembleAdapt:
        # built on the host and transferred whole: eager jnp calls would each compile
        var = np.sum(np.asarray(L) ** 2, axis=1)
        eps = np.exp(float(chees.log_step_size_moving_average))
        f = jnp.result_type(float)
        return EnsembleAdapt(**jax.device_put(dict(
            step_size=np.full((self.C,), eps, f),
            inverse_mass_matrix=np.broadcast_to(np.asarray(var, f), (self.C, len(var))),
            mu=np.asarray(mu, f), L=np.asarray(L, f), left=np.asarray(int(left), np.int32))),
            chees=chees)

    def _fresh_chees(self, step_size: float, trajectory_length: float | None = None):
        """BlackJAX's initial ChEES state at ``step_size`` (and ``trajectory_length``,
        default one step), its leaves strongly typed (the compiled loop carries them)."""
        f = jnp.result_type(float)
        eps = np.asarray(step_size, f)
        t = eps if trajectory_length is None else np.asarray(trajectory_length, f)
        if getattr(self, "_chees_state", None) is None:  # one program, not one per op
            def state(eps, t):
                ch = self._chees_init(jnp.asarray(0, jnp.int32), eps)
                ch = ch._replace(
                    trajectory_length=t, log_trajectory_length_moving_average=jnp.log(t),
                    log_step_size_moving_average=jnp.log(eps),
                    optim_state=self._optim_init(jnp.log(t)), step=jnp.asarray(1, jnp.int32))
                return jax.tree_util.tree_map(
                    lambda v: jnp.asarray(v, f) if jnp.issubdtype(jnp.result_type(v),
                                                                  jnp.floating)
                    else jnp.asarray(v, jnp.int32), ch)
            self._chees_state = jax.jit(state)
        return self._chees_state(jax.device_put(eps), jax.device_put(t))

    def init(self, u0: np.ndarray, key, s: SampleState, tuned=None, metric=None):
        """The chains at ``u0 (C, D)``, the whitening from ``metric`` (an inverse mass
        matrix ``(D,)`` or ``(D, D)``; default the identity) or, for a `retune` kernel,
        from the previous adaptation ``tuned`` (its diagonal, its step size and trajectory
        length as the new adaptation's start)."""
        from blackjax.mcmc.dynamic_hmc import DynamicHMCState

        u0 = np.asarray(u0, dtype=np.float64)
        C, D = u0.shape
        dense = bool(self.settings["dense_mass"])
        if tuned is not None:
            L_old = np.asarray(tuned.L)
            var = np.sum(L_old ** 2, axis=1)
            L = np.linalg.cholesky(L_old @ L_old.T) if dense else np.diag(np.sqrt(var))
            mu = np.asarray(tuned.mu)
            ch = self._fresh_chees(float(np.asarray(tuned.step_size)[0]),
                                   float(tuned.chees.trajectory_length))
        else:
            m = np.ones(D) if metric is None else np.asarray(metric, dtype=np.float64)
            if m.ndim == 2 and not dense:
                m = np.diagonal(m)
            L = np.linalg.cholesky(m) if m.ndim == 2 else np.diag(np.sqrt(m))
            mu = np.mean(u0, axis=0)
            ch = self._fresh_chees(0.5)
        f = jnp.result_type(float)
        hmc = DynamicHMCState(*jax.device_put((np.zeros((C, D), f), np.zeros(C, f),
                                               np.zeros((C, D), f), np.zeros(C, np.int32))))
        return EnsembleChains(jax.device_put(u0.astype(f)), hmc,
                              self._adapt(mu, L, ch, self.num_warmup),
                              jax.random.split(key, self.C))

    def retuned(self, target_accept: float, iterations: int) -> "EnsembleKernel":
        """A `retune` kernel like this one at ``target_accept`` over ``iterations``, on
        the diagonal of the whitening (as NUTS's re-adaptation; see `ChainKernel`)."""
        kw = {k: v for k, v in self.settings.items()
              if k not in ("num_warmup", "algo", "dense_mass", "devices")}
        return EnsembleKernel(self.problem, self.policy, num_chains=self.C,
                              num_warmup=int(iterations), target_accept=target_accept,
                              dense_mass=False, retune=True, chain_block=self.chain_block,
                              **kw)

    # ------------------------------------------------------------------ steps
    def run(self, s: SampleState, n: int):
        """``n <= CHUNK`` lockstep iterations of every chain: ``(state, Draws (host),
        failed evaluations counted)``. A call that ends inside warmup's middle (after its
        first tenth, before its terminal window) re-estimates the whitening from its
        pooled draws. Where the loop does not fit in the device's memory
        (``RESOURCE_EXHAUSTED``), the chains' block is halved (`chain_block`, kept for the
        next calls) and the call runs again from the same state."""
        f = jnp.result_type(float)
        C, D = self.C, self.problem.space.dim
        left0 = int(s.chains.adapt_state.left)
        buf = Draws(*jax.device_put((np.zeros((C, CHUNK, D), f), np.zeros((C, CHUNK), bool),
                                     np.zeros((C, CHUNK), np.int32))
                                    + (np.zeros((C, CHUNK), f),) * 4))
        meshes = self.meshes(s)
        while True:
            self.failures.count = 0
            try:
                chains, out = self._loop(s.chains, meshes, n, buf)
                jax.block_until_ready(chains.z)
                break
            except jax.errors.JaxRuntimeError as e:
                if "RESOURCE_EXHAUSTED" not in str(e):
                    raise
                if self.chain_block == 1:
                    raise MemoryError(
                        f"inference.sample: one chain's transition does not fit in the "
                        f"device's memory ({e}); lower the ode sites' max_steps (the step "
                        f"capacity of the solve inside the potential) or run on a device "
                        f"with more memory") from e
                self.chain_block = _divisor_block(self.C, self.chain_block // 2)
                self._loop = self._build_loop(self.chain_block)
        draws = Draws(*(np.asarray(b)[:, :n] for b in out))
        chains = self._rewhitened(chains, draws, left0, n)
        return (s._replace(chains=chains, iteration=s.iteration + n), draws,
                self.failures.count)

    def step(self, s: SampleState):
        """One lockstep iteration of every chain (`run` of one)."""
        return self.run(s, 1)

    def _rewhitened(self, chains: EnsembleChains, draws: Draws, left0: int,
                    n: int) -> EnsembleChains:
        """The whitening re-estimated from ``draws`` where this call's iterations lie in
        the adaptation's middle (Stan's slow windows: after the first tenth, before the
        terminal window of ``max(20, W // 10)``), with the step-size search restarted."""
        W = self.num_warmup
        done0, done1 = W - left0, W - left0 + n
        if self.retune or left0 <= 0 or done0 < W // 10 or done1 > W - max(20, W // 10):
            return chains
        z = np.asarray(draws.z, dtype=np.float64).reshape(-1, draws.z.shape[-1])
        m, D = z.shape
        if not np.all(np.isfinite(z)) or m < 10:
            return chains
        dense = bool(self.settings["dense_mass"]) and m >= 4 * D
        cov = np.cov(z, rowvar=False).reshape(D, D)
        if dense:
            L = np.linalg.cholesky(_regularised(cov, m, True))
        else:
            L = np.diag(np.sqrt(_regularised(np.diagonal(cov), m, False)))
        a = chains.adapt_state
        # a step size in the new coordinates: dual averaging starts again from the
        # current one (NumPyro and Stan restart it at every metric update too)
        ch = a.chees
        # the same dtypes, all strongly typed, as the state the loop was compiled for (a
        # weakly typed leaf would compile the loop again: seconds of a short run)
        da = jax.tree_util.tree_map(lambda new, old: jnp.asarray(new, jnp.dtype(old.dtype)),
                                    self._da_init(ch.step_size), ch.da_state)
        ch = ch._replace(da_state=da)
        return chains._replace(adapt_state=self._adapt(np.mean(z, axis=0), L, ch,
                                                       int(a.left)))

    def _da_init(self, step_size):
        from blackjax.optimizers.dual_averaging import dual_averaging

        return dual_averaging()[0](step_size)
