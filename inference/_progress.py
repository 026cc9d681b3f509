"""A progress bar for long fits and samplers: tqdm on a terminal, nothing otherwise."""

from __future__ import annotations

import sys

__all__ = ["progress_bar"]


class _Silent:
    """The bar of a run without one: every call does nothing."""

    def update(self, n: int = 1) -> None:
        pass

    def set_postfix(self, **kw) -> None:
        pass

    def close(self) -> None:
        pass


def progress_bar(progress: bool | None, *, total: int, done: int, desc: str):
    """A tqdm bar (``progress=True``, or ``None`` and stderr a terminal) or a silent one;
    none either when nothing is left to do (``done >= total``)."""
    if progress is None:
        try:
            progress = sys.stderr.isatty()
        except Exception:  # a replaced or closed stderr
            progress = False
    if not progress or done >= total:
        return _Silent()
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=done, desc=desc, leave=False)
