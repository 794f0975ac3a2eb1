"""L2 norms of gradients and parameters for the step trace, cheap on the CPU and batched on
accelerators."""

from __future__ import annotations

__all__ = ["tensor_norm", "norms", "floats"]


def tensor_norm(grad):
    """The L2 norm of one gradient (kept as a tensor: no device sync until the record is written);
    of a sparse one, the norm of its values once duplicates are summed (what the dense tensor
    has)."""
    import torch

    grad = grad.detach()
    if grad.layout == torch.sparse_coo:
        grad = grad.coalesce().values()
    elif grad.layout != torch.strided:
        grad = grad.values()  # compressed layouts hold no duplicates
    return torch.linalg.vector_norm(grad)


def norms(grads: list) -> list:
    """L2 norms of many tensors: on the CPU as Python floats, one `vector_norm` each; on an
    accelerator as 0-d tensors from one fused call (any mix of dtypes and devices: where the fused
    kernel cannot take them, torch loops over them itself), read later in one device-to-host copy.

    The CPU path is the step trace's hot spot on small models: it runs once per step on code and
    data the step has just evicted from the CPU caches, where a torch.no_grad() block, the fused
    call's own loop and a float() per 0-d tensor cost more than the norms themselves (measured in
    the training loop: 150 us against 86 us a step for a small CNN). Same values either way:
    `_foreach_norm` computes each norm with `linalg.vector_norm` (a test holds them together)."""
    import torch

    if not grads:
        return []
    strided = torch.strided
    if all(g.is_cpu and g.layout is strided for g in grads):
        vector_norm = torch.linalg.vector_norm
        if any(g.requires_grad for g in grads):  # parameters (or gradients made with create_graph)
            with torch.no_grad():
                return [float(vector_norm(g)) for g in grads]
        return [float(vector_norm(g)) for g in grads]
    foreach_norm = getattr(torch, "_foreach_norm", None)
    if foreach_norm is not None:
        with torch.no_grad():  # rather than a detach() per tensor: one op each under an op log
            try:
                return list(foreach_norm(grads))
            except (RuntimeError, TypeError):
                pass
    return [tensor_norm(g) for g in grads]


def floats(values: list) -> list[float]:
    """Python floats of 0-d tensors (and numbers): one device-to-host read where they share an
    accelerator."""
    import torch

    if (
        len(values) > 1
        and all(isinstance(v, torch.Tensor) for v in values)
        and not values[0].is_cpu
        and len({(v.device, v.dtype) for v in values}) == 1
    ):
        return torch.stack(values).tolist()
    return [
        float(v) for v in values
    ]  # on the CPU, a float() each costs less than stacking them first
