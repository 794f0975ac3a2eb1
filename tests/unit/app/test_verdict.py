"""app/verdict: a comparison's verdict in words, what differs first or why nothing can be
judged, and whether the runs are identical."""

from twice.app.tracecompare import StreamsCompared
from twice.app.verdict import phrase_verdict
from twice.core.divergence import first_divergence
from twice.core.manifest import Manifest
from unit.app.folders import steps

RUN = {"identity": {"argv": ["python", "train.py"], "seed": 0}, "context": {"status": "completed"}}
MANIFESTS = (Manifest.from_json(RUN, "a"), Manifest.from_json(RUN, "b"))
BOTH = ("completed", "completed")


def _verdict(found, held=(["main"], ["main"]), offset=None, mismatch=(), settings=()):
    return phrase_verdict(
        MANIFESTS, [], found, list(held), offset, BOTH, list(mismatch), list(settings), "same code"
    )


def test_equal_steps_are_bit_identical_and_recording_differences_are_said_but_not_judged():
    assert _verdict(StreamsCompared(compared=5)) == (
        "runs are bit-identical: 5 steps compared",
        "same code",
        True,
    )
    verdict, _, identical = _verdict(
        StreamsCompared(compared=3), settings=["recorded differently: --trace-every 1 vs 2"]
    )
    assert identical and verdict == (
        "runs are bit-identical at the 3 steps both recorded; recorded differently: "
        "--trace-every 1 vs 2"
    )


def test_runs_of_other_lengths_or_a_divergence_differ():
    verdict, _, identical = _verdict(
        StreamsCompared(compared=4), mismatch=["A ran 6 steps and B 4"]
    )
    assert not identical
    assert (
        verdict == "runs differ: A ran 6 steps and B 4; the 4 steps both recorded are bit-identical"
    )
    a, b = steps([2.0, 1.5]), steps([2.0, 1.25])
    found = StreamsCompared(compared=2, divergences=[first_divergence(a[1:], b[1:], "main")])
    found.skipped["main"] = (set(), set())
    verdict, _, identical = _verdict(found)
    assert not identical and verdict.startswith("runs differ: first divergence at step 1")


def test_nothing_in_common_cannot_be_judged_and_says_why():
    verdict, hint, identical = _verdict(StreamsCompared(), offset=4)
    assert verdict == "cannot judge: with --offset 4 the runs have no step in common"
    assert hint.startswith("choose an offset") and not identical
    verdict, _, _ = _verdict(StreamsCompared(), held=(["main"], ["rank0", "rank1"]))
    assert verdict == (
        "cannot judge: the runs recorded their steps in different streams "
        "(A: main; B: rank0, rank1)"
    )


def test_a_divergence_after_an_unrecorded_step_does_not_claim_the_steps_before_it():
    """Only the recorded steps before the first divergence were compared: where the step just
    before it was not (--trace-every), the verdict says so instead of "steps before it
    bit-identical"."""
    a, b = steps([2.0, 1.5, 1.0, 0.5]), steps([2.0, 1.5, 1.0, 0.25])
    for gap, claim in ((0, True), (1, False)):
        kept_a = a[:2] + a[3:] if gap else a
        kept_b = b[:2] + b[3:] if gap else b
        first = first_divergence(kept_a, kept_b, "main")
        found = StreamsCompared(compared=len(kept_a), divergences=[first])
        found.skipped["main"] = (set(), set())
        verdict, _, identical = _verdict(found)
        assert not identical and ("; steps before it bit-identical" in verdict) == claim, verdict
        assert ("step 2 was not compared" in verdict) == (not claim), verdict
