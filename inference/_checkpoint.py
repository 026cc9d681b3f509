"""Checkpoints: a driver's whole state, saved atomically, refused by a run it does not fit.

A checkpoint file holds one `Checkpoint`: the state pytree of `inference.fit` or
`inference.sample` (a NamedTuple of arrays and counters), the sampler's `SampleInfo` (what
its run reports so far) and a fingerprint of the settings that produced it (data digest,
solver, tolerances, seed, ...). Arrays are stored as NumPy and restored as they were, so a
resumed run continues bit for bit.

A run checks its checkpoint path before it starts (`check_path`: a bad path is an error at
once, not after the first stretch of work) and saves through `save_or_warn`: a save that
fails later (a full disk, permissions changed mid-run) is a warning, never the loss of the
run's result.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import pickle
import warnings
from typing import Any, NamedTuple

import jax
import numpy as np

from . import _transfer

__all__ = ["Checkpoint", "check_path", "save", "save_or_warn", "load", "digest", "fingerprint",
           "to_host", "to_device"]

VERSION = 3


class Checkpoint(NamedTuple):
    """What a checkpoint file holds.

    Attributes:
        fingerprint: the settings a resuming run must share (a dict of plain values).
        state: the driver's state (`FitState`, `SampleState`) with NumPy leaves.
        info: what the run reports so far (the sampler's `SampleInfo`; ``None`` for a fit).
    """

    fingerprint: dict
    state: Any
    info: Any = None


def to_host(tree):
    """``tree`` with its JAX arrays as NumPy arrays (what a checkpoint stores)."""
    return jax.tree_util.tree_map(
        lambda x: np.asarray(x) if isinstance(x, jax.Array) else x, tree)


def to_device(tree):
    """``tree`` with its NumPy arrays as JAX arrays (a restored optimiser or chain state),
    transferred without a compiled conversion (`inference._transfer`)."""
    return jax.tree_util.tree_map(
        lambda x: _transfer.to_device(x) if isinstance(x, np.ndarray) else x, tree)


def digest(tree) -> str | None:
    """A short hash of a pytree of arrays (structure, shapes, dtypes and values), for
    fingerprints; ``None`` for ``None``; strings and numbers by value."""
    if tree is None:
        return None
    h = hashlib.sha1()
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    h.update(str(treedef).encode())
    for leaf in leaves:
        if isinstance(leaf, (str, bool, int, float)):
            h.update(repr(leaf).encode())
            continue
        a = np.ascontiguousarray(np.asarray(leaf))
        h.update(f"{a.shape}{a.dtype}".encode())
        h.update(a.tobytes())
    return h.hexdigest()[:16]


def _plain(v):
    """A setting as a plain Python value (NumPy scalars as ints and floats)."""
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    if isinstance(v, (int, np.integer)):
        return int(v)
    if isinstance(v, (float, np.floating)):
        return float(v)
    return v


def fingerprint(problem, policy, **settings) -> dict:
    """What a checkpoint must share with the run that resumes it: the problem's (model,
    data digest, solver, tolerances, step capacity; `Problem.fingerprint`), the mesh
    policy's fields (``policy_*``) and the driver's ``settings`` (plain values, digests)."""
    return dict(**problem.fingerprint(),
                **{f"policy_{k}": v for k, v in dataclasses.asdict(policy).items()},
                **{k: _plain(v) for k, v in settings.items()})


def _tmp(path: str) -> str:
    """The temporary file beside ``path`` that `save` writes before renaming it."""
    return f"{path}.tmp.{os.getpid()}"


def _why_not(e: OSError, directory: str) -> str:
    """Why a checkpoint cannot be written in ``directory``, for users: a file standing where
    a directory is needed, else the system's reason."""
    d = directory
    while not os.path.lexists(d) and os.path.dirname(d) != d:
        d = os.path.dirname(d)
    if os.path.lexists(d) and not os.path.isdir(d):
        return f"{d!r} is a file, not a directory"
    return f"{e.strerror or e} ({e.filename!r})" if e.filename else str(e)


def check_path(path) -> None:
    """A ``ValueError`` naming the `checkpoint` argument unless a checkpoint can be saved at
    ``path`` (nothing for ``None``). It does what a save does: creates the directory and a
    temporary file beside the target (then removes the file), so a path that cannot be
    written fails before the run starts rather than at its first save."""
    if path is None:
        return
    if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
        raise ValueError(f"`checkpoint` must be a file path, got {path!r}")
    path = os.fspath(path)
    if path.endswith(("/", os.sep)) or os.path.isdir(path):
        raise ValueError(
            f"`checkpoint`: {path!r} is a directory; pass a file path, e.g. "
            f"{os.path.join(path, 'run.pkl')!r}")
    directory = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(directory, exist_ok=True)
        with open(_tmp(path), "wb"):
            pass
        os.remove(_tmp(path))
    except OSError as e:
        raise ValueError(
            f"`checkpoint`: cannot write {path!r}: {_why_not(e, directory)}") from e


def save(path, fingerprint: dict, state, info=None) -> None:
    """Write ``Checkpoint(fingerprint, state, info)`` to ``path`` atomically (a temporary
    file, then a rename: an interrupted or failed write never leaves a broken checkpoint,
    nor the temporary file)."""
    path = os.fspath(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = _tmp(path)
    try:
        with open(tmp, "wb") as fh:
            pickle.dump(Checkpoint(dict(fingerprint, version=VERSION), to_host(state),
                                   to_host(info)), fh, protocol=pickle.HIGHEST_PROTOCOL)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise


def save_or_warn(path, fingerprint: dict, state, *info) -> bool:
    """`save` (``info`` as its), whether it saved: a save that fails (a full disk,
    permissions changed mid-run) is a ``RuntimeWarning`` naming the file and the error, so
    the run goes on and its result is not lost for want of a checkpoint. An interrupt
    (``KeyboardInterrupt``) still propagates."""
    try:
        save(path, fingerprint, state, *info)
    except Exception as e:  # whatever the failure, the run goes on
        warnings.warn(
            f"could not save the checkpoint {os.fspath(path)!r} ({type(e).__name__}: {e}); "
            "the run goes on without this checkpoint", RuntimeWarning,
            stacklevel=3)
        return False
    return True


def load(path, fingerprint: dict, what: str, with_info: bool = False):
    """The state saved at ``path`` (``with_info``: ``(state, info)``; ``None`` if there is
    none); a ``ValueError`` if it was saved with other settings (naming them), ``what``
    naming the kind of run, or in a format this version does not read."""
    if path is None or not os.path.exists(path):
        return None
    try:
        with open(path, "rb") as fh:
            ckpt = pickle.load(fh)
    except (TypeError, AttributeError, ImportError, pickle.UnpicklingError, EOFError) as e:
        raise _old_format(path, what) from e
    if with_info and isinstance(ckpt, Checkpoint) and ckpt.info is None:
        raise _old_format(path, what)
    want = dict(fingerprint, version=VERSION)
    got = ckpt.fingerprint if isinstance(ckpt, Checkpoint) else {}
    diff = {k: (got.get(k), v) for k, v in want.items() if got.get(k) != v}
    if diff:
        raise ValueError(
            f"checkpoint {os.fspath(path)!r} belongs to a different {what} "
            f"(saved vs requested: {diff}); remove it or pass another path."
        )
    return (ckpt.state, ckpt.info) if with_info else ckpt.state


def _old_format(path, what: str) -> ValueError:
    """The error for a checkpoint this version cannot read (e.g. a sampler's from before
    its state and report were separated)."""
    return ValueError(
        f"checkpoint {os.fspath(path)!r} was written in an older format that this version "
        f"cannot resume (a {what} of an earlier gradsolve); remove it (or pass another "
        "path) to start afresh.")
