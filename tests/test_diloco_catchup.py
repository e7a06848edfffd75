"""The catch-up's range protocol (p2p/averaging/outer_catchup.py), donor and puller alone: one
request names the rounds missed, the donor answers all it holds in order, the puller replays
what came in round order and re-asks only for the rounds not all in. The swarm-level cases (a
cut peer caught up, a donor without the rounds, lost answers then the pull) are in
tests/test_diloco_repair.py."""

import math
from collections import defaultdict

import numpy as np
import pytest

from p2p.averaging.donor_pull import MAX_ATTEMPTS
from p2p.averaging.outer_catchup import (LOG_ROUNDS, MAX_ANSWER, CatchUpMissing, CatchUpPuller, CatchUpRange, CatchUpRequest,
                                         CatchUpShare, ShareLog, replay_round)
from p2p.averaging.outer_repair import Pulled
from p2p.averaging.robust import RobustMixing
from p2p.bandwidth import BandwidthMonitor
from p2p.compression import decompress, make_compressor
from p2p.compression.messages import compressed_fields
from p2p.protocol import RemoteProtocolError

N = 20_000
KEY = f"m/{N}"
SENDERS = ("a", "b", "c")
LR, MU = 0.7, 0.9


def stats():
    return defaultdict(int)


def shares(rounds, seed=0):
    """round -> sender -> packed SparseLoCo share."""
    rng = np.random.default_rng(seed)
    codec = make_compressor("sparseloco")
    return {r: {s: codec.compress(rng.standard_normal(N).astype(np.float32)) for s in SENDERS} for r in rounds}


def donor(log_rounds, budget=10**9):
    """A donor whose copy agreed with the swarm's after each of ``log_rounds``: all confirmed."""
    log = ShareLog(N, KEY, stats(), budget)
    for r, by_sender in log_rounds.items():
        for s, c in by_sender.items():
            log.keep(r, s, c, r)
        log.sealed(r, SENDERS)
        log.confirm_before(r + 1)
    return log


def puller(base_round, current, budget=10**9):
    p = CatchUpPuller(N, KEY, BandwidthMonitor(), stats(), LR, MU, RobustMixing(False, {}), budget)
    start, momentum = np.ones(N, np.float32), np.zeros(N, np.float32)
    p.note_begin(base_round, start, momentum)
    p.note_agreed(base_round)
    own = (np.zeros(N, np.float32), np.zeros(N, np.float32))
    assert p.begin("d", current, own, 0.0, share_bytes=10_000, senders=len(SENDERS), wait_s=1.0)
    return p


def expected(log_rounds, rounds):
    """(theta_start, m) after replaying ``rounds`` from the base, by hand."""
    start, m = np.ones(N, np.float32), np.zeros(N, np.float32)
    for r in rounds:
        d = replay_round([decompress(log_rounds[r][s], N) for s in SENDERS], RobustMixing(False, {}))
        m = np.float32(MU) * m + d
        start = start - np.float32(LR) * (d + np.float32(MU) * m)
    return start, m


def deliver(p, sends, now, keep=lambda msg: True):
    for x in sends:
        if keep(x.msg):
            p.receive("d", x.msg, now)


def test_a_range_is_answered_whole_in_round_order_and_the_next_range_asked_at_once():
    log_rounds = shares(range(2, 6))
    log = donor(log_rounds)
    p = puller(2, 5)
    assert MAX_ANSWER // len(SENDERS) == 2  # rounds per request here
    (ask,) = p.tick(0.0)
    assert isinstance(ask.msg, CatchUpRange) and (ask.msg.first, ask.msg.last) == (2, 3)
    out = log.receive("me", ask.msg, current=6)
    assert [(x.msg.round, x.msg.sender) for x in out] == [(r, s) for r in (2, 3) for s in SENDERS]
    deliver(p, out, 0.5)
    assert p.pull.next == 4 and p.next_deadline() == 0.5  # replayed; the rest is asked for now
    (rest,) = p.tick(0.5)
    assert (rest.msg.first, rest.msg.last) == (4, 4)
    deliver(p, log.receive("me", rest.msg, current=6), 0.6)
    done = p.take()
    assert done is not None and done.round == 5 and p.stats["catch_ups_completed"] == 1
    want_start, want_m = expected(log_rounds, (2, 3, 4))
    np.testing.assert_array_equal(done.start, want_start)
    np.testing.assert_array_equal(done.momentum, want_m)


def test_the_one_round_request_of_the_first_protocol_is_still_answered():
    log = donor(shares(range(0, 3)))
    out = log.receive("old", CatchUpRequest(1, KEY), current=3)
    assert [(x.msg.round, x.msg.sender) for x in out] == [(1, s) for s in SENDERS]


def test_a_donor_answers_what_it_holds_then_missing_and_stops():
    log_rounds = shares(range(0, 5))
    log = donor(log_rounds)
    del log._sealed[2]  # a round it does not hold (replayed away, say)
    out = log.receive("me", CatchUpRange(0, 4, KEY), current=5)
    assert [type(x.msg) for x in out] == [CatchUpShare] * 6 + [CatchUpMissing]
    assert out[-1].msg.round == 2  # the first one missing; nothing after it


def test_a_range_reaching_past_the_donors_round_is_finished_when_it_gets_there():
    log_rounds = shares(range(0, 4))
    log = donor({r: log_rounds[r] for r in (0, 1)})
    out = log.receive("me", CatchUpRange(0, 3, KEY), current=2)
    assert {x.msg.round for x in out} == {0, 1}  # the rest waits
    for r in (2, 3):
        for s, c in log_rounds[r].items():
            log.keep(r, s, c, r)
        assert log.sealed(r, SENDERS) == []  # reached, but not confirmed yet
        log.confirm_before(r + 1)  # the next round's sketches agreed
        later = log.serve_due()
        assert [x.msg.round for x in later] == [r] * len(SENDERS)
    assert log.sealed(4, ()) == []  # answered in full: nothing waits any more


def test_a_round_is_served_once_confirmed_and_a_replayed_one_with_the_swarms_set():
    """Our round 1 averaged {a, b} (c's share came late); the swarm's averaged all three. Served
    at once, it would land the puller apart by that round's difference (outer_catchup.py, "Only
    confirmed rounds are served"): it waits until the replay repair reseals it."""
    log_rounds = shares(range(0, 2))
    log = donor({0: log_rounds[0]})
    for s, c in log_rounds[1].items():
        log.keep(1, s, c, 1)
    log.sealed(1, ("a", "b"))  # c's share is in the log too: it came late
    out = log.receive("me", CatchUpRange(0, 1, KEY), current=2)
    assert [x.msg.round for x in out] == [0] * len(SENDERS)  # round 1 waits
    assert log.serve_due() == []
    log.reseal(1, SENDERS)  # the next round's sketches: apart; replayed with the swarm's set
    later = log.serve_due()
    assert [(x.msg.round, x.msg.sender, x.msg.mixed) for x in later] == [(1, s, SENDERS) for s in SENDERS]


def test_a_donor_rejects_a_range_wider_than_its_log_or_backwards():
    log = donor({})
    for first, last in ((3, 2), (-1, 2), (0, LOG_ROUNDS)):
        with pytest.raises(RemoteProtocolError):
            log.receive("me", CatchUpRange(first, last, KEY), current=10)


def test_a_partial_answer_is_kept_and_only_the_rounds_not_all_in_are_asked_again():
    log_rounds = shares(range(0, 4))
    log = donor(log_rounds)
    p = puller(0, 4)
    (ask,) = p.tick(0.0)
    assert (ask.msg.first, ask.msg.last) == (0, 1)
    out = log.receive("me", ask.msg, current=4)
    # round 0 whole, one share of round 1 (the others lost on the way)
    deliver(p, out, 0.1, keep=lambda m: m.round == 0 or m.sender == "a")
    assert p.pull.next == 1 and p.take() is None
    assert p.tick(0.2) == []  # in flight until the deadline (the range's bytes)
    t = p.next_deadline()
    assert math.isfinite(t)
    assert p.tick(t) == [] and p.stats["repairs_failed"] == 1  # missed: back off
    (again,) = p.tick(p.next_deadline())
    assert (again.msg.first, again.msg.last) == (1, 2)  # never what was replayed
    now = p.next_deadline() + 0.1
    deliver(p, log.receive("me", again.msg, current=4), now)
    assert p.stats["repair_chunks_unasked"] == 1  # round 1's "a" came twice: kept once
    (last,) = p.tick(now)
    assert (last.msg.first, last.msg.last) == (3, 3)
    deliver(p, log.receive("me", last.msg, current=4), now)
    done = p.take()
    assert done is not None
    np.testing.assert_array_equal(done.start, expected(log_rounds, range(4))[0])


def test_missing_drops_the_catch_up_and_the_same_base_is_never_tried_again():
    p = puller(0, 3)
    (ask,) = p.tick(0.0)
    p.receive("d", CatchUpMissing(0, KEY), 0.1)
    assert p.pull is None and not p.active and p.stats["repair_stale"] == 1
    own = (np.zeros(N, np.float32), np.zeros(N, np.float32))
    assert not p.begin("d", 3, own, 1.0, 10_000, 3, 1.0)  # diloco.py pulls instead


def test_unanswered_asks_are_bounded_never_wider_and_then_dropped():
    p = puller(0, 5)
    asks, now = [], 0.0
    while p.pull is not None and now < 10_000:
        sent = p.tick(now)
        asks += [(x.msg.first, x.msg.last) for x in sent]
        now = max(now, p.next_deadline())
    assert p.pull is None and len(asks) == MAX_ATTEMPTS and set(asks) == {(0, 1)}
    assert p.stats["repairs_failed"] == MAX_ATTEMPTS


def test_a_donor_flooding_shares_past_the_budget_is_refused():
    budget = 60_000
    p = puller(0, 2, budget=budget)
    p.tick(0.0)
    big = make_compressor("sparseloco").compress(np.random.default_rng(1).standard_normal(N).astype(np.float32))
    senders = tuple(f"s{i:03d}" for i in range(400))
    with pytest.raises(RemoteProtocolError) as err:
        for s in senders:  # a set far larger than any round's: kept packed until the budget says no
            p.receive("d", CatchUpShare(**compressed_fields(big), round=1, sender=s, mixed=senders, model_key=KEY), 0.1)
    assert err.value.reason == "oversized"
    assert p.pull.got_bytes <= 2 * budget


def catch_up(p, log, now):
    """Run the catch-up in flight against ``log`` to its end; what it landed."""
    while p.pull is not None:
        for ask in p.tick(now):
            deliver(p, log.receive("me", ask.msg, current=100), now)
        now += 0.1
    return p.take()


def test_a_landed_catch_up_is_the_base_of_one_more_and_then_the_full_pull_mends():
    """A peer back from a cut link whose catch-up landed can miss the next round's outer step
    (rounds.py's "Overtaken"): one more catch-up from the state it landed mends that, where the
    full pull moved all of theta_start (outer_catchup.py, "When"); a third, before the copy
    agrees again, is refused."""
    log_rounds = shares(range(2, 9))
    log = donor(log_rounds)
    p = puller(2, 5)
    first = catch_up(p, log, 0.0)
    assert first.round == 5
    p.note_landed(first)
    own = (np.zeros(N, np.float32), np.zeros(N, np.float32))
    assert p.begin("d", 7, own, 1.0, 10_000, len(SENDERS), 1.0)  # rounds 5 and 6 only
    second = catch_up(p, log, 1.0)
    want_start, want_m = expected(log_rounds, range(2, 7))
    assert second.round == 7 and p.stats["catch_ups_completed"] == 2
    np.testing.assert_array_equal(second.start, want_start)  # the swarm's, as if never apart
    np.testing.assert_array_equal(second.momentum, want_m)
    p.note_landed(second)
    assert not p.begin("d", 8, own, 2.0, 10_000, len(SENDERS), 1.0)  # diloco.py pulls instead
    # an agreed round is a base again, and its landings may chain once more
    p.note_begin(8, np.ones(N, np.float32), np.zeros(N, np.float32))
    p.note_agreed(8)
    assert p.begin("d", 9, own, 3.0, 10_000, len(SENDERS), 1.0)


def test_a_landed_state_older_than_the_base_is_not_taken():
    p = puller(4, 6)
    older = Pulled(3, np.zeros(N, np.float32), np.zeros(N, np.float32), np.zeros(N, np.float32),
                   np.zeros(N, np.float32), "d")
    p.drop_if_donor_gone([])  # the catch-up from base 4 ends without landing
    p.note_landed(older)
    own = (np.zeros(N, np.float32), np.zeros(N, np.float32))
    assert not p.begin("d", 6, own, 1.0, 10_000, len(SENDERS), 1.0)  # base 4 was tried; 3 is no base
