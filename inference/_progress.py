"""Progress of long fits and samplers: a tqdm bar on a terminal, plain lines otherwise.

A run whose stderr is a log file, a CI job or a captured notebook cell gets a line on
stderr now and then instead of a bar (whose carriage returns make a log unreadable), e.g.

    sample Boehm_JProteomeRes2014 (4 chains): warmup 200/1000, 35 s, step size 0.012

so a sampler that runs for many minutes still says what phase it is in, how far it got
and for how long. Lines are sparse: one when the count has advanced by ``every`` (about
a tenth of the total) AND ``INTERVAL`` seconds have passed since the last, and, while a
long stretch reports nothing (one warmup window can take minutes), a line every
``HEARTBEAT`` seconds from a timer thread; nothing ever prints per iteration.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Sequence

__all__ = ["progress_bar", "INTERVAL", "HEARTBEAT"]

INTERVAL = 30.0
"""Seconds at least between two progress lines that report an advance."""
HEARTBEAT = 120.0
"""Seconds without a line after which a line says the run is still going."""


class _Silent:
    """The progress of a run that shows none: every call does nothing."""

    def update(self, n: int = 1) -> None:
        pass

    def set_postfix(self, **kw) -> None:
        pass

    def close(self) -> None:
        pass


class _Lines:
    """Plain progress lines on stderr (see the module docstring).

    Args:
        total, done: the count to reach and the count already done (a resumed run).
        desc: what runs, the start of every line.
        phases: ``(name, length)`` pairs summing to ``total`` (e.g. warmup and sampling),
            so a line says ``warmup 200/500`` instead of ``200/1500``; default none.
        every: the least advance between two lines (default a tenth of the total).
        interval, heartbeat: seconds (default `INTERVAL` and `HEARTBEAT`).
    """

    def __init__(self, *, total: int, done: int, desc: str,
                 phases: Sequence[tuple[str, int]] = (), every: int | None = None,
                 interval: float | None = None, heartbeat: float | None = None):
        self.total, self.n, self.desc, self.phases = int(total), int(done), desc, tuple(phases)
        self.every = max(1, int(total) // 10) if every is None else max(1, int(every))
        self.interval = INTERVAL if interval is None else float(interval)
        self.heartbeat = HEARTBEAT if heartbeat is None else float(heartbeat)
        self.postfix: dict = {}
        self.t0 = self.last_t = time.monotonic()
        self.last_n = self.n
        self.printed = False
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._timer = threading.Thread(target=self._beat, daemon=True, name="progress-lines")
        self._timer.start()

    def update(self, n: int = 1) -> None:
        with self._lock:
            self.n += int(n)
            now = time.monotonic()
            if self.n - self.last_n >= self.every and now - self.last_t >= self.interval:
                self._emit(now)

    def set_postfix(self, **kw) -> None:
        with self._lock:
            self.postfix = kw

    def close(self) -> None:
        self._stop.set()
        self._timer.join()
        with self._lock:
            if self.printed and self.last_n != self.n:  # the end of a run that showed lines
                self._emit(time.monotonic())

    def _beat(self) -> None:
        while not self._stop.wait(min(self.heartbeat, self.interval) / 2):
            with self._lock:
                now = time.monotonic()
                if now - self.last_t >= self.heartbeat and not self._stop.is_set():
                    self._emit(now, waiting=True)

    def _where(self, waiting: bool = False) -> str:
        """Where the count stands, by phase. A count at a phase's end is that phase done
        (``warmup 500/500``), except while waiting for the next advance, which belongs to
        the next phase (``sampling 0/1000``)."""
        n = max(self.n, 0)
        start = 0
        for i, (name, length) in enumerate(self.phases):
            inside = n < start + length if waiting else n <= start + length
            if inside or i == len(self.phases) - 1:
                return f"{name} {min(n - start, length)}/{length}"
            start += length
        return f"{n}/{self.total}"

    def _emit(self, now: float, waiting: bool = False) -> None:
        parts = [self._where(waiting), f"{now - self.t0:.0f} s"]
        parts += [f"{k.replace('_', ' ')} {v}" for k, v in self.postfix.items()]
        try:
            print(f"{self.desc}: {', '.join(parts)}", file=sys.stderr, flush=True)
        except Exception:  # a closed or replaced stderr: progress is never worth a failure
            pass
        self.last_t, self.last_n, self.printed = now, self.n, True


def _is_terminal() -> bool:
    try:
        return sys.stderr.isatty()
    except Exception:  # a replaced or closed stderr
        return False


def progress_bar(progress: bool | None, *, total: int, done: int, desc: str,
                 phases: Sequence[tuple[str, int]] = (), every: int | None = None):
    """The progress of a run of ``total`` iterations (``done`` of them already done).

    ``progress=True`` (or ``None`` with stderr a terminal): a tqdm bar; ``None`` with
    stderr not a terminal: plain lines on stderr (`_Lines`: a few per run, never one per
    iteration); ``False``, or nothing left to do: none. Every kind has ``update(n)``,
    ``set_postfix(**values)`` and ``close()``. ``phases`` and ``every`` shape the plain
    lines (see `_Lines`)."""
    if done >= total or (progress is not None and not progress):
        return _Silent()
    if progress is None and not _is_terminal():
        return _Lines(total=total, done=done, desc=desc, phases=phases, every=every)
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=done, desc=desc, leave=False)
