"""State sync's protocol (p2p/statesync/): a joiner and donors, driven by hand through the real
wire codec, on a logical clock."""

import math
import random
import zlib

import numpy as np
import pytest

from p2p.statesync import StateDonor, StateJoiner, SyncConfig
from p2p.statesync.joiner import DONE, FAILED, TRANSFERRING
from p2p.statesync.messages import BUSY, CAPTURED, OK, PREPARING, SyncChunk, SyncChunkRequest, SyncQuery
from p2p.wire import decode, encode, registered_tags

KEY = "m/10"


class Donor:
    def __init__(self, addr, step, size=10_000, members=(), config=SyncConfig(chunk_bytes=1000), key=KEY, servable=True):
        self.addr, self.step, self.key, self.servable = addr, step, key, servable
        self.data = np.random.default_rng(step).integers(0, 256, size, dtype=np.uint8)
        self.captures = 0
        self.members = list(members)
        self.donor = StateDonor(config, self.describe, self.capture, lambda: self.members)

    def describe(self):
        return (self.step, self.key) if self.servable else None

    def capture(self, optimizer):
        self.captures += 1
        self.optimizer = optimizer
        return (self.data if optimizer else self.data[: len(self.data) // 3]).copy(), self.step, self.key


class Net:
    """Delivers sends through the wire codec; ``down`` addresses swallow what is sent to them."""

    def __init__(self, joiner, donors, config):
        self.joiner, self.donors, self.config = joiner, {d.addr: d for d in donors}, config
        self.now, self.down, self.sent = 0.0, set(), []
        self.tamper = None  # f(msg) -> msg, applied to chunks on their way
        self.lose = lambda to, msg: False  # messages for which it is true never arrive

    def deliver(self, src, sends):
        queue = [(src, s) for s in sends]
        while queue:
            src, send = queue.pop(0)
            self.sent.append(send.msg)
            if send.to in self.down or self.lose(send.to, send.msg):
                continue
            _, msg = decode([bytes(f) for f in encode(send.msg, src)])
            if isinstance(msg, SyncChunk) and self.tamper:
                msg = self.tamper(msg)
                if msg is None:
                    continue  # lost
            if send.to == "joiner":
                out, sender = self.joiner.receive(src, msg, self.now), "joiner"
            else:
                donor = self.donors[send.to]
                out, sender = donor.donor.receive(src, msg, self.now), donor.addr  # it signs as itself
            queue += [(sender, s) for s in out]

    def run(self, until=60.0, step=0.1):
        self.deliver("joiner", self.joiner.start(self.now))
        while not self.joiner.finished and self.now < until:
            self.now += step
            self.deliver("joiner", self.joiner.tick(self.now))
            for d in self.donors.values():
                if d.addr not in self.down:
                    self.deliver(d.addr, d.donor.tick(self.now))
        return self.joiner


def joiner(seeds, own_step=0, config=SyncConfig(chunk_bytes=1000), max_bytes=1 << 20, seed=0, deadline=30.0, **kw):
    return StateJoiner(config, seeds, own_step, KEY, max_bytes, random.Random(seed), 0.0, deadline, **kw)


def test_tags_are_pinned():
    tags = registered_tags()
    assert [tags[t] for t in (44, 45, 46, 47)] == ["SyncQuery", "SyncOffer", "SyncChunkRequest", "SyncChunk"]


def test_a_joiner_finds_the_freshest_member_through_one_address_and_downloads_its_state_in_chunks():
    old, fresh = Donor("a:1", step=100, members=["b:1"]), Donor("b:1", step=500)
    j = Net(joiner(["a:1"]), [old, fresh], SyncConfig(chunk_bytes=1000)).run()
    assert j.phase == DONE and j.outcome.donor == "b:1" and j.outcome.step == 500
    assert j.outcome.data == fresh.data.tobytes() and j.outcome.crc == zlib.crc32(fresh.data)
    assert fresh.captures == 1 and old.captures == 0  # one capture serves the whole transfer
    assert j.stats["chunks"] == 10 and fresh.donor.served[0]["crc"] == j.outcome.crc


def test_a_joiner_that_does_not_want_the_optimizer_state_gets_the_smaller_capture():
    d = Donor("a:1", step=9)
    j = Net(joiner(["a:1"], optimizer=False), [d], None).run()
    assert j.phase == DONE and d.optimizer is False and len(j.outcome.data) == len(d.data) // 3


def test_chunks_are_pipelined_within_the_window():
    d = Donor("a:1", step=9, size=8000)
    net = Net(joiner(["a:1"], config=SyncConfig(chunk_bytes=1000, window=3)), [d], None)
    net.run()
    requests = [m for m in net.sent if isinstance(m, SyncChunkRequest)]
    assert [r.offset for r in requests] == list(range(0, 8000, 1000))
    assert net.joiner.outcome.data == d.data.tobytes()


def test_a_member_that_answers_under_another_name_than_the_one_we_asked_is_a_donor():
    d = Donor("127.0.0.1:7000", step=50)
    net = Net(joiner(["localhost:7000"]), [d], None)
    net.donors["localhost:7000"] = d  # the name we dial reaches it; it answers as its advertised self
    j = net.run()
    assert j.phase == DONE and j.outcome.donor == "127.0.0.1:7000" and j.outcome.step == 50


def test_silence_is_not_nothing_fresher_the_joiner_asks_again():
    """A member answers late (its socket to our restarted address is still reconnecting): the
    joiner must not conclude that nobody is fresher and keep its older checkpoint."""
    d = Donor("a:1", step=500)
    net = Net(joiner(["a:1"], own_step=100, config=SyncConfig(chunk_bytes=1000, query_timeout_s=1.0)), [d], None)
    net.down.add("joiner")  # its answers go nowhere at first
    net.deliver("joiner", net.joiner.start(0.0))
    for now in (1.1, 2.2, 3.3):  # query timeouts pass without an answer
        net.now = now
        net.deliver("joiner", net.joiner.tick(now))
        assert net.joiner.phase != DONE
    net.down.clear()
    j = net.run(until=30)
    assert j.phase == DONE and j.outcome.step == 500


def test_a_silent_join_address_costs_the_joiner_its_deadline_not_a_query_timeout_more():
    """Nobody answers (a wrong --join address): the joiner gives up at its deadline, the join
    timeout. Its rounds of asking used to run a whole query timeout past it (a 3 s join timeout
    took 6 s of sync, then the join waited 3 s more)."""
    net = Net(joiner(["a:1"], deadline=3.0, config=SyncConfig(chunk_bytes=1000, query_timeout_s=2.5)),
              [Donor("a:1", step=500)], None)
    net.down.add("a:1")  # what is sent to it goes nowhere
    net.deliver("joiner", net.joiner.start(0.0))
    while not net.joiner.finished:
        assert net.joiner.next_deadline() <= 3.0
        net.now = max(net.now, net.joiner.next_deadline())
        net.deliver("joiner", net.joiner.tick(net.now))
    assert net.now == 3.0 and net.joiner.phase == DONE and net.joiner.outcome.data is None


def test_answers_only_from_members_still_joining_are_not_nothing_fresher():
    """We join through a member that is syncing itself (it has nothing to give, step -1) while
    the member with state is slow to answer: the joiner must not conclude that nobody is
    fresher and start from a random model (seen in CI: it then pulled the swarm's model down)."""
    a, b = Donor("a:1", step=500), Donor("b:1", step=0, servable=False, members=["a:1"])
    net = Net(joiner(["b:1"], config=SyncConfig(chunk_bytes=1000, query_timeout_s=1.0)), [a, b], None)
    net.down.add("a:1")  # stalled: what is sent to it goes nowhere
    net.deliver("joiner", net.joiner.start(0.0))
    for now in (1.1, 2.2, 3.3, 4.4):  # query timeouts pass with b's answer only
        net.now = now
        net.deliver("joiner", net.joiner.tick(now))
        assert net.joiner.phase != DONE and net.joiner.error == "no member with state answered yet"
    net.down.clear()
    j = net.run(until=30)
    assert j.phase == DONE and j.outcome.donor == "a:1" and j.outcome.step == 500


def test_nodes_started_together_ask_again_soon_and_then_less_often():
    """Every node of a new swarm launched at once: our join address is still syncing itself
    when we ask (step -1). We ask again after 0.25 s, then 0.5, 1, 2 (the query timeout), not a
    whole query timeout each time, so we are done soon after it is (the lab: the last of four
    nodes began training ~2 s late)."""
    b = Donor("b:1", step=0, servable=False)
    net = Net(joiner(["b:1"], config=SyncConfig(chunk_bytes=1000, query_timeout_s=2.0)), [b], None)
    net.deliver("joiner", net.joiner.start(0.0))
    asked = []
    while net.now < 6.0:
        if net.joiner.next_deadline() < math.inf:
            net.now = net.joiner.next_deadline()
        sends = net.joiner.tick(net.now)
        asked += [net.now for s in sends if isinstance(s.msg, SyncQuery)]
        net.deliver("joiner", sends)
    assert [round(t, 6) for t in asked[:5]] == [0.25, 0.75, 1.75, 3.75, 5.75]  # 0.25 s doubling to 2 s
    b.servable = True  # it synced: it holds state (step 0, nothing fresher than ours)
    j = net.run(until=60.0, step=0.05)
    assert j.phase == DONE and j.outcome.data is None and net.now <= 5.75 + 2.0 + 0.05


def test_a_chain_launched_together_asks_the_member_with_state_at_once():
    """Nodes launched together, each joining the one before: our join address b is syncing
    through a itself. Its offer names a (offered_members: its join address while it knows no
    member), so we ask a in the same round and are done without a pause to ask again."""
    from p2p.training.joining import offered_members
    a = Donor("a:1", step=0)  # the first member: holds state, nothing fresher than ours
    b = Donor("b:1", step=0, servable=False, members=offered_members([], ["a:1"]))
    net = Net(joiner(["b:1"], config=SyncConfig(chunk_bytes=1000, query_timeout_s=2.0)), [a, b], None)
    j = net.run(until=10.0, step=0.01)
    assert j.phase == DONE and j.outcome.data is None and net.now <= 0.01 + 1e-9
    assert [type(m).__name__ for m in net.sent].count("SyncQuery") == 2  # b, then a through b's offer
    # once it knows members, those are what it names (a dead join address would cost a joiner
    # a query timeout)
    assert offered_members(["c:1", "d:1"], ["a:1"]) == ["c:1", "d:1"]


def test_nothing_fresher_means_keep_our_own():
    j = Net(joiner(["a:1"], own_step=800), [Donor("a:1", step=800)], None).run()
    assert j.phase == DONE and j.outcome.data is None


def test_offers_of_another_model_and_members_with_nothing_to_give_are_not_donors():
    j = Net(joiner(["a:1", "b:1"]), [Donor("a:1", step=900, key="other/10"), Donor("b:1", step=50, servable=False)],
            None).run()
    assert j.phase == DONE and j.outcome.data is None and j.stats["rejected"] == 1


def test_a_donor_that_goes_silent_mid_transfer_is_replaced_by_the_next():
    config = SyncConfig(chunk_bytes=1000, window=1, timeout_s=2.0)
    first, second = Donor("a:1", step=500, members=["b:1"], config=config), Donor("b:1", step=499, config=config)
    net = Net(joiner(["a:1"], config=config), [first, second], config)
    seen = []

    def die_after_three_chunks(msg):
        donor = net.joiner.progress()["donor"]
        seen.append(donor)
        if len(seen) == 3:
            net.down.add(donor)  # it dies: what we asked of it from now on goes nowhere
        return msg

    net.tamper = die_after_three_chunks
    j = net.run(until=60)
    dead = seen[0]
    assert j.phase == DONE and j.outcome.donor != dead and j.attempts == 2
    assert "sent nothing for 2s" in j.error and j.stats["donors_failed"] == 1
    survivor = second if dead == "a:1" else first
    assert j.outcome.data == survivor.data.tobytes()  # nothing of the dead donor's capture is kept
    assert net.now >= 2.0  # it waited the timeout, not less


@pytest.mark.parametrize("tamper, reason", [
    (lambda m: SyncChunk(m.transfer, m.status, m.snapshot + 1, m.step, m.model_key, m.total, m.offset, m.data)
     if m.offset else m, "another capture"),
    (lambda m: SyncChunk(m.transfer, m.status, m.snapshot, m.step, m.model_key, m.total, m.offset, m.data[:-1]), "not asked"),
    (lambda m: SyncChunk(m.transfer, m.status, m.snapshot, m.step, m.model_key, 10**9, m.offset, m.data), "oversized"),
])
def test_a_donor_breaking_the_rules_is_dropped_and_nothing_it_sent_is_kept(tamper, reason):
    a = Donor("a:1", step=500, members=["b:1"])
    b = Donor("b:1", step=500)
    net = Net(joiner(["a:1"], max_bytes=50_000), [a, b], None)
    broken = {}

    def tamper_first_donor(msg):
        donor = net.joiner.progress()["donor"]
        broken.setdefault("donor", donor)
        return tamper(msg) if donor == broken["donor"] else msg

    net.tamper = tamper_first_donor
    j = net.run()
    assert j.phase == DONE and j.outcome.donor != broken["donor"]
    assert reason in j.error or (reason == "oversized" and "at most" in j.error)
    good = b if j.outcome.donor == "b:1" else a
    assert j.outcome.data == good.data.tobytes()


def test_when_every_donor_fails_the_joiner_asks_again_until_its_deadline():
    config = SyncConfig(chunk_bytes=1000, timeout_s=1.0, query_timeout_s=0.5)
    d = Donor("a:1", step=500, config=config)
    net = Net(joiner(["a:1"], config=config, deadline=5.0), [d], config)
    net.tamper = lambda m: SyncChunk(m.transfer, m.status, m.snapshot, m.step, m.model_key, m.total, m.offset, m.data[:1])
    j = net.run(until=30)
    assert j.phase == FAILED and j.attempts >= 2 and "not asked" in j.error


def test_a_donor_serves_at_most_max_transfers_and_shares_one_capture():
    config = SyncConfig(chunk_bytes=1000, max_transfers=2, reuse_s=5.0)
    d = Donor("a:1", step=10, config=config)
    statuses = [first_chunk(d, f"j{i}:1", i, 0.0).status for i in range(3)]
    assert statuses == [OK, OK, BUSY] and d.captures == 1 and d.donor.stats["busy"] == 1
    assert d.donor.receive("j9:1", SyncQuery(7), 0.0)[0].msg.busy
    # once the transfers went quiet for timeout_s, the donor serves again and drops the capture
    d.donor.tick(20.0)
    assert first_chunk(d, "j3:1", 3, 20.0).status == OK and d.captures == 2


def test_a_request_past_the_start_of_an_unknown_transfer_is_refused():
    d = Donor("a:1", step=10)
    (reply,) = d.donor.receive("j:1", SyncChunkRequest(5, 3000, 1000, True), 0.0)
    assert reply.msg.status == 2 and d.captures == 0


def test_pacing_keeps_a_donor_under_its_rate_in_chunks_that_each_arrive_quickly():
    donor_config = SyncConfig(max_rate_bps=100_000)  # 100 kB/s: chunks of 25 kB, 0.25 s each
    d = Donor("a:1", step=10, size=500_000, config=donor_config)
    net = Net(joiner(["a:1"], config=SyncConfig(timeout_s=1.0)), [d], None)  # the joiner asks for 1 MiB
    j = net.run(until=60, step=0.01)
    assert j.phase == DONE and j.outcome.data == d.data.tobytes() and j.stats["donors_failed"] == 0
    assert j.stats["chunks"] == 20  # the donor's chunk size, not the joiner's
    assert net.now >= 5.0  # 500 kB at 100 kB/s


def test_simultaneous_joiners_spread_over_equally_fresh_donors():
    donors = [Donor(f"d{i}:1", step=1000 - i) for i in range(4)]  # within step_slack of each other
    chosen = []
    for seed in range(8):  # 8 joiners at once: their transfers are all still going (chunks in flight)
        net = Net(joiner([d.addr for d in donors], seed=seed), donors, None)
        net.tamper = lambda msg: None  # the chunks are on their way: none has arrived yet
        net.deliver("joiner", net.joiner.start(0.0))
        assert net.joiner.phase == TRANSFERRING
        chosen.append(net.joiner.progress()["donor"])
    # rendezvous hashing spreads them, and busy donors (2 transfers each) come last
    assert sorted(chosen.count(d.addr) for d in donors) == [2, 2, 2, 2]


def first_chunk(donor, joiner, transfer, now):
    """A transfer's first request: PREPARING at once, the chunk when the donor ticks (captures)."""
    (ack,) = donor.donor.receive(joiner, SyncChunkRequest(transfer, 0, 1000, True), now)
    if ack.msg.status != PREPARING:
        return ack.msg
    assert donor.donor.next_deadline() <= now  # it wants to tick at once
    captured, chunk = [s.msg for s in donor.donor.tick(now) if s.to == joiner and s.msg.transfer == transfer]
    assert captured.status == CAPTURED and captured.total == chunk.total and captured.data.size == 0
    return chunk


def test_a_donor_frees_a_transfer_slot_when_it_served_the_last_byte():
    d = Donor("a:1", step=10, size=3000, config=SyncConfig(chunk_bytes=1000, max_transfers=1))
    assert first_chunk(d, "j:1", 1, 0.0).status == OK
    for offset in (1000, 2000):
        assert d.donor.receive("j:1", SyncChunkRequest(1, offset, 1000, True), 0.0)[0].msg.status == OK
    assert first_chunk(d, "k:1", 2, 0.1).status == OK  # not BUSY


def test_a_donor_that_said_preparing_gets_time_to_capture():
    config = SyncConfig(chunk_bytes=1000, timeout_s=1.0, first_chunk_s=30.0)
    slow = Donor("a:1", step=10, config=config)
    ticks = slow.donor.tick
    slow.donor.tick = lambda now: []  # it answered PREPARING and is still capturing
    net = Net(joiner(["a:1"], config=config), [slow], config)
    j = net.run(until=5.0)
    assert j.phase == TRANSFERRING and j.attempts == 1 and j.stats["donors_failed"] == 0  # not given up
    slow.donor.tick = ticks
    assert net.run(until=60).phase == DONE


def test_a_chunk_lost_in_transit_is_asked_for_again_before_the_donor_is_given_up():
    """A restarted node at a known address: the donor's old connection to it swallows the first
    chunk it writes. The joiner asks once more and completes from the same donor."""
    config = SyncConfig(chunk_bytes=1000, timeout_s=1.0)
    d = Donor("a:1", step=10, config=config)
    net = Net(joiner(["a:1"], config=config), [d], config)
    lost = []
    net.tamper = lambda msg: (lost.append(msg.offset) or None) if msg.status == OK and not lost else msg
    j = net.run(until=60)
    assert j.phase == DONE and j.attempts == 1 and j.stats["retries"] == 1 and lost == [0]
    assert j.outcome.data == d.data.tobytes()


def test_a_donor_that_dies_before_it_answers_is_given_up_after_the_short_timeout():
    config = SyncConfig(chunk_bytes=1000, timeout_s=1.0, first_chunk_s=30.0, step_slack=0)
    a, b = Donor("a:1", step=20, members=["b:1"], config=config), Donor("b:1", step=10, config=config)
    net = Net(joiner(["a:1"], config=config), [a, b], config)
    net.lose = lambda to, msg: to == "a:1" and isinstance(msg, SyncChunkRequest)  # a dies once it offered
    j = net.run(until=60)
    assert j.phase == DONE and j.outcome.donor == "b:1" and j.attempts == 2
    assert "a:1 sent nothing for 1s" in j.error and net.now < 10  # not the 30 s a capture may take


@pytest.mark.parametrize("tag, values, tensors", [
    (45, [1, 2, KEY, ["a:1"] * 65, False, 0], []),  # an offer listing too many members
    (45, [1, -5, KEY, [], False, 0], []),  # a negative step
    (45, [1, 5, KEY, [], False, -1], []),  # a negative chunk size
    (46, [1, -1, 10, True], []),  # a negative offset
    (46, [1, 0, 0, True], []),  # an empty chunk asked for
    (46, [1, 0, 1 << 30, True], []),  # a chunk larger than any allowed
    (47, [1, 0, 1, 1, KEY, 4, 0, None], [("uint8", [8])]),  # more data than the state is long
    (47, [1, 0, 1, 1, KEY, 4, 0, None], [("float32", [1])]),  # data that is not bytes
    (47, [1, 9, 1, 1, KEY, 4, 0, None], [("uint8", [0])]),  # an unknown status
])
def test_malformed_records_from_a_peer_are_rejected_by_the_codec(tag, values, tensors):
    import msgpack

    from p2p.protocol import RemoteProtocolError
    from p2p.wire import PROTOCOL_VERSION

    header = msgpack.packb([PROTOCOL_VERSION, tag, "x:1", values, [list(t) for t in tensors]])
    frames = [header] + [bytes(np.zeros(shape, dtype=dtype).nbytes) for dtype, shape in tensors]
    with pytest.raises(RemoteProtocolError):
        decode(frames)
