"""p2p.Swarm inside a user's own loop: real members on loopback (real ZeroMQ sockets, each with
its own network thread), driven by training threads in this process."""

import logging
import random
import signal
import threading

import numpy as np
import pytest
import torch
from torch.nn import functional as F

import p2p
from p2p.training.state import from_bytes_unchecked
from tests.conftest import wait_until

pytestmark = pytest.mark.integration

FAST = dict(membership="local", join_timeout=20, exchange_timeout=1.0)


def make_model(seed=0, dtype=torch.float32):
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).to(dtype)


def batches(seed, n, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    teacher = torch.randn(8, 4, generator=torch.Generator().manual_seed(99))
    for _ in range(n):
        x = torch.randn(16, 8, generator=gen)
        yield x.to(dtype), (x @ teacher).argmax(dim=1)


def user_loop(model, opt, data, *, accumulate=2, autocast=False):
    """What users write: set_to_none zero_grad (the default), clipping, a scheduler, gradient
    accumulation, optionally bf16 autocast on the CPU."""
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=5, gamma=0.5)
    for i, (x, y) in enumerate(data, 1):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = F.cross_entropy(model(x), y) / accumulate
        loss.backward()
        if i % accumulate == 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            opt.step()
            sched.step()
            opt.zero_grad()
    return sched.get_last_lr()


def params(model):
    return torch.cat([p.detach().float().reshape(-1) for p in model.parameters()]).numpy()


@pytest.mark.parametrize("autocast", [False, True])
def test_alone_the_wrapped_loop_is_exactly_the_plain_loop(autocast):
    plain = make_model()
    lr_plain = user_loop(plain, torch.optim.AdamW(plain.parameters(), lr=1e-2), batches(1, 40), autocast=autocast)
    model = make_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    with p2p.Swarm(model, listen="127.0.0.1:0", **FAST) as swarm:
        lr_swarm = user_loop(model, swarm.wrap(opt), batches(1, 40), autocast=autocast)
        assert swarm.step == 20  # one swarm step per optimizer step, not per micro-batch
    assert lr_swarm == lr_plain
    np.testing.assert_array_equal(params(model), params(plain))


def test_alone_diloco_with_a_unit_outer_step_is_local_training():
    plain = make_model()
    user_loop(plain, torch.optim.SGD(plain.parameters(), lr=0.1), batches(2, 40))
    model = make_model()
    with p2p.Swarm(model, listen="127.0.0.1:0", algorithm="diloco", diloco_inner_steps=4, diloco_outer_lr=1.0,
                   diloco_outer_momentum=0.0, **FAST) as swarm:
        user_loop(model, swarm.wrap(torch.optim.SGD(model.parameters(), lr=0.1)), batches(2, 40))
        assert swarm.status()["averaging"]["outer_steps"] == 5
    np.testing.assert_allclose(params(model), params(plain), rtol=1e-5, atol=1e-6)


def test_diloco_is_evaluated_on_its_outer_parameters_and_the_others_on_the_model():
    """Between two outer steps DiLoCo's live model is one peer's local run; an evaluation scores
    the swarm's outer parameters (theta_start) instead, whatever step it lands on."""
    model = make_model()
    with p2p.Swarm(model, listen="127.0.0.1:0", algorithm="diloco", diloco_inner_steps=4, diloco_outer_lr=1.0,
                   diloco_outer_momentum=0.0, **FAST) as swarm:
        opt = swarm.wrap(torch.optim.SGD(model.parameters(), lr=0.1))
        user_loop(model, opt, batches(2, 12))  # 6 steps (2 micro-batches each): an outer step at 4, then 2 local steps
        outer = swarm._driver.call(lambda: swarm.peer.averager.outer_parameters.copy())
        evaluated = swarm.evaluation_model()
        assert evaluated is not model
        np.testing.assert_array_equal(params(evaluated), outer)
        assert not np.allclose(params(model), outer)  # the local steps since the outer step
        assert (swarm.step, swarm.evaluation_step()) == (6, 4)  # labelled with the steps it holds
        user_loop(model, opt, batches(3, 4))  # steps 7-8: an outer step at 8; the copy follows it
        outer = swarm._driver.call(lambda: swarm.peer.averager.outer_parameters.copy())
        np.testing.assert_array_equal(params(swarm.evaluation_model()), outer)
        assert swarm.evaluation_step() == 8
        np.testing.assert_allclose(params(model), outer, rtol=1e-6, atol=1e-7)  # lr 1, just stepped: theta_start
        user_loop(model, opt, batches(4, 4))  # steps 9-10: local again; `p2p export --peer` takes the outer ones
        exported = from_bytes_unchecked(bytes(swarm._driver.call(swarm._model_reply).data)).model
        np.testing.assert_array_equal(torch.cat([exported[n].reshape(-1) for n, _ in model.named_parameters()]).numpy(),
                                      outer)
        assert not np.allclose(params(model), outer)
    other = make_model()
    with p2p.Swarm(other, listen="127.0.0.1:0", **FAST) as swarm:
        assert swarm.evaluation_model() is other and swarm.evaluation_step() == swarm.step


def test_alone_diloco_with_auto_inner_steps_starts_at_the_smallest_h_and_shows_it():
    model = make_model()
    with p2p.Swarm(model, listen="127.0.0.1:0", algorithm="diloco", diloco_inner_steps="auto", **FAST) as swarm:
        user_loop(model, swarm.wrap(torch.optim.SGD(model.parameters(), lr=0.1)), batches(2, 40))
        avg = swarm.status()["averaging"]
        # alone: no round is ever measured, so H stays at the first rung (outer_schedule.py)
        assert (avg["outer_steps"], avg["inner_steps"], avg["inner_steps_auto"]) == (5, 4, 1)
    with pytest.raises(ValueError, match="diloco_inner_steps: expected an integer >= 1 or auto"):
        p2p.Swarm(model, algorithm="diloco", diloco_inner_steps="often")


def test_a_step_the_grad_scaler_skips_is_not_a_swarm_step():
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8)
    with p2p.Swarm(model, listen="127.0.0.1:0", **FAST) as swarm:
        opt = swarm.wrap(opt)
        for k, (x, y) in enumerate(batches(3, 4)):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = F.cross_entropy(model(x), y)
            scaler.scale(loss).backward()
            if k == 2:
                next(model.parameters()).grad[0, 0] = float("inf")  # an overflow
                before = params(model)
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
            if k == 2:
                np.testing.assert_array_equal(params(model), before)  # skipped
                assert swarm.step == 2 and scaler.get_scale() == 2.0**7
        assert swarm.step == 3


def run_member(model, data, results, key, fail=None, **settings):
    """A training thread: the user's loop in a Swarm; records the outcome."""
    try:
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        with p2p.Swarm(model, **FAST, **settings) as swarm:
            results[key] = swarm
            opt = swarm.wrap(opt)
            for k, (x, y) in enumerate(data, 1):
                F.cross_entropy(model(x), y).backward()
                opt.step()
                opt.zero_grad()
                if fail is not None and fail.is_set():
                    raise RuntimeError("the user's loop failed")
                if swarm.stop_requested:
                    break
    except BaseException as exc:  # noqa: BLE001 - recorded for the test to assert on
        results[key + ":error"] = exc


def test_a_bf16_model_averages_with_its_peers():
    first, second = make_model(0, torch.bfloat16), make_model(1, torch.bfloat16)  # start apart
    results = {}
    a = threading.Thread(target=run_member, args=(first, batches(4, 300, torch.bfloat16), results, "a"),
                         kwargs=dict(listen="127.0.0.1:0", linger=3.0, avg_interval=0.01))
    a.start()
    wait_until(lambda: "a" in results and results["a"].address, 20, what="the first member")
    b = threading.Thread(target=run_member, args=(second, batches(5, 300, torch.bfloat16), results, "b"),
                         kwargs=dict(listen="127.0.0.1:0", join=[results["a"].address], linger=3.0, avg_interval=0.01))
    b.start()
    a.join(60), b.join(60)
    assert not a.is_alive() and not b.is_alive() and "a:error" not in results and "b:error" not in results
    assert all(p.dtype == torch.bfloat16 for p in first.parameters())
    assert results["a"].status()["averaging"]["exchanges_completed"] > 5
    # Averaging 100 times a second is far more control traffic than a node normally gets, and still
    # within what each turn reads from a connection (p2p/net/transport.py, ``recv_budget``).
    assert results["a"].status()["recv_drops"] == 0 == results["b"].status()["recv_drops"]
    gap, scale = np.linalg.norm(params(first) - params(second)), np.linalg.norm(params(first))
    assert gap < 0.05 * scale  # apart by ~1.4x the norm at the start; now one model up to bf16 rounding


def test_an_exception_in_the_block_leaves_the_swarm_and_the_others_carry_on():
    models = [make_model(0) for _ in range(3)]
    results, fail = {}, threading.Event()
    threads = []
    for i, model in enumerate(models):
        settings = dict(listen="127.0.0.1:0", linger=0.0)
        if i:
            settings["join"] = [results["m0"].address]
        t = threading.Thread(target=run_member, args=(model, batches(10 + i, 10**9), results, f"m{i}"),
                             kwargs=dict(fail=fail if i == 0 else None, **settings))
        t.start()
        threads.append(t)
        wait_until(lambda: f"m{i}" in results, 20, what=f"member {i} to start")
    wait_until(lambda: all(len(results[f"m{i}"].status()["neighbours"]) == 2 for i in range(3)), 20,
               what="all three members to see each other")
    fail.set()  # member 0's loop raises inside its with block
    threads[0].join(60)
    assert isinstance(results["m0:error"], RuntimeError)  # the user's exception came out of the with block
    gone, survivors = results["m0"], [results["m1"], results["m2"]]
    assert gone.phase == "stopped"
    # the survivors see it as left (announced, not suspected) and keep training and averaging
    for s in survivors:
        wait_until(lambda: any(m["addr"] == gone.address and m["state"] == "left" for m in s.status()["members"]),
                   20, interval_s=0.1, what="the failed member to be seen as left")
    before = [(s.step, s.status()["averaging"]["exchanges_completed"]) for s in survivors]
    wait_until(lambda: all(s.step > b[0] + 100 and s.status()["averaging"]["exchanges_completed"] > b[1] + 5
                           for s, b in zip(survivors, before)), 30, what="the survivors to go on")
    for s in survivors:
        s.stop()  # their loops end, and their with blocks close them
    for t in threads[1:]:
        t.join(30)
        assert not t.is_alive()
    assert [s.phase for s in survivors] == ["stopped", "stopped"] and "m1:error" not in results


def test_creating_and_running_a_swarm_leaves_the_callers_global_state_alone():
    torch_state, py_state, np_state = torch.get_rng_state(), random.getstate(), np.random.get_state()
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    root_handlers, root_level = list(logging.getLogger().handlers), logging.getLogger().level
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with p2p.Swarm(model, listen="127.0.0.1:0", seed=1234, **FAST) as swarm:
        opt = swarm.wrap(opt)
        assert {sig: signal.getsignal(sig) for sig in handlers} == handlers
        for x, y in batches(6, 3):
            F.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad()
    assert torch.equal(torch.get_rng_state(), torch_state)
    assert random.getstate() == py_state
    assert all(np.array_equal(a, b) for a, b in zip(np.random.get_state(), np_state))
    assert logging.getLogger().handlers == root_handlers and logging.getLogger().level == root_level


def test_signal_handlers_only_when_asked_and_restored_on_close():
    before = signal.getsignal(signal.SIGTERM)
    with p2p.Swarm(make_model(), listen="127.0.0.1:0", handle_signals=True, **FAST) as swarm:
        assert signal.getsignal(signal.SIGTERM) is not before
        signal.raise_signal(signal.SIGTERM)
        assert swarm.stop_event.wait(5.0)  # set by the signal watcher thread (signal_stop.py)
    assert signal.getsignal(signal.SIGTERM) is before


def test_misuse_gets_a_clear_error():
    model = make_model()
    with pytest.raises(ValueError, match="diloco_inner_steps: is a setting of algorithm diloco"):
        p2p.Swarm(model, diloco_inner_steps=5)
    with pytest.raises(ValueError, match="bogus: unknown setting"):
        p2p.Swarm(model, bogus=1)
    swarm = p2p.Swarm(model, listen="127.0.0.1:0", **FAST)
    with pytest.raises(ValueError, match="not the Swarm's model"):
        swarm.wrap(torch.optim.SGD(make_model(1).parameters(), lr=0.1))
    opt = swarm.wrap(torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(RuntimeError, match="outside the Swarm's with block"):
        opt.step()
    with pytest.raises(ValueError, match="already wrapped"):
        swarm.wrap(opt)


def test_no_join_address_answering_is_a_join_error():
    from p2p.net.ports import free_ports

    (silent,) = free_ports(1)
    swarm = p2p.Swarm(make_model(), listen="127.0.0.1:0", join=[f"127.0.0.1:{silent}"], membership="local",
                      join_timeout=1.0)
    with pytest.raises(p2p.JoinError, match="no join address answered within 1s"):
        swarm.start()
    assert swarm.phase == "stopped"


def test_a_joiner_takes_the_donors_exact_state_in_many_chunks():
    """State sync over the real transport (chunks large enough for the bulk TCP stream, several
    of them): the joiner's parameters, optimizer state and step are the donor's (the donor is
    idle meanwhile: exactly equal)."""
    from dataclasses import replace

    from p2p.statesync import SyncConfig

    def wide(seed):  # 269k parameters: 3.2 MB of state with AdamW's moments
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            return torch.nn.Sequential(torch.nn.Linear(8, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512),
                                       torch.nn.ReLU(), torch.nn.Linear(512, 4))

    donor_model, joiner_model = wide(0), wide(1)
    with p2p.Swarm(donor_model, listen="127.0.0.1:0", **FAST) as donor:
        opt = donor.wrap(torch.optim.AdamW(donor_model.parameters(), lr=1e-2))
        for x, y in batches(7, 30):
            F.cross_entropy(donor_model(x), y).backward()
            opt.step()
            opt.zero_grad()
        config = replace(p2p.swarm_config(listen="127.0.0.1:0", join=[donor.address], **FAST),
                         sync=SyncConfig(chunk_bytes=300_000))
        joiner = p2p.Swarm(joiner_model, config=config)
        inner = torch.optim.AdamW(joiner_model.parameters(), lr=1e-2)
        with joiner:
            joiner.wrap(inner)  # the optimizer comes after the state: it gets its part now
            assert joiner.step == donor.step == 30
            np.testing.assert_array_equal(params(joiner_model), params(donor_model))
            assert torch.equal(inner.state_dict()["state"][0]["exp_avg"], opt.state_dict()["state"][0]["exp_avg"])
            served = donor.status()["served"][-1]
            assert served["crc"] == joiner.synced.crc and served["bytes"] > 10 * 300_000  # many chunks
            assert joiner.status()["sync"]["phase"] == "done"


def test_a_sync_window_the_transport_cannot_queue_is_refused():
    from dataclasses import replace

    from p2p.statesync import SyncConfig

    with pytest.raises(ValueError, match="sync.window 3 exceeds"):
        replace(p2p.swarm_config(), sync=SyncConfig(window=3))
