"""Where two op logs of the same step part: the first operation that computed different bits
(pure)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

__all__ = ["OpFinding", "first_op_difference", "differing_ops", "value_gap"]


@dataclass
class OpFinding:
    """What comparing two op logs found, in one of four kinds.

    - "identical": every op's inputs and outputs agree;
    - "operation": op `index` got identical inputs and produced different outputs;
    - "input": op `index` is the first to see different inputs, and that input came from outside
      the recorded operations (the batch, a parameter, an RNG state set outside torch);
    - "sequence": the op sequences part at `index` (a data-dependent branch, another code path);
    - "argument": op `index` got identical tensors but different Python numbers (a learning rate,
      a clipping threshold): the program asked for different arithmetic.
    """

    kind: str
    index: int | None = None
    a: dict | None = None
    b: dict | None = None
    outputs: list[int] = field(default_factory=list)
    inputs: list[int] = field(default_factory=list)

    def to_json(self) -> dict:
        """As plain JSON values (what `--json` prints and reports read)."""
        return {
            "kind": self.kind,
            "index": self.index,
            "a": self.a,
            "b": self.b,
            "outputs": self.outputs,
            "inputs": self.inputs,
        }


def first_op_difference(a: list[dict], b: list[dict]) -> OpFinding:
    """Walk both logs in order; report the first place they part (see OpFinding)."""
    produced_a: set[str] = set()
    for index, (op_a, op_b) in enumerate(zip(a, b)):
        if op_a["op"] != op_b["op"] or len(op_a["in"]) != len(op_b["in"]):
            return OpFinding("sequence", index, op_a, op_b)
        differing_inputs = [j for j, (x, y) in enumerate(zip(op_a["in"], op_b["in"])) if x != y]
        if differing_inputs:
            # An input that differs but was not made by an earlier recorded op came from outside.
            outside = [j for j in differing_inputs if op_a["in"][j] not in produced_a]
            if outside:
                return OpFinding("input", index, op_a, op_b, inputs=outside)
        elif op_a.get("sc") != op_b.get("sc"):
            return OpFinding("argument", index, op_a, op_b)
        elif op_a["out"] != op_b["out"]:
            differing = [j for j, (x, y) in enumerate(zip(op_a["out"], op_b["out"])) if x != y]
            return OpFinding("operation", index, op_a, op_b, outputs=differing)
        produced_a.update(op_a["out"])
    if len(a) != len(b):
        index = min(len(a), len(b))
        return OpFinding(
            "sequence",
            index,
            a[index] if index < len(a) else None,
            b[index] if index < len(b) else None,
        )
    return OpFinding("identical")


def differing_ops(a: list[dict], b: list[dict]) -> list[OpFinding]:
    """Every op (in order, while the sequences agree) with identical inputs and different
    outputs."""
    found = []
    for index, (op_a, op_b) in enumerate(zip(a, b)):
        if op_a["op"] != op_b["op"]:
            break
        if (
            op_a["in"] == op_b["in"]
            and op_a.get("sc") == op_b.get("sc")
            and op_a["out"] != op_b["out"]
        ):
            outputs = [j for j, (x, y) in enumerate(zip(op_a["out"], op_b["out"])) if x != y]
            found.append(OpFinding("operation", index, op_a, op_b, outputs=outputs))
    return found


def value_gap(x, y) -> dict[str, Any]:
    """Largest absolute difference and largest distance in units in the last place of two
    tensors."""
    import torch

    if x.shape != y.shape or x.dtype != y.dtype:
        return {"max_abs": None, "max_ulps": None, "elements_differing": None}
    differing = (
        int((x != y).sum())
        if not x.dtype.is_floating_point
        else int(((x != y) & ~(x.isnan() & y.isnan())).sum())
    )
    if not (x.dtype.is_floating_point and x.numel()):
        return {
            "max_abs": float((x.double() - y.double()).abs().max()) if x.numel() else 0.0,
            "max_ulps": None,
            "elements_differing": differing,
        }
    diff = (x.double() - y.double()).abs()
    max_abs = float(diff.nan_to_num(nan=math.inf).max())
    int_type = {2: torch.int16, 4: torch.int32, 8: torch.int64}[x.element_size()]

    # Ordered integer views: adjacent floats are adjacent integers, so ulps are integer distances.
    def ordered(t):
        bits = t.contiguous().view(int_type).long()
        return torch.where(bits < 0, -(bits & ((1 << (8 * x.element_size() - 1)) - 1)), bits)

    max_ulps = int((ordered(x) - ordered(y)).abs().max())
    return {"max_abs": max_abs, "max_ulps": max_ulps, "elements_differing": differing}
