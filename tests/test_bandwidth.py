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
