"""The CPU engine's choice of a thread count for each decode block (webinfer/cpu/threads.py): between its two threads
and thread 0 alone, and among 1, 2, ... N threads: the rule on a fake clock, and on the threads build that the ids
do not depend on it (segments of one block on different counts)."""

from __future__ import annotations

import asyncio

import pytest

from webinfer.cpu.threads import EXPLORE, PROBE, WINDOW, ThreadChooser, candidate_counts

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


@pytest.mark.parametrize("threads", [2, 3])
def test_choosing_threads_keeps_the_ids(tiny_llama, threads):
    """The threads build with the choice on (as the page runs its Workers): decode blocks run segments on every
    count while exploring (two threads: 2, 1; three: 3, 2, 1, the count changing inside a block), and every
    request's ids are the one-thread engine's."""
    import webinfer
    from webinfer.factory import EngineOptions

    prompts = [[5, 17, 200, 33, 1], [42, 7], [9, 8, 7, 6, 5, 4, 3]]

    async def run(threads):
        llm = await webinfer.load(tiny_llama, backend="cpu",
                                  options=EngineOptions(cpu_threads=threads, context_tokens=64, decode_block=4))
        if threads > 1:
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
    got, stats, blocks = asyncio.run(run(threads))
    assert got == want
    counts = {str(n) for n in range(1, threads + 1)}
    assert blocks >= EXPLORE + PROBE and set(stats["exact/1"]) == counts | {"using", "recent"}, (blocks, stats)


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


def test_candidate_counts():
    assert candidate_counts(2) == (2, 1) and candidate_counts(3) == (3, 2, 1)
    assert candidate_counts(4) == (4, 2, 1) and candidate_counts(6) == (6, 4, 2, 1)
    assert candidate_counts(8) == (8, 4, 2, 1) and candidate_counts(1) == (1,)


def test_many_counts_explore_each_then_keep_the_fastest_and_probe_the_others_in_turn():
    """Four threads on a machine where two are fastest (say, bandwidth taken by two, the barriers of four cost):
    the exploring blocks give every count an equal share in a rotating order, then two runs the blocks and each
    other count is probed in turn."""
    c = ThreadChooser(candidate_counts(4))
    key = ("fast", 1)
    cost = {1: 9e-3, 2: 5e-3, 4: 6e-3}
    plans = _run(c, key, lambda n, i: cost[n], EXPLORE + 6 * PROBE, steps=9)
    assert plans[:3] == [[(4, 3), (2, 3), (1, 3)], [(2, 3), (1, 3), (4, 3)], [(1, 3), (4, 3), (2, 3)]]
    after = plans[EXPLORE:]
    assert _main(after) == [2] * len(after)
    probed = [p[0][0] for p in after if len(p) == 2]
    assert len(probed) >= 5 and set(probed) == {1, 4}
    assert all(a != b for a, b in zip(probed, probed[1:])), probed  # in turn
    assert c.best(key) == 2 and {k: v for k, v in c.stats()["fast/1"].items() if k != "recent"} == {
        "1": 9.0, "2": 5.0, "4": 6.0, "using": 2}


def test_many_counts_follow_a_machine_that_changes():
    """Four threads fastest, then other work takes cores and one thread is: a probe of one finds it."""
    c = ThreadChooser(candidate_counts(4))
    key = ("exact", 1)
    switch = EXPLORE + 2 * PROBE
    plans = _run(c, key, lambda n, i: ({1: 9e-3, 2: 6e-3, 4: 4e-3} if i < switch else {1: 9e-3, 2: 12e-3, 4: 20e-3})[n],
                 switch + 5 * PROBE)
    assert _main(plans[switch - 3:switch]) == [4] * 3
    assert _main(plans[switch + 4 * PROBE:]) == [1] * PROBE, plans[switch:]
