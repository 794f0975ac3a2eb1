"""ops/attention: scaled dot-product attention gives the same bits under portable mode whichever
route torch takes (its math route, or a fused kernel a program asks for itself), forward and
backward, over generated shapes, masks, scales, dtypes and values."""

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st
from torch.nn.attention import SDPBackend, sdpa_kernel

from twice.portable.dispatch.mode import PortableError, PortableMode
from twice.portable.dispatch.table import KERNELS
from twice.portable.ops import attention
from unit.portable.bits import EXAMPLES, gen, same_bits

CASES = st.fixed_dictionaries(
    {
        "dtype": st.sampled_from([torch.float32, torch.float64, torch.bfloat16, torch.float16]),
        "batch": st.sampled_from([(1, 1), (2, 3), (2, 4), (3,)]),
        "L": st.integers(1, 9),
        "S": st.integers(1, 9),
        "E": st.sampled_from([1, 4, 8, 16]),
        "mask": st.sampled_from(["none", "causal", "float", "bool", "bool_broadcast"]),
        "scale": st.sampled_from([None, 0.37, -0.2, 3.0, 0.0, -0.0]),
        "kv_heads": st.sampled_from([None, 1, 2]),  # grouped-query attention: fewer k, v heads
        "values": st.sampled_from(["normal", "large", "with_inf"]),
        "seed": st.integers(0, 2**16),
    }
)


def _inputs(case):
    g = gen(case["seed"])
    batch, L, S, E = case["batch"], case["L"], case["S"], case["E"]
    scale = {"normal": 1.0, "large": 60.0, "with_inf": 1.0}[case["values"]]
    q, k, v = (torch.randn(*batch, n, E, generator=g) * scale for n in (L, S, S))
    kv = case["kv_heads"]
    grouped = bool(kv) and len(batch) == 2 and batch[1] > kv and batch[1] % kv == 0
    if grouped:
        k, v = (t[:, : case["kv_heads"]].clone() for t in (k, v))
    if case["values"] == "with_inf":
        k.view(-1)[0] = -math.inf  # a score of -inf (or NaN where 0 * inf): masked like one
    kwargs = {"scale": case["scale"], "enable_gqa": grouped}
    if case["mask"] == "causal":
        kwargs["is_causal"] = True
    elif case["mask"] == "float":
        kwargs["attn_mask"] = torch.randn(L, S, generator=g).to(case["dtype"])
    elif case["mask"] == "bool":
        kwargs["attn_mask"] = torch.rand(L, S, generator=g) > 0.4  # rows with no key: zeros
    elif case["mask"] == "bool_broadcast":
        kwargs["attn_mask"] = torch.rand(*batch[:-1], 1, L, S, generator=g) > 0.3
    grad = torch.randn(*batch, L, E, generator=g).to(case["dtype"])
    return [t.to(case["dtype"]) for t in (q, k, v)], kwargs, grad


def _run(backend, inputs, kwargs, grad):
    q, k, v = (t.clone().requires_grad_() for t in inputs)
    with PortableMode("strict") as mode, sdpa_kernel(backend):
        out = F.scaled_dot_product_attention(q, k, v, **kwargs)
        grads = torch.autograd.grad(out, (q, k, v), grad)
    assert not mode.uncovered
    return [out, *grads]


@EXAMPLES
@given(CASES)
def test_the_fused_kernel_gives_the_math_routes_bits(case):
    """torch takes the CPU FlashAttention kernel for 4-d inputs when a program asks for it:
    under the mode it computes the math route's operations, so the bits are the same."""
    inputs, kwargs, grad = _inputs(case)
    if len(case["batch"]) != 2:  # the fused kernels take (batch, heads, length, dim) alone
        case["batch"] = (2, 3)
        inputs, kwargs, grad = _inputs(case)
    math_route = _run(SDPBackend.MATH, inputs, kwargs, grad)
    fused = _run(SDPBackend.FLASH_ATTENTION, inputs, kwargs, grad)
    for a, b in zip(math_route, fused):
        assert same_bits(a, b)


@EXAMPLES
@given(CASES)
def test_the_route_torch_would_pick_gives_the_math_routes_bits(case):
    """With every backend allowed (torch's default, which picks FlashAttention on a CPU for 4-d
    inputs and another kernel on a GPU) the mode's pinned settings take the math route."""
    inputs, kwargs, grad = _inputs(case)
    q, k, v = (t.clone().requires_grad_() for t in inputs)
    with PortableMode("strict"):
        out = F.scaled_dot_product_attention(q, k, v, **kwargs)
        grads = torch.autograd.grad(out, (q, k, v), grad)
    for a, b in zip(_run(SDPBackend.MATH, inputs, kwargs, grad), [out, *grads]):
        assert same_bits(a, b)


def test_the_fused_kernels_are_the_attention_modules():
    for name in (
        "_scaled_dot_product_flash_attention_for_cpu.default",
        "_scaled_dot_product_flash_attention_for_cpu_backward.default",
    ):
        assert KERNELS[name].__module__ == attention.__name__


def test_a_fused_kernel_with_dropout_is_refused_by_name():
    """Dropout's mask would be drawn again by a recomputing backward: the fused kernel refuses
    it (the math route, the mode's default, draws it once)."""
    q = torch.randn(1, 2, 3, 4)
    fused = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
    with PortableMode("strict"), pytest.raises(PortableError, match="dropout"):
        fused(q, q, q, 0.5)
