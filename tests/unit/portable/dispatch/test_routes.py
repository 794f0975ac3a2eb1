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


def test_no_decomposition_the_mode_runs_branches_on_the_device():
    """A decomposition of torch's that the mode runs must compute the same operations on every
    device; one that branches on the device (log_sigmoid_forward kept a buffer on a CPU alone)
    needs a kernel of the mode's own. This reads the source of every decomposition routed."""
    import inspect
    import textwrap

    import twice.portable.dispatch.mode  # noqa: F401  (every kernel registered)
    from twice.portable.dispatch import optable

    branching = []
    for op in optable.overloads():
        try:
            kind, handler, name = routes.route(op)
        except RuntimeError:  # listed by the dispatcher, not an operator of its own
            continue
        if kind != routes.DECOMPOSED:
            continue
        try:
            source = textwrap.dedent(inspect.getsource(inspect.unwrap(handler)))
        except (OSError, TypeError):  # a C++ decomposition: no Python source to read
            continue
        if any(word in source for word in DEVICE_BRANCHES):
            branching.append(name)
    assert branching == []
