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


def test_a_model_in_several_dtypes_is_one_float32_vector_to_the_averager():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2).to(torch.bfloat16))
    expected = np.concatenate([p.detach().float().reshape(-1).numpy() for p in m.parameters()])
    flat = FlatParams(m)
    assert len(flat.groups) == 2 and flat.dtypes == [torch.float32, torch.bfloat16]
    snap = flat.snapshot()
    assert snap.dtype == np.float32 and snap.shape == (16 + 10,)
    np.testing.assert_array_equal(snap, expected)  # bf16 values are exact in float32
    delta = np.full(flat.numel, 0.5, dtype=np.float32)
    flat.add_delta(delta)
    flat.apply_pending()
    assert all(p.dtype == d for p, d in zip(m.parameters(), [torch.float32] * 2 + [torch.bfloat16] * 2))
    after = flat.snapshot()
    np.testing.assert_allclose(after[:16], expected[:16] + 0.5, rtol=1e-6)
    bf16 = torch.from_numpy(expected[16:] + 0.5).to(torch.bfloat16).float().numpy()  # one rounding
    np.testing.assert_array_equal(after[16:], bf16)


def test_frozen_integer_parameters_are_left_alone_and_a_frozen_model_is_refused():
    m = torch.nn.Linear(2, 2)
    m.register_parameter("count", torch.nn.Parameter(torch.zeros(2, dtype=torch.int64), requires_grad=False))
    FlatParams(m)  # frozen integer buffers are not averaged: fine
    with pytest.raises(ValueError, match="no trainable parameters"):
        FlatParams(torch.nn.Linear(2, 2).requires_grad_(False))


def test_named_values_give_every_name_of_a_tied_weight():
    class Tied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(5, 3)
            self.out = torch.nn.Linear(3, 5, bias=False)
            self.out.weight = self.emb.weight  # one tensor, two names in the state_dict

    m = Tied()
    flat = FlatParams(m)
    values = np.arange(flat.numel, dtype=np.float32)
    named = flat.named_values(values, m)
    assert set(named) == set(m.state_dict()) == {"emb.weight", "out.weight"}
    assert torch.equal(named["emb.weight"], named["out.weight"])
    m.load_state_dict(named)
    np.testing.assert_array_equal(flat.snapshot(), values)


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


def test_gradients_gather_and_scatter_in_vector_order_even_after_set_to_none():
    m = model()
    flat = FlatParams(m)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    m(torch.ones(2, 3)).sum().backward()
    expected = torch.cat([p.grad.reshape(-1) for p in m.parameters()]).numpy()
    np.testing.assert_array_equal(flat.gradient(), expected)
    opt.zero_grad(set_to_none=True)
    assert all(p.grad is None for p in m.parameters())
    np.testing.assert_array_equal(flat.gradient(), np.zeros(flat.numel, dtype=np.float32))  # none yet: zeros
    flat.set_gradient(np.arange(flat.numel, dtype=np.float32))  # creates them
    np.testing.assert_array_equal(flat.gradient(), np.arange(flat.numel, dtype=np.float32))
    before = flat.snapshot()
    opt.step()
    np.testing.assert_allclose(flat.snapshot(), before - 0.1 * np.arange(flat.numel), rtol=1e-5, atol=1e-6)
