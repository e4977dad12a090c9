"""The CPU engine's choice between its two threads and thread 0 alone for each decode block (webinfer/cpu/threads.py):
the rule on a fake clock, and on the threads build that the ids do not depend on it."""

from __future__ import annotations

import asyncio

from webinfer.cpu.threads import EXPLORE, RECHECK, WINDOW, ThreadChooser


def _run(chooser, key, cost, blocks):
    """Run `blocks` blocks whose seconds per step is cost(threads, i); returns the thread counts picked."""
    picked = []
    for i in range(blocks):
        n = chooser.pick(key)
        picked.append(n)
        chooser.observe(key, n, cost(n, i))
    return picked


def test_explores_both_then_keeps_the_faster_and_rechecks():
    c = ThreadChooser()
    key = ("fast", 1)
    picked = _run(c, key, lambda n, i: {1: 6e-3, 2: 8e-3}[n], 2 * RECHECK)
    assert tuple(picked[:len(EXPLORE)]) == EXPLORE  # both counts, in an order that cancels a linear trend
    after = picked[len(EXPLORE):]
    assert after.count(1) > 0.9 * len(after) and 2 in after  # one thread kept; two still tried now and then
    assert {k: v for k, v in c.stats()["fast/1"].items() if k != "recent"} == {"1": 6.0, "2": 8.0, "using": 1}
    assert c.stats()["fast/1"]["recent"][-1] == [picked[-1], {1: 6.0, 2: 8.0}[picked[-1]]]
    other = ("exact", 1)  # each key chooses on its own
    _run(c, other, lambda n, i: {1: 12e-3, 2: 9e-3}[n], len(EXPLORE) + 5)
    assert c.best(other) == 2 and c.best(key) == 1


def test_follows_a_machine_that_changes():
    """Two threads faster at first, then (another job takes a core) one: the rechecks see it and the choice
    follows within a few rechecks' windows."""
    c = ThreadChooser()
    key = ("fast", 1)
    switch = len(EXPLORE) + 2 * RECHECK
    picked = _run(c, key, lambda n, i: (5e-3 if n == 2 else 7e-3) if i < switch else (9e-3 if n == 2 else 7e-3),
                  switch + (WINDOW + 1) * RECHECK)
    assert picked[switch - 5:switch].count(2) == 5
    assert picked[-5:].count(1) == 5


def test_choosing_threads_keeps_the_ids(tiny_llama):
    """The threads build with the choice on (as the page runs two Workers): decode blocks alternate between two
    threads and one while exploring, and every request's ids are the one-thread engine's."""
    import webinfer
    from webinfer.factory import EngineOptions

    prompts = [[5, 17, 200, 33, 1], [42, 7], [9, 8, 7, 6, 5, 4, 3]]

    async def run(threads):
        llm = await webinfer.load(tiny_llama, backend="cpu",
                                  options=EngineOptions(cpu_threads=threads, context_tokens=64, decode_block=4))
        if threads == 2:
            llm.engine.runner.choose_threads()
        out = []
        for p in prompts:  # one at a time: blocks of one sequence
            r = await llm.completions.create(prompt=p, max_tokens=40, temperature=0, ignore_eos=True)
            out.append(r["choices"][0]["token_ids"])
        stats = llm.engine.runner.chooser.stats() if llm.engine.runner.chooser else None
        blocks = llm.engine.stats()["decode_blocks"]
        await llm.close()
        return out, stats, blocks

    want, _, _ = asyncio.run(run(1))
    got, stats, blocks = asyncio.run(run(2))
    assert got == want
    assert blocks >= len(EXPLORE) and set(stats["exact/1"]) == {"1", "2", "using", "recent"}, (blocks, stats)


def test_a_recheck_replaces_the_times_taken_while_the_page_started():
    """The page's first blocks share the cores with V8's background compiles: two threads measure slower than one
    while exploring, then faster. The first recheck after that switches to two (its older times are dropped),
    not WINDOW rechecks later."""
    c = ThreadChooser()
    key = ("exact", 1)
    settled = len(EXPLORE)  # the slow period ends with the exploration
    picked = _run(c, key, lambda n, i: (14e-3 if n == 2 else 9e-3) if i < settled else (5e-3 if n == 2 else 9e-3),
                  settled + 2 * RECHECK)
    assert picked[settled:settled + 3] == [1, 1, 1]  # the exploration chose one thread ...
    first = picked.index(2, settled)  # ... and its first recheck of two
    assert first <= settled + RECHECK and picked[first:].count(1) <= 2, picked


def test_a_count_that_ran_lately_keeps_its_window():
    """Only a gap drops times: alternating blocks (the exploration) and the blocks right after it keep them."""
    c = ThreadChooser()
    key = ("fast", 1)
    _run(c, key, lambda n, i: {1: 6e-3, 2: 8e-3}[n] + i * 1e-6, len(EXPLORE) + 1)
    assert len(c._times[(key, 1)]) == 4 and len(c._times[(key, 2)]) == 3
