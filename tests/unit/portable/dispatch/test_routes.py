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
