"""How portable mode handles each aten overload, decided once per overload by rules, not by a
list of names that forgets one.

In the order tried:

1. **kernel**: twice computes it (table.KERNELS, by the aten name, or "namespace::name" for
   another namespace's op: torch_nn's chunked linear cross-entropy).
2. **foreach**: a `_foreach_` form, computed as its per-tensor operation on each element.
3. **exact**: torch's result is the same bits everywhere. Decided by the schema where it can be:
   every output is a view of an input (`Tensor(a)` returns: `split`, `unsafe_split`'s views,
   `as_strided`, ...) or the op is tagged `inplace_view`; otherwise by table.EXACT, the
   operations that copy, index, compare or round exactly once. On complex tensors only views
   and table.COMPLEX_EXACT are: complex arithmetic is uncovered.
4. **prim**: a `prims.` operation (reached from PyTorch's reference implementations), handled as
   the aten operation of the same name and arguments, or by its own rule (conversions and views
   are exact).
5. **out**: an `out=` form, computed as the overload that returns its result (routed in turn),
   then copied into `out`.
6. **decomposed**: PyTorch's own decomposition (`torch._decomp.decomposition_table`, or the
   op's CompositeImplicitAutograd definition) runs under the mode, so each operation it is made
   of is routed in turn: portable exactly when its parts are.
7. **uncovered**: anything else on floating-point tensors (an error under strict).

Random operations (tagged `nondeterministic_seeded`) are never exact and never decomposed into
torch's own generator: they are kernels (Philox) or uncovered.
"""

from __future__ import annotations

import torch
from torch._prims_common import canonicalize_dim

from twice.portable.dispatch.table import COMPLEX_EXACT, EXACT, KERNELS, NOT_EXACT

__all__ = [
    "KERNEL",
    "FOREACH",
    "EXACT_ROUTE",
    "INDEX_PUT",
    "PRIM",
    "DECOMPOSED",
    "OTHER",
    "OUT",
    "route",
    "coverage",
    "describe",
    "overload_name",
    "core_overloads",
]

KERNEL, FOREACH, EXACT_ROUTE, INDEX_PUT, PRIM, DECOMPOSED, OTHER, OUT = range(8)
_NAMES = {
    KERNEL: "kernel",
    FOREACH: "foreach",
    EXACT_ROUTE: "exact",
    INDEX_PUT: "exact",
    PRIM: "prim",
    DECOMPOSED: "decomposed",
    OTHER: "uncovered",
    OUT: "out",
}

# prims whose aten namesake takes other arguments, or that have none: their own rule.
_PRIM_EXACT = frozenset(
    """convert_element_type broadcast_in_dim collapse_view collapse split_dim squeeze transpose
    view_of view_of_dtype as_strided slice slice_in_dim reshape rev expand_dims where fill clone
    empty_strided full full_like iota copy_strided copy_to resize empty_permuted scalar_tensor
    select_scatter slice_scatter maximum minimum eq ne lt le gt ge abs neg sign signbit
    bitwise_and bitwise_or bitwise_xor bitwise_not floor ceil round trunc isfinite isinf isnan
    mul div real imag conj_physical""".split()
)


def overload_name(func) -> str:
    """ "mm.default": the packet's name and the overload's (an aten or prims op), or with its
    namespace for another ("torch_nn::_linear_cross_entropy_batch_chunked.default")."""
    name = f"{func.overloadpacket.__name__}.{func._overloadname}"
    return name if func.namespace in ("aten", "prims") else f"{func.namespace}::{name}"


def _is_view(func) -> bool:
    """Whether every output of the overload aliases an input without writing it (a view), by its
    schema, or the op changes only a tensor's view of its storage."""
    if torch.Tag.inplace_view in func.tags:
        return True
    returns = func._schema.returns
    return bool(returns) and all(
        r.alias_info is not None and not r.alias_info.is_write for r in returns
    )


def _decomposition(func):
    from torch._decomp import decomposition_table

    return decomposition_table.get(func)


_PRIM_ADAPTED = {  # prims whose aten namesake takes its arguments in another form
    "sum": lambda x, dims, output_dtype=None: torch.ops.aten.sum.dim_IntList(
        x, dims, False, dtype=output_dtype
    ),
    "var": lambda x, dims, correction=1, output_dtype=None: torch.ops.aten.var.correction(
        x, dims, correction=correction
    ),
    "prod": lambda x, dims, output_dtype=None: _prod_over(x, dims, output_dtype),
    "amax": lambda x, dims, output_dtype=None: torch.ops.aten.amax.default(x, dims),
    "amin": lambda x, dims, output_dtype=None: torch.ops.aten.amin.default(x, dims),
}


def _prod_over(x, dims, output_dtype):
    for dim in sorted((canonicalize_dim(x.dim(), d) for d in dims), reverse=True):
        x = torch.ops.aten.prod.dim_int(x, dim, False, dtype=output_dtype)
    return x


def _prim_target(func):
    """The aten overload a prim stands for (or a function calling it), or None."""
    if func.overloadpacket.__name__ in _PRIM_ADAPTED:
        return _PRIM_ADAPTED[func.overloadpacket.__name__]
    packet = getattr(torch.ops.aten, func.overloadpacket.__name__, None)
    if packet is None:
        return None
    for overload in ("Tensor", "default"):  # add's Tensor overload, not its Scalar one (default)
        if overload in packet.overloads():
            return getattr(packet, overload)
    return None


def _functional(func):
    """For an `out=` overload with one output (`atan2.out`), the overload that returns it."""
    if not func._overloadname.endswith("out") or len(func._schema.returns) != 1:
        return None
    written = [a for a in func._schema.arguments if a.alias_info and a.alias_info.is_write]
    if len(written) != 1 or not written[0].kwarg_only:
        return None
    packet = func.overloadpacket
    base = func._overloadname[: -len("out")].rstrip("_") or "default"
    given = _positional(func)
    overloads = packet.overloads()
    names = [base] * (base in overloads) + [name for name in overloads if name != base]
    for name in names:  # the one taking the same positional arguments (arange.start_out: step)
        candidate = getattr(packet, name)
        if name.endswith("out") or len(candidate._schema.returns) != 1:
            continue
        if _positional(candidate) == given:
            return candidate
    return None


def _positional(func) -> list[str]:
    return [a.name for a in func._schema.arguments if not a.kwarg_only]


METADATA = "metadata"
"""The exact route's handler slot for an operation that reads no value: a sparse tensor's
count of stored values, its dimensions, whether it is coalesced, whether two tensors' storages
hold as many elements (forward-mode AD asks)."""
_METADATA = {"is_coalesced", "_nnz", "sparse_dim", "dense_dim", "_dimI", "_dimV"}
_METADATA |= {"_has_same_storage_numel", "is_same_size", "_new_zeros_with_same_feature_meta"}


def route(func) -> tuple[int, object, str]:
    """(how, handler, name) for an overload: see the module's text for the order."""
    name = overload_name(func)
    namespace = func.namespace
    if namespace == "aten" and name in KERNELS:
        return KERNEL, KERNELS[name], name
    if "::" in name and name in KERNELS:  # a kernel for another namespace's op (torch_nn's)
        return KERNEL, KERNELS[name], name
    if namespace == "aten" and name.startswith("_foreach_"):
        return FOREACH, None, name
    seeded = torch.Tag.nondeterministic_seeded in func.tags
    base = func.overloadpacket.__name__
    exact = base in EXACT or (base.endswith("_") and base[:-1] in EXACT)  # in-place forms too
    if not seeded and namespace == "aten" and (_is_view(func) or exact):
        if name in NOT_EXACT:
            return OTHER, None, name
        # the handler slot says whether it stays exact on complex tensors too, or reads no value
        complex_too = _is_view(func) or base in COMPLEX_EXACT or base.rstrip("_") in COMPLEX_EXACT
        slot = METADATA if base in _METADATA else complex_too
        return (INDEX_PUT if base.startswith("index_put") else EXACT_ROUTE), slot, name
    if namespace == "prims":
        if base in _PRIM_EXACT or _is_view(func):
            return EXACT_ROUTE, None, name
        target = _prim_target(func)
        if target is not None:
            return PRIM, target, f"prims::{name}"
        return OTHER, None, name
    functional = _functional(func)
    if functional is not None and route(functional)[0] != OTHER:
        return OUT, functional, name
    decomposition = _decomposition(func)
    if decomposition is not None and decomposition.__module__.startswith("torch._refs"):
        # PyTorch's reference implementations run their prims outside the dispatch mode (their
        # parts would be torch's kernels, unseen): no decomposition for portable mode.
        decomposition = None
    if seeded:
        decomposition = None
    if decomposition is not None:
        return DECOMPOSED, decomposition, name
    if func.has_kernel_for_dispatch_key(torch._C.DispatchKey.CompositeImplicitAutograd):
        return DECOMPOSED, func.decompose, name
    return OTHER, None, name


def coverage(func) -> str:
    """ "kernel", "foreach", "exact", "prim", "decomposed" or "uncovered" for an overload, before
    looking at its arguments (a decomposition is portable when its parts are)."""
    return _NAMES[route(func)[0]]


def describe(func) -> str:
    """One line saying how the overload is covered, for the coverage listing."""
    how, handler, name = route(func)
    if how == KERNEL:
        return f"kernel ({handler.__module__})"
    if how in (EXACT_ROUTE, INDEX_PUT):
        if _is_view(func):
            return "exact (a view, by its schema)"
        return "exact (copies, indexes, compares or rounds once)"
    if how == OUT:
        return f"out= form of {overload_name(handler)} ({describe(handler)})"
    if how == DECOMPOSED:
        where = getattr(handler, "__module__", None)
        if where is None or not where.startswith("torch._"):
            return "decomposed (its CompositeImplicitAutograd definition)"
        return f"decomposed ({where}.{handler.__name__})"
    return _NAMES[how]


def core_overloads() -> list:
    """Every overload of PyTorch's Core ATen opset (tagged `torch.Tag.core`), sorted by name."""
    found = []
    for packet_name in dir(torch.ops.aten):
        packet = getattr(torch.ops.aten, packet_name, None)
        if not isinstance(packet, torch._ops.OpOverloadPacket):
            continue
        for overload in packet.overloads():
            op = getattr(packet, overload)
            if torch.Tag.core in op.tags:
                found.append(op)
    return sorted(found, key=overload_name)
