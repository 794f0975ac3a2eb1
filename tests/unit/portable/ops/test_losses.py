"""The losses' kernels under portable mode: the margin losses' gradients, the trilinear product
and CTC agree with torch's float64 results, and a sample's CTC loss does not depend on its batch."""

import pytest
import torch

from twice.portable.dispatch.mode import PortableMode
from twice.portable.ops import losses

G = torch.Generator().manual_seed(5)


def _both(fn, *inputs):
    """(torch's float64 result and gradients, ours in float32 under the mode)."""
    ref64 = [x.detach().double().requires_grad_(x.requires_grad) for x in inputs]
    out = fn(*ref64)
    ref = [out, *torch.autograd.grad(out.sum(), [x for x in ref64 if x.requires_grad])]
    with PortableMode("strict"):
        out = fn(*inputs)
        ours = [out, *torch.autograd.grad(out.sum(), [x for x in inputs if x.requires_grad])]
    return ref, ours


@pytest.mark.parametrize(
    "fn",
    [
        lambda x, w: (
            torch.nn.functional.multi_margin_loss(x, T3, p=2, margin=0.7, weight=w.detach())
            + w.sum()
        ),
        lambda x, w: torch.nn.functional.multi_margin_loss(x * w[:1], T3, reduction="none"),
        lambda x, w: torch.nn.functional.multilabel_margin_loss(x, LABELS) * w.sum(),
        lambda x, w: torch.nn.functional.bilinear(x, x.flip(0), w.expand(2, 5, 5)),
    ],
)
def test_the_losses_and_their_gradients_match_torch_in_float64(fn):
    x = torch.randn(4, 5, generator=G).requires_grad_()
    w = torch.rand(5, generator=G).requires_grad_()
    ref, ours = _both(fn, x, w)
    for r, o in zip(ref, ours, strict=True):
        torch.testing.assert_close(o.double(), r, rtol=1e-5, atol=1e-6)


T3 = torch.tensor([0, 3, 4, 1])
LABELS = torch.tensor([[1, 2, -1, 0, 0], [4, -1, 3, 3, 3], [0, 1, 2, 3, 4], [-1, 0, 0, 0, 0]])


def _ctc(lp, tg, il, tl, reduction="none"):
    return torch.nn.functional.ctc_loss(lp, tg, il, tl, reduction=reduction, zero_infinity=True)


def test_ctc_loss_and_gradient_match_torch_in_float64_with_concatenated_targets():
    lp = torch.randn(15, 3, 6, generator=G).log_softmax(2).requires_grad_()
    tg = torch.tensor([1, 1, 2, 5, 3, 3, 4])  # a repeat (no skip between equal labels)
    ref, ours = _both(lambda p: _ctc(p, tg, [15, 11, 3], [4, 3, 0], "mean"), lp)
    for r, o in zip(ref, ours, strict=True):
        torch.testing.assert_close(o.double(), r, rtol=1e-5, atol=1e-6)


def test_an_impossible_alignment_is_infinite_and_zeroed_with_zero_infinity():
    lp = torch.randn(3, 1, 4, generator=G).log_softmax(2).requires_grad_()
    tg = torch.tensor([[1, 1, 1]])  # needs 5 steps
    with PortableMode("strict"):
        raw = torch.nn.functional.ctc_loss(lp, tg, [3], [3], reduction="none")
        out = _ctc(lp, tg, [3], [3])
        (grad,) = torch.autograd.grad(out.sum(), lp)
    assert raw.item() == float("inf") and out.item() == 0.0
    assert torch.equal(grad, torch.zeros_like(grad))


def test_a_samples_ctc_loss_and_gradient_do_not_depend_on_its_batch():
    lp = torch.randn(10, 4, 5, generator=G).log_softmax(2).requires_grad_()
    tg = torch.randint(1, 5, (4, 3), generator=G)
    with PortableMode("strict"):
        whole = _ctc(lp, tg, [10, 8, 9, 10], [3, 2, 3, 1])
        (g_whole,) = torch.autograd.grad(whole.sum(), lp)
        one = _ctc(lp[:8, 1:2], tg[1:2], [8], [2])
        (g_one,) = torch.autograd.grad(one.sum(), lp)
    assert torch.equal(whole[1:2], one)
    assert torch.equal(g_whole[:8, 1], g_one[:8, 1])


def test_logaddexp_is_exact_on_equal_terms_and_minus_infinity_when_all_are():
    a = torch.tensor([0.0, -float("inf"), 2.5], dtype=torch.float64)
    out = losses.logaddexp(a, a)
    assert out[1] == -float("inf")
    torch.testing.assert_close(out[[0, 2]], a[[0, 2]] + torch.log(torch.tensor(2.0)).double())


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_chunked_linear_cross_entropy_is_the_whole_batchs_bits_at_any_chunking(reduction):
    """torch 2.13's chunked linear cross-entropy (its torch_nn custom ops) gives the reference
    path's loss bit for bit under portable mode, whatever the chunk size and accumulator: and
    with a mean or sum, its gradients too (class weights, an ignored target and a bias
    included)."""
    import torch.nn.functional as F
    from torch.nn import LinearCrossEntropyOptions

    g = torch.Generator().manual_seed(3)
    x = torch.randn(37, 8, generator=g)
    w, b = torch.randn(21, 8, generator=g), torch.randn(21, generator=g)
    target = torch.randint(0, 21, (37,), generator=g)
    target[5] = -100
    weight = torch.rand(21, generator=g) + 0.5

    def run(options):
        leaves = [t.clone().requires_grad_() for t in (x, w, b)]
        with PortableMode("strict"):
            loss = F.linear_cross_entropy(
                leaves[0], leaves[1], target, linear_bias=leaves[2], weight=weight,
                reduction=reduction, options=options,
            )  # fmt: skip
            grads = torch.autograd.grad(loss.sum(), leaves)
        return [loss.detach(), *grads]

    whole = run(None)
    for size in (1, 4, 37):
        for acc in ("compact", "accurate"):
            chunked = run(LinearCrossEntropyOptions(batch_chunk_size=size, acc_policy=acc))
            assert torch.equal(chunked[0], whole[0]), (size, acc)
            if reduction != "none":  # 'none' recomputes its gradients in torch's own chunks
                assert all(torch.equal(a, c) for a, c in zip(whole, chunked)), (size, acc)


def test_chunked_cross_entropy_without_reduction_refuses_a_half_precision_gradient():
    """With reduction='none' torch computes the gradients in its own chunks, whose size and
    accumulator it picks per device in half precision: refused by name there (float32 runs)."""
    import torch.nn.functional as F
    from torch.nn import LinearCrossEntropyOptions

    from twice.portable.dispatch.mode import PortableError

    for dtype in (torch.bfloat16, torch.float16):
        x = torch.randn(8, 4, dtype=dtype, requires_grad=True)
        w = torch.randn(5, 4, dtype=dtype)
        target = torch.randint(0, 5, (8,))
        with pytest.raises(PortableError, match="reduction='none'"), PortableMode("strict"):
            F.linear_cross_entropy(
                x, w, target, reduction="none", options=LinearCrossEntropyOptions()
            )
        with PortableMode("strict"):
            loss = F.linear_cross_entropy(
                x.detach(), w, target, reduction="none", options=LinearCrossEntropyOptions()
            )
        assert loss.dtype == dtype and loss.shape == (8,)
