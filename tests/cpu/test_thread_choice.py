"""The CPU engine's choice between its two threads and thread 0 alone for each decode block (webinfer/cpu/threads.py):
the rule on a fake clock, and on the threads build that the ids do not depend on it."""

from __future__ import annotations

import asyncio

from webinfer.cpu.threads import EXPLORE, PROBE, WINDOW, ThreadChooser

K = 8  # steps a block


def _run(chooser, key, cost, blocks, steps=K):
    """Run `blocks` blocks whose segments take cost(threads, block index) seconds a step; returns each block's
    segments as planned."""
    plans = []
    for i in range(blocks):
        plan = chooser.plan(key, steps)
        assert sum(k for _, k in plan) == steps and all(k > 0 for _, k in plan), plan
        plans.append(plan)
        for n, _ in plan:
            chooser.observe(key, n, cost(n, i))
    return plans


def _main(plans):
    """The count each block ran most of its steps on."""
    return [max(plan, key=lambda seg: seg[1])[0] for plan in plans]


def test_explores_both_then_keeps_the_faster_and_probes():
    c = ThreadChooser()
    key = ("fast", 1)
    plans = _run(c, key, lambda n, i: {1: 6e-3, 2: 8e-3}[n], 4 * PROBE)
    # exploring: half the steps on each count, which half first alternating (a linear trend cancels)
    assert plans[:EXPLORE] == [[(2, 4), (1, 4)], [(1, 4), (2, 4)], [(2, 4), (1, 4)]][:EXPLORE]
    after = plans[EXPLORE:]
    assert all(p == [(1, K)] or p == [(2, 1), (1, K - 1)] for p in after), after  # one thread kept ...
    probes = [i for i, p in enumerate(plans) if i >= EXPLORE and len(p) == 2]
    assert probes and all(b - a == PROBE for a, b in zip(probes, probes[1:])), probes  # ... two tried for a step
    slow = sum(k for p in after for n, k in p if n == 2)
    assert slow <= len(after) // PROBE + 1, slow  # the slower count's share: a step every PROBE blocks
    assert {k: v for k, v in c.stats()["fast/1"].items() if k != "recent"} == {"1": 6.0, "2": 8.0, "using": 1}
    assert c.stats()["fast/1"]["recent"][-1] == [1, 6.0]  # a block ends on the chosen count
    other = ("exact", 1)  # each key chooses on its own
    _run(c, other, lambda n, i: {1: 12e-3, 2: 9e-3}[n], EXPLORE + 5)
    assert c.best(other) == 2 and c.best(key) == 1


def test_one_step_blocks_alternate_while_exploring():
    c = ThreadChooser()
    plans = _run(c, ("fast", 1), lambda n, i: {1: 6e-3, 2: 8e-3}[n], EXPLORE + 2 * PROBE, steps=1)
    assert [p[0][0] for p in plans[:EXPLORE]] == [2, 1, 2][:EXPLORE] and all(len(p) == 1 for p in plans)
    assert _main(plans[EXPLORE:]) == [1] * (2 * PROBE)


def test_follows_a_machine_that_changes():
    """Two threads faster at first, then (another job takes a core) one: the next probe sees it and the choice
    follows."""
    c = ThreadChooser()
    key = ("fast", 1)
    switch = EXPLORE + 3 * PROBE
    plans = _run(c, key, lambda n, i: (5e-3 if n == 2 else 7e-3) if i < switch else (9e-3 if n == 2 else 7e-3),
                 switch + 4 * PROBE)
    assert _main(plans[switch - 5:switch]) == [2] * 5
    assert _main(plans[switch + 2 * PROBE:]) == [1] * (2 * PROBE)


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
    assert blocks >= EXPLORE + PROBE and set(stats["exact/1"]) == {"1", "2", "using", "recent"}, (blocks, stats)


def test_a_probe_replaces_the_times_taken_while_the_page_started():
    """The page's first blocks share the cores with V8's background compiles: two threads measure slower than one
    while exploring, then faster. The first probe after that switches to two (its older times are dropped),
    not WINDOW probes later."""
    c = ThreadChooser()
    key = ("exact", 1)
    settled = EXPLORE  # the slow period ends with the exploration
    plans = _run(c, key, lambda n, i: (14e-3 if n == 2 else 9e-3) if i < settled else (5e-3 if n == 2 else 9e-3),
                 settled + 3 * PROBE)
    main = _main(plans)
    assert main[settled] == 1  # the exploration chose one thread ...
    first = main.index(2, settled)  # ... and the block after its first probe of two runs two
    assert first <= settled + PROBE + 1 and main[first:].count(1) == 0, plans


def test_a_count_that_ran_lately_keeps_its_window():
    """Only a gap drops times: the exploring blocks (both counts in each) and the blocks right after keep them."""
    c = ThreadChooser()
    key = ("fast", 1)
    _run(c, key, lambda n, i: {1: 6e-3, 2: 8e-3}[n] + i * 1e-6, EXPLORE + 1)
    assert len(c._times[(key, 1)]) == EXPLORE + 1 and len(c._times[(key, 2)]) == EXPLORE
    assert WINDOW > EXPLORE
