"""record/stepdata: what a step's record holds, the digests and norms of its gradients and
parameters (per tensor where asked), sparse gradients included, and the trace it goes to."""

import math

import pytest
import torch

import twice
from twice.core.digests import digest_pairs
from twice.record import hooks
from twice.record.recorder import Recorder
from twice.record.stepdata import StepData
from twice.store.traces import read_trace
from unit.record.loops import train

pytestmark = pytest.mark.filterwarnings("ignore:Sparse")


def sparse_model():
    embedding, head = torch.nn.Embedding(50, 4, sparse=True), torch.nn.Linear(4, 1)
    optimizers = [
        torch.optim.SparseAdam(embedding.parameters(), lr=0.01),
        torch.optim.SGD(head.parameters(), lr=0.1),
    ]
    return (
        [embedding, head],
        optimizers,
        lambda step: head(embedding(torch.randint(0, 50, (16,)))).pow(2).mean(),
    )


def test_sparse_gradients_are_traced_exactly(tmp_path):
    """nn.Embedding(sparse=True) gives sparse gradients: they are digested as their indices and
    values, the gradient norm counts duplicates summed, and two runs give the same trace."""
    first, second = train(tmp_path, sparse_model, name="a"), train(tmp_path, sparse_model, name="b")
    assert [r.step for r in first] == [0, 1, 2, 3]
    assert [(r.grads, r.params, r.grad_norm) for r in first] == [
        (r.grads, r.params, r.grad_norm) for r in second
    ]
    assert set(first[0].grad_digests) == {
        "weight",
        "Linear.weight",
        "Linear.bias",
    }  # named by the first optimizer, then distinct
    # The norm is the dense gradient's: compute it from the same step by hand.
    torch.manual_seed(0)
    (embedding, head), _, loss_of = sparse_model()
    loss_of(0).backward()
    dense = torch.cat(
        [p.grad.to_dense().reshape(-1) for p in (embedding.weight, head.weight, head.bias)]
    )
    assert abs(float.fromhex(first[0].grad_norm) - float(dense.norm())) < 1e-5 * float(dense.norm())


def test_a_records_digests_and_norm_are_the_steps_own_gradients_and_parameters(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    recorder = hooks.install(Recorder(tmp_path, params_every=2))
    expected = []
    try:
        assert isinstance(recorder.data, StepData)
        for _ in range(3):
            optimizer.zero_grad()
            model(torch.randn(5, 3)).pow(2).mean().backward()
            grads = [(n, twice.digest(p.grad)) for n, p in model.named_parameters()]
            norm = math.sqrt(sum(float(p.grad.norm()) ** 2 for p in model.parameters()))
            optimizer.step()
            params = [(n, twice.digest(p)) for n, p in model.named_parameters()]
            expected.append((grads, params, norm))
    finally:
        hooks.uninstall()
    records = read_trace(tmp_path / "trace.jsonl")
    for record, (grads, params, norm) in zip(records, expected, strict=True):
        assert record.grads == digest_pairs(grads) and record.params == digest_pairs(params)
        assert abs(float.fromhex(record.grad_norm) - norm) <= 1e-6 * norm
    # per-tensor digests every second step only
    assert [r.param_digests is not None for r in records] == [True, False, True]
    assert records[0].param_digests == dict(expected[0][1])
