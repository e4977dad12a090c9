"""Which thread count each part of a decode block of the threads build runs on: all of the threads started, or
fewer (down to thread 0 alone).

Why a choice at all: in the page on a 2-core machine whose one-thread decode step is short (~6 ms), the step's
barriers and the browser's own threads took what the second Worker adds: two Workers decoded SmolLM2 at 0.8x one
in fast mode and 1.15x in exact mode (docs/cpu-backend.md), where natively and on slower days two gave 1.3-1.7x.
A fixed default is wrong somewhere, and timing a few steps after ready flipped with the noise of that moment. With
more threads the even split waits for its slowest thread (a phone's small cores, a core's SMT sibling) and decode
is bound by memory bandwidth that a few threads may already take. So the runner times the decode blocks it runs
anyway, per (mode, sequences), over candidate_counts(threads): 1, the powers of two below, and all.

A block runs in segments (kernels.c wi_steps from..K-1; the ids do not depend on the thread count: a column's and
a head's arithmetic is the same on any split, only the speed is), so measuring another count costs a step, not a
block (whole blocks on it kept a third of a 64-token chat's blocks on the slower count): the first EXPLORE blocks
run an equal share of their steps on each count (the order rotates, so a trend falls on every count alike), then
the count with the lowest median time per step over its last WINDOW segments runs each block, and every PROBE-th
block runs its first step on another count (each in turn). A probe's time replaces that count's older ones (taken
at least PROBE blocks before), so a count that became faster wins at its next probe: a page's first seconds share
the two cores with V8's background compiles (Pyodide's interpreter loop is recompiled again and again), which slow
two threads waiting for each other far more than one (12-37 ms a SmolLM2 step then against one thread's 8-9, and
4.6-6 ms later). Pure Python (runs in Pyodide).
"""

from __future__ import annotations

import statistics
from collections import deque

EXPLORE = 3      # blocks split half and half between the counts, per key
WINDOW = 5       # segments of each count whose median is its time per step
PROBE = 4        # after exploring, every PROBE-th block runs its first step on the other count
RECENT = 16      # segments listed in stats()


def candidate_counts(threads: int) -> tuple[int, ...]:
    """The thread counts a chooser for `threads` threads tries, most first: all, the powers of two below, 1."""
    return tuple(sorted({threads} | {1 << i for i in range(threads.bit_length()) if 1 << i < threads}, reverse=True))


class ThreadChooser:
    def __init__(self, counts: tuple[int, ...] = (2, 1)):
        """counts: the thread counts to choose from, most threads first (candidate_counts)."""
        self.counts = tuple(counts)
        self._blocks: dict[tuple, int] = {}                # key -> blocks planned
        self._recent: dict[tuple, deque] = {}              # key -> (threads, ms per step) of its last segments
        self._times: dict[tuple, deque] = {}               # (key, threads) -> seconds per step of its last segments
        self._probe: dict[tuple, int] = {}                 # key -> the count its last plan probes

    def plan(self, key: tuple, steps: int) -> list[tuple[int, int]]:
        """The next decode block of this key (e.g. (mode, sequences)) of `steps` steps as segments (threads,
        steps), in order; the steps add up to `steps`. Time each segment into observe()."""
        n = self._blocks.get(key, 0)
        self._blocks[key] = n + 1
        c = len(self.counts)
        if n < EXPLORE:  # (two counts: most first, then the other way round, ...)
            order = self.counts[n % c:] + self.counts[:n % c]
            if steps < c:  # a step each for the first counts in the order
                return [(t, 1) for t in order[:steps]] or [(order[0], 0)]
            return [(t, (steps + i) // c) for i, t in enumerate(order)]  # (sizes adding up to steps)
        best = self.best(key)
        if n % PROBE or steps < 2 or c < 2:
            return [(best, steps)]
        others = [t for t in self.counts if t != best]
        probe = self._probe[key] = others[n // PROBE % len(others)]
        return [(probe, 1), (best, steps - 1)]  # (ending on the chosen count: the count the page shows)

    def best(self, key: tuple) -> int:
        """The count with the lowest median time per step (the most threads until every count has times)."""
        times = [self._times.get((key, t)) for t in self.counts]
        if not all(times):
            return self.counts[0]
        return min(zip(self.counts, times), key=lambda ct: (statistics.median(ct[1]), -ct[0]))[0]

    def observe(self, key: tuple, threads: int, seconds_per_step: float) -> None:
        times = self._times.setdefault((key, threads), deque(maxlen=WINDOW))
        if self._probe.get(key) == threads:
            del self._probe[key]
            times.clear()  # a probe: this count's older times are stale
        times.append(seconds_per_step)
        self._recent.setdefault(key, deque(maxlen=RECENT)).append((threads, round(seconds_per_step * 1e3, 2)))

    def stats(self) -> dict:
        """{"mode/sequences": {"1": ms per step, "2": ms per step, ..., "using": threads, "recent": [[threads, ms
        per step] of the last RECENT segments]}} (medians of the windows)."""
        out = {}
        for key in self._blocks:
            row = {str(t): round(statistics.median(d) * 1e3, 3)
                   for t in sorted(self.counts) if (d := self._times.get((key, t)))}
            recent = [list(r) for r in self._recent.get(key, ())]
            out["/".join(map(str, key))] = {**row, "using": self.best(key), "recent": recent}
        return out
