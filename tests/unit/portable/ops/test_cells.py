"""ops/cells: the time steps of the fused recurrent layers, torch's CPU cells spelled with the
portable kernels."""

import torch

from twice.portable.dispatch.mode import PortableMode
from twice.portable.ops import cells


def test_each_step_starts_from_the_state_before_it_in_either_direction():
    h0 = torch.tensor([[9.0]])
    y = torch.tensor([[[1.0]], [[2.0]], [[3.0]]])  # (steps, batch, hidden)
    assert cells.previous(h0, y, reverse=False).flatten().tolist() == [9.0, 1.0, 2.0]
    assert cells.previous(h0, y, reverse=True).flatten().tolist() == [2.0, 3.0, 9.0]
    assert {"lstm", "gru", "rnn_tanh", "rnn_relu"} <= set(cells.CELLS)


def test_an_lstm_cell_trains_under_strict_with_the_same_bits_each_time():
    def run():
        torch.manual_seed(0)
        cell = torch.nn.LSTMCell(4, 3)
        x = torch.randn(5, 4)
        with PortableMode("strict"):
            h, c = cell(x)
            (h.sum() + c.square().sum()).backward()
        return [h.detach(), c.detach(), cell.weight_ih.grad, cell.weight_hh.grad]

    first, again = run(), run()
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    torch.manual_seed(0)
    plain = torch.nn.LSTMCell(4, 3)(torch.randn(5, 4))[0]
    assert torch.allclose(first[0], plain.detach(), atol=1e-6)  # torch's cell, to float noise
