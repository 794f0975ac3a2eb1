"""twice.parallel, the public face of data/parallel.py: the micro-batch tree each rank adds, and
what InvariantDataParallel refuses."""

import pytest
import torch

from twice.parallel import InvariantDataParallel, tree_nodes


@pytest.mark.parametrize("leaves,world", [(8, 1), (8, 2), (8, 4), (8, 8), (6, 3), (12, 3), (10, 5)])
def test_the_micro_batch_tree_is_covered_exactly_by_each_ranks_subtrees(leaves, world):
    share = leaves // world
    for rank in range(world):
        nodes = tree_nodes(0, leaves, (rank * share, (rank + 1) * share))
        covered = [i for lo, hi in nodes for i in range(lo, hi)]
        assert covered == list(range(rank * share, (rank + 1) * share))


def test_invariant_mode_refuses_batches_and_world_sizes_it_cannot_split_evenly():
    net = torch.nn.Linear(4, 1)
    with pytest.raises(ValueError, match="micro_batches must be at least 1"):
        InvariantDataParallel(net, micro_batches=0)
    model = InvariantDataParallel(net, micro_batches=4)
    with pytest.raises(
        ValueError, match="a global batch of 6 samples does not split into 4 equal micro-batches"
    ):
        model.backward(torch.randn(6, 4), lambda m, x: m(x).mean())
    loss = model.backward(torch.randn(8, 4), lambda m, x: m(x).pow(2).mean())
    assert loss.shape == () and net.weight.grad is not None and model.state_dict()["steps"] == 1
