"""Portable kernels for embedding_bag (sum, mean and max bags, per-sample weights, padding) and
its gradients: each bag's rows added exactly (ops_linear.exact_linear), a mean one division."""

from __future__ import annotations

import torch

from twice.portable.dispatch.table import KERNELS, PortableUnsupported, kernel
from twice.portable.ops.linear import exact_linear
from twice.portable.ops.math import floating

_F64 = torch.float64
aten = torch.ops.aten


# embedding_bag: each bag's rows added exactly (one grid per column), the mean one division.


def _bag_of(indices, offsets, bags):
    """The bag of each index position (torch leaves its own offset2bag empty on fast paths)."""
    positions = torch.arange(indices.numel(), device=indices.device)
    return torch.searchsorted(offsets[:bags].contiguous(), positions, right=True) - 1


def _bag_rows(weight, indices, offset2bag, per_sample_weights, padding_idx):
    rows = weight.to(_F64)[indices]
    if per_sample_weights is not None:
        rows = rows * per_sample_weights.to(_F64).unsqueeze(1)
    if padding_idx is not None and padding_idx >= 0:
        rows = torch.where((indices == padding_idx).unsqueeze(1), 0.0, rows)
    return rows


@kernel("_embedding_bag.default", "_embedding_bag_forward_only.default")
def _embedding_bag(
    weight,
    indices,
    offsets,
    scale_grad_by_freq=False,
    mode=0,
    sparse=False,
    per_sample_weights=None,
    include_last_offset=False,
    padding_idx=-1,
):
    """Torch's own kernel gives the bookkeeping (offset2bag, bag sizes, the maxima's indices;
    a maximum is exact); the sums and means are replaced by exact ones."""
    floating(weight, per_sample_weights)
    out, offset2bag, bag_size, max_indices = aten._embedding_bag.default(
        weight,
        indices,
        offsets,
        scale_grad_by_freq,
        mode,
        sparse,
        per_sample_weights,
        include_last_offset,
        padding_idx,
    )
    if mode == 2 or indices.numel() == 0:
        return out, offset2bag, bag_size, max_indices
    bags = out.shape[0]
    where = _bag_of(indices, offsets, bags)
    rows = _bag_rows(weight, indices, where, per_sample_weights, padding_idx)
    zeros = torch.zeros(bags, weight.shape[1], dtype=_F64)
    total = exact_linear(
        rows, lambda t: zeros.index_add(0, where, t), (0,), indices.numel(), weight.dtype
    )
    if mode == 1:
        kept = (indices != padding_idx) if padding_idx is not None and padding_idx >= 0 else None
        ones = torch.ones(indices.numel(), dtype=_F64) if kept is None else kept.to(_F64)
        count = torch.zeros(bags, dtype=_F64).index_add(0, where, ones)
        total = torch.where(count.unsqueeze(1) > 0, total / count.clamp(min=1).unsqueeze(1), 0.0)
    return total.to(out.dtype), offset2bag, bag_size, max_indices


@kernel("_embedding_bag_backward.default")
def _embedding_bag_backward(
    grad,
    indices,
    offsets,
    offset2bag,
    bag_size,
    maximum_indices,
    num_weights,
    scale_grad_by_freq,
    mode,
    sparse,
    per_sample_weights,
    padding_idx=-1,
):
    if sparse:
        raise PortableUnsupported("sparse gradients of embedding_bag")
    offset2bag = _bag_of(indices, offsets, grad.shape[0])
    rest = (bag_size, maximum_indices, num_weights, scale_grad_by_freq, mode)
    return _embedding_bag_dense_backward(
        grad, indices, offset2bag, *rest, per_sample_weights, padding_idx
    )


@kernel("_embedding_bag_dense_backward.default")
def _embedding_bag_dense_backward(
    grad,
    indices,
    offset2bag,
    bag_size,
    maximum_indices,
    num_weights,
    scale_grad_by_freq,
    mode,
    per_sample_weights,
    padding_idx=-1,
):
    """Each weight row's gradient: the gradients of the bags that used it (divided by the bag's
    size for a mean, times the sample's weight), added exactly."""
    floating(grad, per_sample_weights)
    if mode == 2:  # each column's gradient goes to the row that held the bag's maximum
        columns = torch.arange(grad.shape[1]).expand_as(maximum_indices)
        held = (maximum_indices >= 0) & (bag_size > 0).unsqueeze(1)  # an empty bag holds none
        if padding_idx is not None and padding_idx >= 0:
            held &= maximum_indices != padding_idx
        zeros = torch.zeros(num_weights, grad.shape[1], dtype=_F64)

        def spread(t):
            return zeros.index_put((maximum_indices[held], columns[held]), t[held], True)

        return exact_linear(grad, spread, None, max(1, grad.numel()), grad.dtype).to(grad.dtype)
    if indices.numel() == 0:
        return torch.zeros(num_weights, grad.shape[1], dtype=grad.dtype)
    if offset2bag.numel() != indices.numel():
        raise PortableUnsupported("embedding_bag's backward without each index's bag")
    where = offset2bag
    rows = grad.to(_F64)[where]
    if mode == 1:
        rows = rows / bag_size.to(_F64).clamp(min=1)[where].unsqueeze(1)
    if per_sample_weights is not None:
        rows = rows * per_sample_weights.to(_F64).unsqueeze(1)
    if padding_idx is not None and padding_idx >= 0:
        rows = torch.where((indices == padding_idx).unsqueeze(1), 0.0, rows)
    zeros = torch.zeros(num_weights, grad.shape[1], dtype=_F64)
    total = exact_linear(
        rows, lambda t: zeros.index_add(0, indices, t), (0,), indices.numel(), grad.dtype
    )
    if scale_grad_by_freq:
        counts = torch.bincount(indices, minlength=num_weights).to(_F64).clamp(min=1)
        total = total / counts.unsqueeze(1)
    return total.to(grad.dtype)


@kernel("_embedding_bag_per_sample_weights_backward.default")
def _embedding_bag_psw_backward(grad, weight, indices, offsets, offset2bag, mode, padding_idx=-1):
    """d loss / d w_i = <grad of i's bag, weight row of i>: float32 products are exact in
    float64, then summed exactly."""
    floating(grad, weight)
    from twice.portable.arithmetic.exact import exact_sum

    where = _bag_of(indices, offsets, grad.shape[0])
    products = grad.to(_F64)[where] * weight.to(_F64)[indices]
    out = exact_sum(products, (1,), False, grad.dtype, grad.dtype)
    if padding_idx is not None and padding_idx >= 0:
        out = torch.where(indices == padding_idx, 0.0, out).to(grad.dtype)
    return out


@kernel("embedding_renorm_.default")
def _embedding_renorm_(weight, indices, max_norm, norm_type):
    """Each row that `indices` names, once, scaled by max_norm / (norm + 1e-7) where its
    norm_type-norm exceeds max_norm (torch's formula), the norm by the portable vector norm."""
    floating(weight)
    rows = torch.unique(indices.reshape(-1))
    if rows.numel() == 0:
        return weight
    picked = weight[rows]
    norm = KERNELS["linalg_vector_norm.default"](picked, norm_type, [1], True).to(_F64)
    factor = torch.where(norm > float(max_norm), float(max_norm) / (norm + 1e-7), 1.0)
    weight[rows] = (picked.to(_F64) * factor).to(weight.dtype)
    return weight
