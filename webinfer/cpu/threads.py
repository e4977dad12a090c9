"""Which thread count a decode block of the threads build runs on: both threads, or thread 0 alone.

Why a choice at all: in the page on a 2-core machine whose one-thread decode step is short (~6 ms), the step's
barriers and the browser's own threads took what the second Worker adds: two Workers decoded SmolLM2 at 0.8x one
in fast mode and 1.15x in exact mode (docs/cpu-backend.md), where natively and on slower days two gave 1.3-1.7x.
A fixed default is wrong somewhere, and timing a few steps after ready flipped with the noise of that moment. So
the runner times the decode blocks it runs anyway: per (mode, sequences), the first blocks alternate 2, 1, 1, 2,
2, 1 (a trend, such as V8 optimizing the module meanwhile, falls on both sides alike), then the count with the
lower median time per step over its last WINDOW blocks runs, and every RECHECK-th block the other one runs once,
so a machine that gets busier or quieter is followed. A recheck's time replaces the rechecked count's older ones:
those are at least RECHECK blocks old, and the first were taken while the page started (two Workers measured
12-37 ms a SmolLM2 step in a page's first blocks against one's 9, and 5-6 ms later: likely V8 still optimizing
the module, not traced), so a count that became faster wins at its next recheck instead of WINDOW rechecks later.
The ids do not depend on the thread count (a column's and a head's arithmetic is the same on either split), only
the speed does. Pure Python (runs in Pyodide).
"""

from __future__ import annotations

import statistics
from collections import deque

EXPLORE = (2, 1, 1, 2, 2, 1)  # the first blocks' thread counts, per key
WINDOW = 5                    # blocks of each count whose median is its time
RECHECK = 12                  # after exploring, one block in this many runs on the other count
RECENT = 16                   # blocks listed in stats() (and searched for a count's last run: > STALE)
STALE = 4                     # a count's times are dropped once this many other blocks ran since its last


class ThreadChooser:
    def __init__(self):
        self._blocks: dict[tuple, int] = {}                # key -> blocks observed
        self._recent: dict[tuple, deque] = {}              # key -> (threads, ms per step) of its last blocks
        self._times: dict[tuple, deque] = {}               # (key, threads) -> seconds per step of its last blocks

    def pick(self, key: tuple) -> int:
        """The thread count (1 or 2) for the next decode block of this key, e.g. (mode, sequences)."""
        n = self._blocks.get(key, 0)
        if n < len(EXPLORE):
            return EXPLORE[n]
        best = self.best(key)
        return 3 - best if n % RECHECK == 0 else best

    def best(self, key: tuple) -> int:
        one, two = self._times.get((key, 1)), self._times.get((key, 2))
        if not one or not two:
            return 2
        return 1 if statistics.median(one) < statistics.median(two) else 2

    def observe(self, key: tuple, threads: int, seconds_per_step: float) -> None:
        self._blocks[key] = self._blocks.get(key, 0) + 1
        times = self._times.setdefault((key, threads), deque(maxlen=WINDOW))
        recent = self._recent.setdefault(key, deque(maxlen=RECENT))
        gap = next((i for i, (t, _) in enumerate(reversed(recent)) if t == threads), RECENT)  # blocks since it ran
        if gap >= STALE:
            times.clear()  # a recheck: this count's older times are stale
        times.append(seconds_per_step)
        recent.append((threads, round(seconds_per_step * 1e3, 2)))

    def stats(self) -> dict:
        """{"mode/sequences": {"1": ms per step, "2": ms per step, "using": threads, "recent": [[threads, ms per
        step] of the last RECENT blocks]}} (medians of the windows)."""
        out = {}
        for key in self._blocks:
            row = {str(t): round(statistics.median(d) * 1e3, 3)
                   for t in (1, 2) if (d := self._times.get((key, t)))}
            recent = [list(r) for r in self._recent[key]]
            out["/".join(map(str, key))] = {**row, "using": self.best(key), "recent": recent}
        return out
