"""Which operations portable mode computes itself, and which it leaves to torch because torch's
own result already depends on nothing but the inputs.

`KERNELS` maps an aten overload's name ("mm.default") to twice's implementation, which takes the
overload's arguments. `EXACT` names the aten operations whose results are the same bits on every
machine as torch computes them: copies, indexing, comparisons, maxima, and the elementwise
operations IEEE arithmetic rounds exactly once (multiply, divide, fmod, ...) when no scalar
factor rides along (torch's CPU square root is not correctly rounded: it is a kernel). Views are
exact by their schema (routes.py); what else is covered, and how, is decided there.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = [
    "KERNELS",
    "SPARSE_KERNELS",
    "COMPLEX_TAKING",
    "COMPLEX_KERNELS",
    "COMPOSITE",
    "EXACT",
    "COMPLEX_EXACT",
    "NOT_EXACT",
    "kernel",
    "complex_kernel",
    "PortableUnsupported",
]

KERNELS: dict[str, Callable] = {}
SPARSE_KERNELS: set[Callable] = set()
"""The kernels written for sparse operands (to_dense, sparse_mask, add, sub), each taking them
only coalesced (the mode refuses an uncoalesced one): every other kernel refuses a sparse tensor
by name (its arithmetic reads strided memory)."""
COMPLEX_TAKING: set[Callable] = set()
"""The kernels written for complex operands (the complex FFTs): every other kernel refuses a
complex tensor by name (its arithmetic is real)."""
COMPOSITE: set[Callable] = set()
"""The kernels written as torch operations that the mode routes in turn (the fused attention:
the math route's operations, so that the route torch picks changes no bit)."""
# Kernels for complex arguments of EXACT operations that are not exact on complex tensors (a
# complex tensor times a real number): real arguments keep the exact route, untouched.
COMPLEX_KERNELS: dict[str, Callable] = {}


class PortableUnsupported(Exception):
    """A call portable mode has no implementation for (a dtype, a variant of its arguments)."""


def kernel(
    *names: str, sparse: bool = False, complex_operands: bool = False, composite: bool = False
) -> Callable:
    """Register the decorated function as the portable implementation of aten overloads (taking
    sparse operands too where `sparse`, complex ones where `complex_operands`). A `composite`
    kernel is written in torch operations that the mode routes in turn (it runs inside the
    mode, on its operands as they are, half precision included)."""

    def register(function: Callable) -> Callable:
        if composite:
            COMPOSITE.add(function)
        for name in names:
            KERNELS[name] = function
        if sparse:
            SPARSE_KERNELS.add(function)
        if complex_operands:
            COMPLEX_TAKING.add(function)
        return function

    return register


def complex_kernel(*names: str) -> Callable:
    """Register the decorated function for the complex arguments of EXACT aten overloads."""

    def register(function: Callable) -> Callable:
        for name in names:
            COMPLEX_KERNELS[name] = function
        return function

    return register


EXACT = frozenset(
    """
    _local_scalar_dense _to_copy _unsafe_view _reshape_alias alias as_strided clone contiguous
    copy copy_ detach detach_ empty empty_like empty_strided expand fill fill_ full full_like lift
    lift_fresh lift_fresh_copy new_empty new_empty_strided new_full new_ones new_zeros ones
    ones_like permute reshape resize_ scalar_tensor select select_backward slice slice_backward
    split split_with_sizes squeeze squeeze_ t t_ transpose transpose_ unbind unfold unsqueeze
    unsqueeze_ view view_as zero_ zeros zeros_like cat stack flip roll narrow diagonal
    as_strided_scatter slice_scatter select_scatter diagonal_scatter constant_pad_nd
    index index_select gather scatter masked_fill masked_fill_ masked_select where
    index_put index_put_ take embedding repeat repeat_interleave tril triu
    eq ne lt le gt ge logical_and logical_or logical_not logical_xor isnan isinf isfinite
    isposinf isneginf signbit bitwise_and bitwise_or bitwise_xor bitwise_not nonzero any all
    max min amax amin argmax argmin maximum minimum fmax fmin clamp clamp_ clamp_min clamp_min_
    clamp_max clamp_max_ hardtanh hardtanh_ hardtanh_backward relu relu_ threshold threshold_
    threshold_backward leaky_relu leaky_relu_ leaky_relu_backward sort topk kthvalue
    max_pool1d max_pool2d_with_indices max_pool2d_with_indices_backward
    neg neg_ abs abs_ sign sign_ sgn floor ceil round trunc frac
    mul mul_ div div_ reciprocal reciprocal_ square fmod fmod_
    adaptive_max_pool2d adaptive_max_pool3d max_pool3d_with_indices fractional_max_pool2d
    fractional_max_pool3d cummax cummin median nanmedian mode unique_consecutive _unique2 unique
    unique_dim frexp nextafter angle softshrink_backward hardshrink_backward softshrink hardshrink
    _cummax_helper _cummin_helper copysign copysign_ heaviside heaviside_ diag_embed block_diag
    channel_shuffle native_channel_shuffle pixel_shuffle pixel_unshuffle count_nonzero complex
    _pack_padded_sequence _pad_packed_sequence _pack_padded_sequence_backward
    deg2rad rad2deg
    native_dropout_backward nan_to_num nan_to_num_ bucketize searchsorted one_hot
    sym_size sym_stride sym_numel sym_storage_offset is_same_size item equal _has_same_storage_numel
    _new_zeros_with_same_feature_meta
    set_ resize_as_ pin_memory _pin_memory is_pinned expand_as index_copy index_copy_ index_fill
    index_fill_ masked_scatter masked_scatter_ _unsafe_view _unsafe_index fill_diagonal_
    rot90 unfold_copy nonzero_static masked_scatter_backward hash_tensor _to_sparse is_coalesced
    _nnz sparse_dim dense_dim _to_sparse_csr _to_sparse_csc _to_sparse_bsr _to_sparse_bsc
    conj_physical _conj_physical
    """.split()
)
"""aten operations whose torch results are the same bits everywhere (see the module's text)."""

COMPLEX_EXACT = frozenset(
    """
    _to_copy clone contiguous copy copy_ detach detach_ empty empty_like empty_strided fill fill_
    full full_like lift lift_fresh lift_fresh_copy new_empty new_empty_strided new_full new_ones
    new_zeros ones ones_like zeros zeros_like zero_ cat stack flip roll constant_pad_nd index
    index_select gather scatter masked_fill masked_fill_ masked_select where index_put index_put_
    take repeat repeat_interleave tril triu eq ne isnan isinf isfinite neg neg_ conj_physical
    _conj _conj_physical resolve_conj resolve_neg _neg_view real imag view_as_real view_as_complex
    _local_scalar_dense item equal set_ resize_ resize_as_ select_scatter slice_scatter
    diagonal_scatter as_strided_scatter _unsafe_index slice_backward select_backward
    """.split()
)
"""EXACT operations that stay exact on complex tensors (copies, indexing, negation, equality):
complex products and sums are not, whatever table.EXACT says of their real forms."""

NOT_EXACT = frozenset(
    ["scatter.reduce", "scatter.value_reduce", "scatter_.reduce", "scatter_.value_reduce"]
)
"""Overloads of EXACT operations that add up values (and so depend on order)."""
