"""The tinylm task: protocol conformance, deterministic disjoint shards, batches, learning."""

import itertools
import math

import pytest
import torch

from nodes.tinylm import TinyLMTask, load_corpus
from p2p.training.task import Shard, Task, load_task


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def task():
    return TinyLMTask()


def test_satisfies_protocol_and_loads_by_name(task):
    assert isinstance(task, Task)
    loaded = load_task("tinylm")
    assert isinstance(loaded, TinyLMTask) and loaded.name == "tinylm"
    assert 0 < loaded.target_accuracy < 1 and loaded.lr > 0 and loaded.batch_size > 0


def test_corpus_is_cached_and_split(task):
    train, heldout = load_corpus()
    assert load_corpus() is load_corpus() and task._corpus() is load_corpus()
    assert train.dtype == heldout.dtype == torch.uint8
    assert len(train) > 1_000_000 and len(heldout) > 50_000
    assert b"def " in bytes(train[:200_000].tolist())


def test_shards_are_disjoint_and_cover_everything(task):
    every = task.window_starts(Shard(0, 1))
    parts = [task.window_starts(Shard(i, 3)) for i in range(3)]
    joined = torch.cat(parts)
    assert len(joined) == len(every) == len(set(joined.tolist()))
    assert torch.equal(joined.sort().values, every)
    assert all(len(p) > 1000 for p in parts)


def test_batches_are_deterministic_and_come_from_the_shard(task):
    shard = Shard(1, 4)
    first = list(itertools.islice(task.train_batches(shard, seed=7), 3))
    again = list(itertools.islice(task.train_batches(shard, seed=7), 3))
    other = next(task.train_batches(shard, seed=8))
    for (x1, y1), (x2, y2) in zip(first, again):
        assert torch.equal(x1, x2) and torch.equal(y1, y2)
    assert not torch.equal(first[0][0], other[0])

    train, _ = load_corpus()
    starts = task.window_starts(shard)
    windows = train[starts[:, None] + torch.arange(task.context)].numpy()
    allowed = {row.tobytes() for row in windows}
    x, _ = first[0]
    for row in x.to(torch.uint8).numpy():  # every row is the window at one of the shard's offsets
        assert row.tobytes() in allowed


def test_batch_shapes_and_dtypes(task):
    x, y = next(task.train_batches(Shard(), seed=0))
    assert x.shape == y.shape == (task.batch_size, task.context)
    assert x.dtype == y.dtype == torch.long and x.device.type == "cpu"
    assert int(x.min()) >= 0 and int(x.max()) < 256
    assert torch.equal(x[:, 1:], y[:, :-1])  # targets are the inputs shifted by one byte


def test_model_init_is_seeded_and_sized(task):
    torch.manual_seed(3)
    a = task.make_model()
    torch.manual_seed(3)
    b = task.make_model()
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    assert 500_000 < sum(p.numel() for p in a.parameters()) < 2_500_000
    assert sum(v.numel() for v in sa.values()) == sum(p.numel() for p in a.parameters())


def test_training_reduces_loss_on_a_fixed_batch(task):
    torch.manual_seed(0)
    model = task.make_model()
    opt = task.make_optimizer(model.parameters())
    x, y = next(task.train_batches(Shard(), seed=0))
    batch = (x[:4], y[:4])  # a small fixed batch keeps this quick; the model memorizes it
    with torch.no_grad():
        before = task.loss(model, batch).item()
    assert before == pytest.approx(math.log(256), rel=0.1)  # near uniform at init
    for _ in range(25):
        opt.zero_grad()
        task.loss(model, batch).backward()
        opt.step()
    with torch.no_grad():
        after = task.loss(model, batch).item()
    assert after < before - 2.0, (before, after)  # ~5.5 -> ~1.9 measured


def test_evaluate_returns_accuracy_and_is_deterministic(task):
    torch.manual_seed(0)
    model = task.make_model()
    r1 = task.evaluate(model, "cpu")
    r2 = task.evaluate(model, torch.device("cpu"))
    assert 0.0 <= r1["accuracy"] <= 1.0 and math.isfinite(r1["loss"])
    assert r1 == r2
    assert model.training  # evaluate restores the mode it found
