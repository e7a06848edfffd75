"""Checkpoints and state blobs (p2p/training/state.py, checkpoints.py) and every algorithm's
state through them."""

import io
import random

import numpy as np
import pytest
import torch

from p2p.averaging.base import AveragingConfig
from p2p.averaging.diloco import DiLoCoConfig
from p2p.averaging.registry import ALGORITHMS
from p2p.sim.avg_port import ArrayPort
from p2p.training.checkpoints import CheckpointStore
from p2p.training.state import (StateError, TrainingState, cpu_copy, from_bytes, from_checkpoint, to_bytes,
                                to_checkpoint)
from tests.test_averaging_algorithms import deliver

KEY = "Net/66/1"


def model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 2))


def trained_state(step=7):
    m = model()
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)
    for _ in range(3):
        m(torch.randn(5, 4)).sum().backward()
        opt.step()
    return m, TrainingState(step, KEY, "diloco", cpu_copy(m.state_dict()), cpu_copy(opt.state_dict()),
                            {"theta_start": np.arange(66, dtype=np.float32), "round": 3},
                            {"scheduler": {"last_epoch": 2}}, {"task": "t", "incarnation": 4})


def test_a_state_survives_the_wire_blob():
    m, state = trained_state()
    back = from_bytes(to_bytes(state).tobytes(), m.state_dict(), KEY)
    assert back.step == 7 and back.algorithm == "diloco"
    assert all(torch.equal(back.model[k], v) for k, v in state.model.items())
    assert back.algorithm_state["round"] == 3
    np.testing.assert_array_equal(back.algorithm_state["theta_start"], state.algorithm_state["theta_start"])
    fresh = torch.optim.Adam(model().parameters(), lr=5.0)
    fresh.load_state_dict(back.optimizer)  # the optimizer takes it: groups, betas, step and moments
    assert fresh.param_groups[0]["lr"] == 1e-3 and fresh.param_groups[0]["betas"] == (0.9, 0.999)
    assert torch.equal(fresh.state_dict()["state"][0]["exp_avg"], state.optimizer["state"][0]["exp_avg"])


def corrupt(blob: bytes, how: str) -> bytes:
    if how == "truncated":
        return blob[: len(blob) // 2]
    if how == "header":
        return (10**9).to_bytes(8, "little") + blob[8:]
    if how == "garbage":
        return bytes(range(256)) * 4
    raise AssertionError(how)


@pytest.mark.parametrize("how", ["truncated", "header", "garbage"])
def test_a_broken_blob_is_a_state_error(how):
    m, state = trained_state()
    with pytest.raises(StateError):
        from_bytes(corrupt(to_bytes(state).tobytes(), how), m.state_dict(), KEY)


def test_a_blob_of_another_model_or_with_nan_is_refused():
    m, state = trained_state()
    with pytest.raises(StateError, match="model"):
        from_bytes(to_bytes(state).tobytes(), m.state_dict(), "Other/66/2")
    other = torch.nn.Sequential(torch.nn.Linear(4, 9), torch.nn.BatchNorm1d(9), torch.nn.Linear(9, 2))
    with pytest.raises(StateError, match="0.weight"):
        from_bytes(to_bytes(state).tobytes(), other.state_dict(), KEY)
    state.model["2.bias"] = state.model["2.bias"].double()  # another dtype
    with pytest.raises(StateError, match="2.bias: torch.float64"):
        from_bytes(to_bytes(state).tobytes(), m.state_dict(), KEY)
    state.model["2.bias"] = state.model["2.bias"].float()
    state.model["0.weight"][0, 0] = float("nan")
    with pytest.raises(StateError, match="NaN"):
        from_bytes(to_bytes(state).tobytes(), m.state_dict(), KEY)


def test_checkpoints_are_plain_dicts_written_atomically_and_pruned(tmp_path):
    store = CheckpointStore(tmp_path, keep=2)
    for step in (10, 20, 30):
        _, state = trained_state(step)
        store.save(state)
    assert [p.name for p in store.paths()] == ["ckpt-000000000030.pt", "ckpt-000000000020.pt"]
    data = torch.load(store.paths()[0], weights_only=True)  # no pickled objects: plain data only
    assert data["format"] == "p2p-checkpoint" and data["step"] == 30 and data["info"]["incarnation"] == 4
    state, path = store.latest(KEY, task="t")
    assert state.step == 30 and path == store.paths()[0] and state.extra["scheduler"]["last_epoch"] == 2
    assert not list(tmp_path.glob(".ckpt-*"))  # no temporary files left behind


@pytest.mark.parametrize("damage", ["truncated", "garbage"])
def test_a_damaged_newest_checkpoint_falls_back_to_the_previous_one_loudly(tmp_path, damage, caplog):
    store = CheckpointStore(tmp_path, keep=3)
    for step in (10, 20):
        store.save(trained_state(step)[1])
    newest = store.paths()[0]
    newest.write_bytes(corrupt(newest.read_bytes(), damage))
    state, path = store.latest(KEY)
    assert state.step == 10 and path.name == "ckpt-000000000010.pt"
    assert store.skipped and "ckpt-000000000020.pt" in store.skipped[0]
    assert "unreadable" in caplog.text


def test_a_checkpoint_of_another_model_task_or_format_is_refused_not_skipped(tmp_path):
    store = CheckpointStore(tmp_path)
    store.save(trained_state(10)[1])
    with pytest.raises(StateError, match="model 'Net/66/1', this one is 'Net/99/9'"):
        store.latest("Net/99/9")
    with pytest.raises(StateError, match="task 't', this node runs 'u'"):
        store.latest(KEY, task="u")
    data = to_checkpoint(trained_state(11)[1])
    data["version"] = 99
    torch.save(data, tmp_path / "ckpt-000000000011.pt")
    with pytest.raises(StateError, match="format version 99"):
        store.latest(KEY)


def test_no_checkpoint_is_none(tmp_path):
    assert CheckpointStore(tmp_path / "absent").latest(KEY) is None


# -- every algorithm's state --------------------------------------------------------------------
CFG = AveragingConfig(interval_s=0.1, exchange_timeout_s=1.0, round_timeout_s=1.0)


def pair(name):
    options = DiLoCoConfig(inner_steps=1) if name == "diloco" else None
    cls = ALGORITHMS[name]
    ports = [ArrayPort(np.full(6, float(v)), "m/6", immediate=True) for v in (1, 3)]
    algs = [cls(CFG, p, random.Random(i), 0.0, options=options) for i, p in enumerate(ports)]
    return ports, algs, options


def exercise(ports, algs, rounds=6, start=0.0):
    """Both peers step and exchange a few times (so their state is not the initial one)."""
    now = start
    for step in range(1, rounds + 1):
        now += 0.2
        for p in ports:
            p.step += 1
            p.grad = np.full(6, 0.1, dtype=np.float32)
            p.x -= 0.01
        a, b = algs
        sa = (a.on_gradient(ports[0].step, now, ["b"]) if a.wants_gradient else []) + \
            a.after_step(ports[0].step, now, ["b"]) + a.tick(now, ["b"])
        sb = (b.on_gradient(ports[1].step, now, ["a"]) if b.wants_gradient else []) + \
            b.after_step(ports[1].step, now, ["a"]) + b.tick(now, ["a"])
        deliver(a, deliver(b, sa, "a", now, ["a"]), "b", now, ["b"])
        deliver(b, deliver(a, sb, "b", now, ["b"]), "a", now, ["a"])
        a.may_step(ports[0].step + 1, now), b.may_step(ports[1].step + 1, now)
    return now


def through_a_checkpoint(state):
    """An algorithm state as a checkpoint file stores and gives it back."""
    ckpt = to_checkpoint(TrainingState(1, "m/6", "x", {}, None, state))
    buffer = io.BytesIO()
    torch.save(ckpt, buffer)
    buffer.seek(0)
    return from_checkpoint(torch.load(buffer, weights_only=True)).algorithm_state


def same(a, b):
    assert set(a) == set(b)
    for k in a:
        if isinstance(a[k], np.ndarray):
            np.testing.assert_array_equal(a[k], b[k], err_msg=k)
        else:
            assert a[k] == b[k], k


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_every_algorithm_round_trips_its_state_through_a_checkpoint(name):
    ports, algs, options = pair(name)
    now = exercise(ports, algs)
    state = algs[0].state_dict()
    restored_port = ArrayPort(ports[0].x, "m/6", immediate=True)
    restored_port.step = ports[0].step
    restored = ALGORITHMS[name](CFG, restored_port, random.Random(7), 0.0, options=options)  # a new process
    restored.load_state_dict(through_a_checkpoint(state), "checkpoint")
    kept = restored.state_dict()
    if name == "choco":  # its stream id is fresh on purpose (neighbours reset their copy of ours)
        assert restored.stream != algs[0].stream
    same(state, kept)


def test_a_restored_diloco_takes_the_same_outer_step_as_the_original():
    ports, algs, options = pair("diloco")
    now = exercise(ports, algs)
    port = ArrayPort(ports[0].x, "m/6", immediate=True)
    port.step = ports[0].step
    restored = ALGORITHMS["diloco"](CFG, port, random.Random(9), 0.0, options=options)
    restored.load_state_dict(through_a_checkpoint(algs[0].state_dict()), "checkpoint")
    step, now = ports[0].step + 1, now + 0.2
    for p in (ports[0], port):
        p.x -= 0.05
        p.step = step
    ports[1].step = step
    ports[1].x -= 0.05
    share = algs[1].after_step(step, now, ["a"])
    for alg in (algs[0], restored):
        sent = alg.after_step(step, now, ["b"])
        assert [type(s.msg).__name__ for s in sent] == ["OuterShare"]
        deliver(alg, share, "b", now, ["b"])
        assert alg.may_step(step + 1, now)
    np.testing.assert_array_equal(restored.outer_parameters, algs[0].outer_parameters)
    np.testing.assert_array_equal(port.x, ports[0].x)


def test_a_joiner_adopts_the_swarms_outer_state_but_keeps_its_own_push_sum_weight():
    ports, algs, options = pair("diloco")
    exercise(ports, algs)
    joiner = ALGORITHMS["diloco"](CFG, ArrayPort(np.zeros(6), "m/6", immediate=True), random.Random(5), 0.0, options=options)
    joiner.load_state_dict(algs[0].state_dict(), "peer")
    np.testing.assert_array_equal(joiner.outer_parameters, algs[0].outer_parameters)
    ports, algs, _ = pair("sgp")
    ports[0].step = 1
    deliver(algs[1], algs[0].after_step(1, 0.0, ["b"]), "a", 0.0, ["a"])  # one push, a to b
    assert algs[1].weight == 1.5
    sgp = ALGORITHMS["sgp"](CFG, ArrayPort(np.zeros(6), "m/6", immediate=True), random.Random(5), 0.0)
    sgp.load_state_dict(algs[1].state_dict(), "peer")
    assert sgp.weight == 1.0 and sgp.state_dict()["round"] == algs[1].state_dict()["round"]
    sgp.load_state_dict(algs[1].state_dict(), "checkpoint")  # its own state: the weight too
    assert sgp.weight == 1.5


@pytest.mark.parametrize("name, bad", [("diloco", {"theta_start": np.zeros(5, np.float32)}),
                                       ("diloco", {"round": -1}), ("sgp", {"weight": float("nan"), "round": 0}),
                                       ("dpsgd", {"round": "x"}), ("adpsgd", {"surprise": 1})])
def test_a_malformed_algorithm_state_is_a_value_error(name, bad):
    ports, algs, options = pair(name)
    state = {**algs[0].state_dict(), **bad}
    with pytest.raises(ValueError):
        algs[0].load_state_dict(state, "checkpoint")


def test_a_diloco_joiner_takes_the_outer_parameters_as_its_model():
    ports, algs, options = pair("diloco")
    exercise(ports, algs)
    ports[0].x -= 0.3  # inner steps since the last outer step: the donor's model is not theta_start
    state, model = algs[0].state_for_joiner()
    assert "theta_start" not in state  # it travels once, as the joiner's model
    np.testing.assert_array_equal(model, algs[0].outer_parameters)
    port = ArrayPort(model, "m/6", immediate=True)  # the joiner loaded it
    joiner = ALGORITHMS["diloco"](CFG, port, random.Random(5), 0.0, options=options)
    joiner.load_state_dict(through_a_checkpoint(state), "peer")
    np.testing.assert_array_equal(joiner.outer_parameters, algs[0].outer_parameters)
    same(joiner.state_dict(), {**algs[0].state_dict()})


def craft(meta, tensors):
    """A blob whose metadata says what we like (what a hostile donor could send)."""
    import json

    from safetensors.torch import save

    return save(tensors, metadata={"p2p": json.dumps(meta)})


@pytest.mark.parametrize("bad", [
    lambda meta: [1, 2],  # metadata that is no object
    lambda meta: {**meta, "algorithm_values": [1]},
    lambda meta: {**meta, "algorithm_values": {"round": {"nested": 1}}},
    lambda meta: {**meta, "optimizer_groups": [{**meta["optimizer_groups"][0], "lr": float("nan")}]},
    lambda meta: {**meta, "optimizer_groups": "x"},
    lambda meta: {**meta, "extra_values": {"scheduler": [1]}},
    lambda meta: {**meta, "step": -3},
])
def test_a_donors_garbled_metadata_is_a_state_error_not_a_crash(bad):
    import json

    m, state = trained_state()
    blob = to_bytes(state).tobytes()
    n = int.from_bytes(blob[:8], "little")
    meta = json.loads(json.loads(blob[8:8 + n])["__metadata__"]["p2p"])
    from safetensors.torch import load

    with pytest.raises(StateError):
        from_bytes(craft(bad(meta), load(blob)), m.state_dict(), KEY)


def test_an_optimizer_state_of_other_shapes_is_refused_before_it_reaches_the_optimizer():
    from p2p.training.state import check_optimizer

    m, state = trained_state()
    state.optimizer["state"][0]["exp_avg"] = torch.zeros(3)
    back = from_bytes(to_bytes(state).tobytes(), m.state_dict(), KEY)
    with pytest.raises(StateError, match="exp_avg of parameter 0"):
        check_optimizer(back.optimizer, torch.optim.Adam(model().parameters()))
    _, good = trained_state()
    check_optimizer(from_bytes(to_bytes(good).tobytes(), m.state_dict(), KEY).optimizer,
                    torch.optim.Adam(model().parameters()))


def test_registered_objects_travel_with_the_state():
    m, state = trained_state()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, 3)
    for _ in range(5):
        opt.step()
        sched.step()
    state.extra = {"scheduler": sched.state_dict(), "scaler": torch.amp.GradScaler("cpu").state_dict()}
    back = from_bytes(to_bytes(state).tobytes(), m.state_dict(), KEY)
    fresh = torch.optim.lr_scheduler.StepLR(torch.optim.SGD(model().parameters(), lr=0.1), 3)
    fresh.load_state_dict(back.extra["scheduler"])
    assert fresh.last_epoch == 5 and fresh.get_last_lr() == sched.get_last_lr()
    assert back.extra["scaler"]["scale"] == state.extra["scaler"]["scale"]
