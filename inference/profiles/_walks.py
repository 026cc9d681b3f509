"""The walks of a profile: each profiled coordinate walked both ways from the optimum, all
walks one ensemble advanced in rounds (`trace`), each round's points re-optimised at once by
the caller's ``run``; adaptive steps, the crossing located by regula falsi (`crossing`).
The module docstring of `inference.profiles._profile` says how and why."""

from __future__ import annotations

import numpy as np

from ..optimize._lm import CONVERGED, FAILED_START

__all__ = ["Walk", "trace", "crossing", "GROWTH", "REFINE"]

GROWTH = 3.0
"""A profile step is at most this many times the walk's previous step."""

REFINE = 3
"""Points a walk places after passing the threshold to locate the crossing (regula falsi),
at most; it stops earlier at one within ``tol`` of the threshold."""

_OVERSHOOT = 1.1
"""A walk whose next ratio target lies below the threshold aims at this times the
threshold (just past it: a short bracket for the refinement)."""



class Walk:
    """One direction of one parameter's profile (host-side bookkeeping)."""

    def __init__(self, j: int, sign: int):
        self.j, self.sign = j, sign
        self.v, self.f, self.x, self.conv = [], [], [], []  # points, in walk order
        self.phase = "explore"  # then "refine", then "done"
        self.reason = None
        self.h = None  # the last step taken
        self.cap = np.inf  # the step limit after a failed solve
        self.n_explore = 0
        self.n_refine = 0

    def add(self, v, f, x, conv):
        self.v.append(float(v)), self.f.append(float(f))
        self.x.append(np.asarray(x, float)), self.conv.append(bool(conv))

    def stop(self, reason: str):
        self.phase, self.reason = "done", reason

    def sorted(self):
        """The points ordered by distance from the optimum: ``(d, v, f, x)``."""
        d = self.sign * (np.asarray(self.v) - self.v[0])
        order = np.argsort(d, kind="stable")
        return (d[order], np.asarray(self.v)[order], np.asarray(self.f)[order],
                np.stack(self.x)[order])


def crossing(walk: Walk, f_ref: float, threshold: float):
    """``(index of the first point past the threshold, interpolated crossing value)`` along
    the walk, or ``None``: ``sqrt(F_p - f_ref)`` interpolated linearly between the two
    points around the first crossing (exact where the profile is quadratic)."""
    d, v, f, _ = walk.sorted()
    past = np.flatnonzero(f - f_ref >= threshold)
    if not len(past):
        return None
    i = int(past[0])
    if i == 0:
        return 0, v[0]
    q0, q1 = np.sqrt(max(f[i - 1] - f_ref, 0.0)), np.sqrt(f[i] - f_ref)
    t = (np.sqrt(threshold) - q0) / (q1 - q0) if q1 > q0 else 1.0
    return i, float(v[i - 1] + np.clip(t, 0.0, 1.0) * (v[i] - v[i - 1]))


def _propose(walk: Walk, f_ref, threshold, lo, hi, *, first_step, min_step, max_step,
             ratio_step):
    """The walk's next value and its warm start ``(D,)``, or ``None`` (done)."""
    j, s = walk.j, walk.sign
    if walk.phase == "refine":
        d, v, f, x = walk.sorted()
        c = crossing(walk, f_ref, threshold)
        if c is None or c[0] == 0:
            return None
        i = c[0]
        q0, q1 = np.sqrt(max(f[i - 1] - f_ref, 0.0)), np.sqrt(f[i] - f_ref)
        t = float(np.clip((np.sqrt(threshold) - q0) / (q1 - q0), 0.02, 0.98))
        value = v[i - 1] + t * (v[i] - v[i - 1])
        if abs(v[i] - v[i - 1]) <= 1e-12 * (1.0 + abs(value)):
            return None
        x0 = x[i - 1] + t * (x[i] - x[i - 1])
    else:
        df = walk.f[-1] - f_ref
        r_target = np.exp(-max(df, 0.0)) - ratio_step
        target = -np.log(r_target) if r_target > np.exp(-threshold) else \
            _OVERSHOOT * threshold
        if len(walk.v) == 1:
            h = first_step
        else:
            dk = s * (walk.v[-1] - walk.v[-2])
            q1 = np.sqrt(max(df, 0.0))
            q0 = np.sqrt(max(walk.f[-2] - f_ref, 0.0))
            slope = (q1 - q0) / dk
            h = (np.sqrt(target) - q1) / slope if slope > 0 else np.inf
            h = min(h, GROWTH * walk.h)
        h = float(np.clip(min(h, walk.cap), min_step, max_step))
        value = float(np.clip(walk.v[-1] + s * h, lo[j], hi[j]))
        x0 = walk.x[-1]
        if len(walk.v) > 1:
            # first order along the path: the others move as they did over the last step
            x0 = x0 + (walk.x[-1] - walk.x[-2]) * ((value - walk.v[-1])
                                                  / (walk.v[-1] - walk.v[-2]))
    x0 = np.clip(np.asarray(x0, float), lo, hi)
    x0[j] = value
    return value, x0



def trace(run, which, x_opt, f_opt, floor, lo, hi, threshold, max_steps, tol, steps,
           bar):
    """Every walk of the profiles of ``which`` from ``x_opt`` (objective ``f_opt``), in
    rounds, until all are done or a point goes below ``floor``: (walks, lowest objective
    seen, rounds)."""
    walks = [Walk(j, s) for j in which for s in (-1, 1)]
    n = len(walks)
    # round 0: each walk's first point, the optimum re-optimised with x_j held
    f, x, code = run(np.repeat(x_opt[None], n, axis=0), [w.j for w in walks])
    rounds = 1
    bar.update(1)
    for w, fi, xi, ci in zip(walks, f, x, code):
        ok = ci != FAILED_START and np.isfinite(fi)
        w.add(x_opt[w.j], fi if ok else f_opt, xi if ok else x_opt, ci == CONVERGED)
        if x_opt[w.j] <= lo[w.j] if w.sign < 0 else x_opt[w.j] >= hi[w.j]:
            w.stop("bound")
    f_ref = min(f_opt, min(w.f[0] for w in walks))
    while f_ref >= floor:
        proposals = {}
        for r, w in enumerate(walks):
            if w.phase == "done":
                continue
            p = _propose(w, f_ref, threshold, lo, hi, **steps)
            if p is None:
                w.stop("threshold")
            else:
                proposals[r] = p
        if not proposals:
            break
        # a finished walk's row repeats a running one's (the same path: no iterations
        # added), so that every round runs the same compiled batch
        active = sorted(proposals)
        src = [r if r in proposals else active[r % len(active)] for r in range(n)]
        f, x, code = run(np.stack([proposals[r][1] for r in src]),
                         [walks[r].j for r in src])
        rounds += 1
        bar.update(1)
        for r in active:
            _advance(walks[r], proposals[r][0], f[r], x[r], code[r], f_ref, threshold,
                     lo, hi, max_steps, tol, steps["min_step"])
        f_ref = min(f_ref, min(min(w.f) for w in walks))
    return walks, f_ref, rounds


def _advance(w: Walk, value, f, x, code, f_ref, threshold, lo, hi, max_steps, tol,
             min_step):
    """Take a round's point (at ``value``) into its walk and decide the walk's next phase."""
    j = w.j
    if code == FAILED_START or not np.isfinite(f):
        if w.phase == "refine":
            w.stop("threshold")  # keep the bracket found
            return
        step = abs(value - w.v[-1])
        if step <= min_step * (1.0 + 1e-9):
            w.stop("failed")
        else:
            w.cap = step / 2.0
        return
    # (the LM leaves the held coordinate exactly at ``value``: zero gradient and curvature)
    w.add(value, f, x, code == CONVERGED)
    if w.phase == "refine":
        w.n_refine += 1
        if abs(f - f_ref - threshold) <= tol or w.n_refine >= REFINE:
            w.stop("threshold")
        return
    w.h = abs(value - w.v[-2])
    w.cap = np.inf
    w.n_explore += 1
    if f - f_ref >= threshold:
        if abs(f - f_ref - threshold) <= tol:
            w.stop("threshold")
        else:
            w.phase = "refine"
    elif (w.sign < 0 and value <= lo[j]) or (w.sign > 0 and value >= hi[j]):
        w.stop("bound")
    elif w.n_explore >= max_steps:
        w.stop("max_steps")
