"""The member table (probe order, sampling, bookkeeping) and a fuzz of the state rules."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from p2p.gossip import ALIVE, DEAD, LEFT, SUSPECT, Gossip, Membership, MembershipConfig, PushPull
from p2p.gossip.table import MemberTable
from p2p.protocol import RemoteProtocolError
from p2p.sim import InvariantChecker


def table_with(n: int, seed: int = 0) -> MemberTable:
    t = MemberTable("me", (ALIVE, "me", "me:1", 0), random.Random(seed))
    t.restore({f"m{i}": (ALIVE, f"m{i}", f"m{i}:1", 0) for i in range(n)}, 0.0)
    return t


def test_probe_order_visits_everyone_once_per_round_in_a_fresh_order():
    t = table_with(10)
    first = [t.next_probe_target() for _ in range(10)]
    second = [t.next_probe_target() for _ in range(10)]
    assert sorted(first) == sorted(second) == [f"m{i}" for i in range(10)]
    assert first != second


def test_probe_order_skips_dead_and_takes_newcomers_in_the_current_round():
    t = table_with(4)
    t.set("m0", (DEAD, "m0", "m0:1", 0), 1.0)
    t.set("new", (ALIVE, "new", "new:1", 0), 1.0)
    seen = [t.next_probe_target() for _ in range(4)]
    assert sorted(seen) == ["m1", "m2", "m3", "new"]


def test_reaped_ids_are_compacted_at_the_end_of_a_round():
    t = table_with(3)
    t.set("m1", (DEAD, "m1", "m1:1", 0), 1.0)
    t.set("m1", None, 2.0)
    t.set("m1", (ALIVE, "m1", "m1:1", 3), 3.0)  # re-learnt before the round ended
    for _ in range(6):
        t.next_probe_target()
    assert sorted(t.ids) == ["m0", "m1", "m2"]


def test_bookkeeping_and_hook():
    seen = []
    t = table_with(3)
    t.on_change = lambda *c: seen.append(c)
    assert t.n_live == 4
    t.set("m0", (SUSPECT, "m0", "m0:1", 0), 1.0)
    t.set("m0", (DEAD, "m0", "m0:1", 0), 2.0)
    assert t.n_live == 3 and t.dead_since == {"m0": 2.0}
    t.set("m0", (ALIVE, "m0", "m0:1", 1), 3.0)
    assert t.n_live == 4 and t.dead_since == {}
    assert seen == [("m0", ALIVE, 0, SUSPECT, 0), ("m0", SUSPECT, 0, DEAD, 0), ("m0", DEAD, 0, ALIVE, 1)]


def test_sample_is_distinct_and_filtered():
    t = table_with(200)
    t.set("m5", (DEAD, "m5", "m5:1", 0), 10.0)
    t.set("m6", (LEFT, "m6", "m6:1", 0), 10.0)
    for _ in range(50):
        picked = t.sample(3, ALIVE, "m7")
        assert len(picked) == 3 and len(set(picked)) == 3
        assert not {"m5", "m6", "m7", "me"} & set(picked)
    small = table_with(3)
    small.set("m0", (DEAD, "m0", "m0:1", 0), 10.0)
    assert sorted(small.sample(5, SUSPECT, "")) == ["m1", "m2"]
    assert sorted(small.sample(5, SUSPECT, "", dead_after=5.0)) == ["m0", "m1", "m2"]  # gossip to the dead
    assert sorted(small.sample(5, SUSPECT, "", dead_after=20.0)) == ["m1", "m2"]


_ids = st.sampled_from(["n1", "n2", "n3", "me"])
_update = st.tuples(st.sampled_from([ALIVE, SUSPECT, DEAD, LEFT]), _ids, st.integers(0, 4), _ids)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.lists(_update, min_size=1, max_size=4)), min_size=1, max_size=25))
def test_no_sequence_of_updates_breaks_the_invariants(batches):
    """Feed arbitrary (valid-shaped) updates and tables; the checker sees every row change."""
    checker = InvariantChecker(seed=0)
    m = Membership(MembershipConfig.lan(), "me", "me:1", random.Random(0), 0.0)
    m.on_change = lambda *c: checker.observe(0.0, "me", *c)
    m.start([], 0.0)
    now = 0.0
    for as_table, batch in batches:
        now += 0.5
        if as_table:
            rows = {u[1]: (u[0], u[1], u[1] + ":1", u[2]) for u in batch if u[1] != "n3"}
            msg = PushPull("n3", False, False, tuple(rows.values()))
        else:
            ups = tuple((k, n, n + ":1", inc, n if k == LEFT else ("" if k == ALIVE else o))
                        for k, n, inc, o in batch)
            msg = Gossip("n3", ups)
        try:
            m.receive("n3:1", msg, now)
        except RemoteProtocolError:
            pass
        m.tick(now)
        assert m.next_deadline() > now
        assert m.state_of("me") == ALIVE
