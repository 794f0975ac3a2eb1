"""record/openstep: the step in progress and the StepRecord it becomes."""

import math

import torch

from twice.core.digests import digest_pairs, float_bits
from twice.record.openstep import StepRound


def test_a_round_becomes_the_record_of_its_step():
    round_ = StepRound(
        grads=[("w", "a" * 32), ("b", "b" * 32)],
        params=[("w", "c" * 32), ("b", "d" * 32)],
        grad_squares=[torch.tensor(3.0), 4.0],  # the gradients' norms
        param_squares=[[torch.tensor(1.0)], [2.0, 2.0]],  # per optimizer
        lr=[float_bits(0.1)],
        losses=[torch.tensor(0.25)],
        rng={"torch": "e" * 32},
    )
    record, losses = round_.record(step=7, per_tensor=True, elapsed=0.1234567)
    assert losses == [0.25] and record.loss == float_bits(0.25)
    assert record.step == 7 and record.time == 0.123457
    assert record.params == digest_pairs(round_.params) == round_.params_digest
    assert record.grads == digest_pairs(round_.grads) and record.grad_norm == float_bits(5.0)
    assert record.param_digests == {"w": "c" * 32, "b": "d" * 32}
    assert record.grad_digests == {"w": "a" * 32, "b": "b" * 32}
    assert round_.grad_norms == [3.0, 4.0] and round_.grad_total == 5.0
    assert round_.param_norm == math.hypot(1.0, math.sqrt(8.0))
    assert record.skipped is None and record.batch is None and record.rng == {"torch": "e" * 32}


def test_an_empty_round_records_nothing_but_its_step():
    record, losses = StepRound(skipped=True, losses=[1.0, 2.0]).record(0, False, 0.0)
    assert losses == [1.0, 2.0] and record.loss == [float_bits(1.0), float_bits(2.0)]
    assert record.grads is record.params is record.grad_norm is None
    assert record.param_digests is None and record.skipped is True
