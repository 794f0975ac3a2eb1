"""Data-parallel training whose trained bits do not depend on the number of processes.

model = twice.parallel.InvariantDataParallel(net, micro_batches=8)
"""

from twice.data.parallel import InvariantDataParallel, tree_nodes

__all__ = ["InvariantDataParallel", "tree_nodes"]
