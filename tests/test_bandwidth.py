"""Bandwidth policy: pure functions and the monitor, table-driven."""

import random

import pytest

from p2p.bandwidth import BandwidthConfig, BandwidthMonitor, ewma, required_interval


@pytest.mark.parametrize("exchange_s, fraction, interval", [
    (1.0, 0.5, 1.0),  # busy half the time
    (1.0, 0.25, 3.0),
    (0.2, 1.0, 0.0),  # no budget limit
    (2.0, 0.1, 18.0),
])
def test_required_interval_meets_the_budget(exchange_s, fraction, interval):
    got = required_interval(exchange_s, fraction)
    assert got == pytest.approx(interval)
    assert exchange_s / (exchange_s + got) == pytest.approx(fraction)


def test_ewma():
    assert ewma(None, 5.0, 0.3) == 5.0
    assert ewma(10.0, 0.0, 0.3) == pytest.approx(7.0)


def test_interval_stretches_with_slow_links_and_is_capped():
    m = BandwidthMonitor(BandwidthConfig(comm_fraction=0.25, max_interval_s=5.0))
    assert m.interval(0.05, ["a"]) == 0.05  # nothing measured yet: the base
    m.observe("a", 10_000_000, 1.0)
    assert m.interval(0.05, ["a"]) == pytest.approx(3.0)
    m.observe("a", 10_000_000, 10.0)  # link got much slower
    assert m.interval(0.05, ["a"]) == 5.0


def test_faster_partners_are_chosen_more_often_and_new_ones_explored():
    m = BandwidthMonitor(BandwidthConfig())
    m.observe("fast", 100_000_000, 1.0)
    m.observe("slow", 10_000_000, 1.0)
    rng = random.Random(0)
    picks = [m.choose(["fast", "slow", "new"], rng) for _ in range(3000)]
    assert picks.count("fast") > 4 * picks.count("slow")
    assert picks.count("new") > 4 * picks.count("slow")  # unmeasured: treated as the best


def test_uniform_choice_when_disabled():
    m = BandwidthMonitor(BandwidthConfig(prefer_fast_partners=False))
    m.observe("fast", 100_000_000, 1.0)
    picks = [m.choose(["fast", "slow"], random.Random(i)) for i in range(2000)]
    assert 800 < picks.count("slow") < 1200


def test_compression_ladder_steps_up_then_back_down():
    m = BandwidthMonitor(BandwidthConfig(comm_fraction=0.5, max_interval_s=2.0))
    m.observe("a", 1000, 5.0)  # an exchange takes 5 s: the budget needs 5 s pauses > 2 s
    assert m.compression(["a"], 0.05) == "fp16"
    assert m.compression(["a"], 0.05) == "fp16"  # no new measurement: stays
    m.observe("a", 1000, 5.0)
    assert m.compression(["a"], 0.05) == "int8"
    m.observe("a", 1000, 0.01)  # now fast
    assert m.compression(["a"], 0.05) == "fp16"


def test_forget_drops_departed_peers():
    m = BandwidthMonitor()
    m.observe("a", 1, 1.0)
    m.observe("b", 1, 1.0)
    m.forget(["b"])
    assert set(m.report()) == {"b"}


@pytest.mark.parametrize("kwargs", [dict(comm_fraction=0), dict(comm_fraction=1.5), dict(ewma_alpha=0),
                                    dict(min_interval_s=2, max_interval_s=1)])
def test_bad_config_is_refused(kwargs):
    with pytest.raises(ValueError):
        BandwidthConfig(**kwargs)


def test_cpu_rule_keeps_the_network_threads_cpu_within_the_share_of_the_compute():
    """A fast link (0.1 s exchanges: the wall-time rule alone pauses 0.1 s) on a CPU-bound
    machine: each cycle costs the network thread 0.2 CPU s while training gets 0.5 CPU s per
    second. At half of the compute a cycle must last 0.2 / (0.5 * 0.5) = 0.8 s."""
    m = BandwidthMonitor(BandwidthConfig(comm_fraction=0.5, ewma_alpha=1.0))
    m.observe("a", 17_000_000, 0.1)
    assert m.interval(0.05, ["a"]) == pytest.approx(0.1)  # no CPU figures yet: the link rule
    m.observe_cpu(10.0, 1.0, 20.0)
    m.observe_cpu(11.0, 1.2, 20.5)  # one cycle: 0.2 s network CPU, 0.5 s of compute CPU in 1 s
    pause = m.interval(0.05, ["a"])
    assert pause == pytest.approx(0.8 - 0.1)  # the cycle is the exchange plus the pause
    cycle = 0.1 + pause
    assert 0.2 / (0.5 * cycle) == pytest.approx(0.5)  # network CPU / compute CPU = the fraction


def test_cpu_rule_gives_way_when_the_cpu_is_cheap_and_is_capped():
    m = BandwidthMonitor(BandwidthConfig(comm_fraction=0.5, ewma_alpha=1.0, max_interval_s=5.0))
    m.observe("a", 17_000_000, 2.0)  # a slow link: 2 s of pause from the link rule
    m.observe_cpu(0.0, 0.0, 0.0)
    m.observe_cpu(4.0, 0.04, 3.9)  # cheap cycles: the link rule decides
    assert m.interval(0.05, ["a"]) == pytest.approx(2.0)
    m.observe_cpu(5.0, 1.04, 3.95)  # 1 CPU s per cycle against a starved trainer (0.05 CPU s/s)
    assert m.interval(0.05, ["a"]) == 5.0


def test_cpu_rule_is_off_while_not_training():
    m = BandwidthMonitor(BandwidthConfig(comm_fraction=0.5, ewma_alpha=1.0))
    m.observe_cpu(0.0, 0.0, 0.0)
    m.observe_cpu(1.0, 0.5, 0.5)
    assert m.interval(0.05, ["a"]) > 1.0
    m.observe_cpu(2.0, None, None)  # lingering: the estimates are kept but not extended ...
    m.observe_cpu(3.0, 0.6, 0.6)  # ... and the next cycle after it starts a fresh window
    assert m.cpu.last == (3.0, 0.6, 0.6)
