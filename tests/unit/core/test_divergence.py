from hypothesis import given
from hypothesis import strategies as st

from twice.core.causes import UNKNOWN, explain
from twice.core.divergence import first_divergence, loss_gap
from twice.core.manifest import Difference, compare_identity
from twice.core.records import StepRecord


def trace(n):
    return [
        StepRecord(
            step=i,
            loss=float.hex(1 / (i + 1)),
            batch=f"b{i}",
            grads=f"g{i}",
            params=f"p{i}",
            rng={"torch": f"r{i}"},
            param_digests={"w": f"w{i}", "b": f"c{i}"},
        )
        for i in range(n)
    ]


@given(st.integers(1, 60), st.data(), st.sampled_from(["batch", "loss", "grads", "params", "rng"]))
def test_perturbing_step_k_is_reported_at_step_k(n, data, field):
    k = data.draw(st.integers(0, n - 1))
    a, b = trace(n), trace(n)
    if field == "rng":
        b[k].rng = {"torch": "other"}
    elif field == "loss":
        b[k].loss = float.hex(5.0)
    else:
        setattr(b[k], field, "other")
    found = first_divergence(a, b)
    assert found is not None and found.step == k and found.first == field
    assert found.identical_before == k


def test_identical_traces_and_a_shorter_one_have_no_divergence():
    assert first_divergence(trace(10), trace(10)) is None
    assert first_divergence(trace(10), trace(4)) is None


def test_causal_order_puts_data_before_loss_before_parameters():
    a, b = trace(3), trace(3)
    b[1].params, b[1].loss, b[1].batch = "x", float.hex(9.0), "y"
    assert first_divergence(a, b).fields == ["batch", "loss", "params"]


def test_differing_tensors_are_named():
    a, b = trace(3), trace(3)
    b[2].params, b[2].param_digests = "x", {"w": "other", "b": "c2"}
    assert first_divergence(a, b).tensors == {"params": ["w"]}


def test_loss_gap_counts_float32_ulps():
    one = float.hex(1.0)
    next_up = float.hex(1.0 + 2**-23)
    assert loss_gap(one, next_up) == {"abs": 2**-23, "ulps": 1}


def test_explanation_combines_trace_and_manifest():
    a, b = trace(3), trace(3)
    b[1].loss = float.hex(2.0)
    diffs = compare_identity(
        {"threads": {"intra_op_threads": 1}}, {"threads": {"intra_op_threads": 2}}
    )
    sentence = explain(diffs, first_divergence(a, b))
    assert sentence.startswith(
        "batches and the RNG state identical, the loss differs: the forward computation differs "
        "at step 1"
    )
    assert "the runs used 1 and 2 torch threads" in sentence


def test_an_explanation_claims_identical_only_for_what_was_recorded():
    """A loop whose trace holds no batches: the sentence says none were recorded, never that
    batches were identical, and names no cause."""
    a, b = trace(3), trace(3)
    for record in a + b:
        record.batch = None
    b[2].grads = "f" * 32
    sentence = explain([], first_divergence(a, b))
    assert "batches" not in sentence.split(";")[0]
    assert sentence.startswith(
        "the RNG state and the loss identical, gradients differ: the backward computation differs "
        "at step 2; same code, seeds and settings, but the cause cannot be named"
    )
    assert UNKNOWN["batch"] in sentence and "nondeterminism" not in sentence
    for record in a + b:
        record.rng = {}
    b[2].grads, b[1].loss = "e" * 32, (5.0).hex()
    sentence = explain([], first_divergence(a, b))
    assert sentence.startswith("the loss differs: the forward computation differs at step 1")
    assert UNKNOWN["batch"] in sentence and UNKNOWN["rng"] in sentence


def test_causes_portable_mode_removes_say_so():
    cases = [
        Difference("threads", "threads.intra_op_threads", 1, 2),
        Difference("packages", "torch.cpu_capability", "DEFAULT", "AVX2"),
        Difference("environment", "env.MKL_CBWR", None, "COMPATIBLE"),
        Difference("hardware", "cpu.model", "AMD EPYC", "Intel Xeon"),
    ]
    for diff in cases:  # identical runs: the difference is named, no fix offered
        assert "--portable" not in explain([diff], None)
    step = first_divergence(
        [StepRecord(step=0, loss=(1.0).hex())], [StepRecord(step=0, loss=(2.0).hex())]
    )
    for diff in cases:
        assert "`twice run --portable` gives the same bits" in explain([diff], step)
    device = Difference("hardware", "gpus", None, ["NVIDIA H200"])
    assert "CPU's bits on the GPU" in explain([device], step)
    version = Difference("packages", "torch.version", "2.5.0", "2.6.0")
    assert "--portable" not in explain([version], step)
    one_portable = Difference("determinism", "determinism.portable", None, True)
    assert "one run was portable" in explain([one_portable], step)
