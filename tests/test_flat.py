"""FlatParams: parameters are views into one buffer; deltas land only when applied."""

import numpy as np
import pytest
import torch

from p2p.training.flat import FlatParams


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))


def test_parameters_are_views_of_one_buffer():
    m = model()
    before = torch.cat([p.detach().reshape(-1) for p in m.parameters()]).clone()
    flat = FlatParams(m)
    assert flat.numel == 3 * 4 + 4 + 4 * 2 + 2
    assert torch.equal(flat.buffer, before)
    flat.buffer.zero_()
    assert all(float(p.detach().abs().sum()) == 0 for p in m.parameters())


def test_optimizer_steps_write_through_to_the_buffer():
    m = model()
    flat = FlatParams(m)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    m(torch.ones(1, 3)).sum().backward()
    before = flat.snapshot()
    opt.step()
    assert not np.allclose(flat.snapshot(), before)


def test_deltas_reach_the_buffer_only_when_applied_but_snapshots_see_them():
    flat = FlatParams(model())
    buffer_before = flat.buffer.clone()
    snap = flat.snapshot()
    flat.add_delta(np.ones(flat.numel, dtype=np.float32))
    assert torch.equal(flat.buffer, buffer_before)  # the trainer has not applied it yet
    np.testing.assert_allclose(flat.snapshot(), snap + 1)
    assert flat.apply_pending() == 1
    np.testing.assert_allclose(flat.buffer.numpy(), snap + 1)
    assert flat.apply_pending() == 0
    snap[:] = 0  # mutating a snapshot does not touch the model
    assert flat.snapshot().any()


def test_wrong_delta_shape_is_refused():
    flat = FlatParams(model())
    with pytest.raises(ValueError):
        flat.add_delta(np.ones(flat.numel + 1, dtype=np.float32))


def test_non_float32_models_are_refused():
    with pytest.raises(ValueError):
        FlatParams(torch.nn.Linear(2, 2).double())


def test_snapshot_includes_queued_deltas_so_concurrent_mixes_stay_convex():
    flat = FlatParams(model())
    x = flat.snapshot()
    # two exchanges answered before the trainer's next step: each must see the other's delta
    a = x + 2.0
    flat.add_delta((a - flat.snapshot()) * 0.5)
    b = x - 4.0
    mid = flat.snapshot()
    np.testing.assert_allclose(mid, x + 1.0, rtol=1e-6)
    flat.add_delta((b - mid) * 0.5)
    assert flat.apply_pending() == 2
    np.testing.assert_allclose(flat.snapshot(), ((x + 1.0) + b) / 2, rtol=1e-5, atol=1e-6)


def test_backward_accumulates_into_the_flat_gradient():
    m = model()
    flat = FlatParams(m)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    for _ in range(2):  # the views must survive zero_grad + backward + step
        flat.zero_grad()
        m(torch.ones(2, 3)).sum().backward()
        expected = torch.cat([p.grad.reshape(-1) for p in m.parameters()])
        assert torch.equal(flat.grad, expected) and flat.grad.abs().sum() > 0
        opt.step()
    grad = flat.gradient()
    flat.set_gradient(np.zeros_like(grad))
    assert all(float(p.grad.abs().sum()) == 0 for p in m.parameters())
