"""When the node gives the C heap's free memory back (p2p/net/heap.py): on growth of its
anonymous RSS, not on a count of messages."""

from p2p.net.heap import GROW_BYTES, Trimmer, anonymous_rss, grow_bytes_for

MB = 1 << 20


class FakeProcess:
    def __init__(self, rss: int) -> None:
        self.now, self.trims, self.freed_by_trim = rss, 0, 0

    def rss(self) -> int:
        return self.now

    def trim(self, pad: int) -> int:
        self.trims += 1
        self.now -= self.freed_by_trim
        return 1


def test_a_steady_node_never_trims_and_growth_past_the_step_trims_once():
    p = FakeProcess(300 * MB)
    t = Trimmer(8 * MB, p.rss, p.trim)
    p.now += 7 * MB
    assert not t.check() and p.trims == 0
    p.now += 2 * MB  # a flood: 9 MB over the start
    p.freed_by_trim = 8 * MB
    assert t.check() and p.trims == 1 and t.trims == 1
    assert not t.check()  # back near the start: nothing more to do


def test_live_growth_costs_one_trim_per_step_not_one_per_check():
    p = FakeProcess(300 * MB)
    t = Trimmer(8 * MB, p.rss, p.trim)
    p.now += 10 * MB  # live data: a trim frees nothing
    assert t.check() and not t.check() and not t.check()
    p.now += 8 * MB
    assert t.check() and p.trims == 2


def test_growth_counts_from_the_lowest_rss_seen():
    p = FakeProcess(300 * MB)
    t = Trimmer(8 * MB, p.rss, p.trim)
    p.now -= 50 * MB  # memory given back otherwise (a model freed)
    assert not t.check()
    p.now += 9 * MB
    assert t.check()


def test_without_malloc_trim_nothing_is_read_or_called():
    calls = []
    t = Trimmer(8 * MB, lambda: calls.append(1) or 0, None)
    assert not t.check() and calls == []


def test_the_anonymous_rss_is_read_from_proc():
    rss = anonymous_rss()
    assert rss is None or rss > MB


def test_a_rounds_swing_of_model_copies_is_not_worth_a_trim():
    assert grow_bytes_for(50_000) == GROW_BYTES  # a small model: the flood threshold
    model = 4 * 2_177_546  # the wide task's fp32 copy
    p = FakeProcess(300 * MB)
    t = Trimmer(grow_bytes_for(model), p.rss, p.trim)
    p.now += 4 * model  # a round's temporaries, not yet given back by glibc
    assert not t.check() and p.trims == 0
    p.now += 5 * model  # more than a round's swing: a flood or a leak
    assert t.check() and p.trims == 1
