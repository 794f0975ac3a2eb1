"""dispatch/routes: how each overload is covered, by rule: every view exact by its schema,
no random op exact."""

import torch

from twice.portable.dispatch import routes


def _every_overload():
    for name in dir(torch.ops.aten):
        packet = getattr(torch.ops.aten, name, None)
        if isinstance(packet, torch._ops.OpOverloadPacket):
            for overload in packet.overloads():
                yield getattr(packet, overload)


def test_every_view_is_exact_by_its_schema_and_no_random_op_is():
    views = seeded = 0
    for op in _every_overload():
        returns = op._schema.returns
        if returns and all(r.alias_info is not None and not r.alias_info.is_write for r in returns):
            views += 1
            assert routes.coverage(op) in ("exact", "kernel"), op
        if torch.Tag.nondeterministic_seeded in op.tags:
            seeded += 1
            assert routes.coverage(op) != "exact", op
    assert views > 40 and seeded > 20  # the rule saw the classes it is about


DEVICE_BRANCHES = ("is_cuda", "is_xpu", "is_cpu", "is_mps", "device.type")

# Functions torch's decompositions call that branch on the device, each read and judged: the
# branch chooses no value, or it is named here as left.
REVIEWED = {
    "_upsample_nearest": "chooses the result's memory format: no value",
    "_reflection_or_replication_pad": "chooses the result's memory format: no value",
    "_safe_copy_out": "checks that out= is on the input's device: no value",
    "native_batch_norm_helper": "casts the saved statistics on a CPU only: detours.py gives "
    "every device the CPU's",
}


def _source(function) -> str:
    import inspect
    import textwrap

    try:
        return textwrap.dedent(inspect.getsource(inspect.unwrap(function)))
    except (OSError, TypeError):  # a C++ function: no Python source to read
        return ""


def test_no_decomposition_the_mode_runs_branches_on_the_device():
    """A decomposition of torch's that the mode runs must compute the same operations on every
    device; one that branches on the device (log_sigmoid_forward kept a buffer on a CPU alone)
    needs a kernel of the mode's own. This reads every decomposition, prim target and out=
    function routed, and each function of torch's it calls, one level down."""
    import inspect
    import types

    import twice.portable.dispatch.mode  # noqa: F401  (every kernel registered)
    from twice.portable.dispatch import optable

    branching, reviewed = [], set()
    for op in optable.overloads():
        try:
            kind, handler, name = routes.route(op)
        except RuntimeError:  # listed by the dispatcher, not an operator of its own
            continue
        if kind not in (routes.DECOMPOSED, routes.PRIM, routes.OUT) or handler is None:
            continue
        function = inspect.unwrap(handler)
        if any(word in _source(function) for word in DEVICE_BRANCHES):
            branching.append(name)
        names = getattr(getattr(function, "__code__", None), "co_names", ())
        for called in names:
            callee = getattr(function, "__globals__", {}).get(called)
            if not isinstance(callee, types.FunctionType):
                continue
            if any(word in _source(callee) for word in DEVICE_BRANCHES):
                if callee.__name__ in REVIEWED:
                    reviewed.add(callee.__name__)
                else:
                    branching.append(f"{name} (through {callee.__name__})")
    assert branching == []
    assert reviewed == set(REVIEWED)  # each entry still describes torch
