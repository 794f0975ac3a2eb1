"""nanoGPT's shape of loop: batches sliced from a memory-mapped token file by random offsets
(get_batch), no DataLoader."""

import numpy as np
import torch

data = np.memmap("data/train.bin", dtype=np.uint16, mode="r")
block, batch = 8, 4


def get_batch():
    ix = torch.randint(len(data) - block - 1, (batch,))
    x = torch.stack([torch.from_numpy(data[i : i + block].astype(np.int64)) for i in ix])
    y = torch.stack([torch.from_numpy(data[i + 1 : i + 1 + block].astype(np.int64)) for i in ix])
    return x, y


class Bigram(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.table = torch.nn.Embedding(64, 64)

    def forward(self, x, y):
        logits = self.table(x)
        return torch.nn.functional.cross_entropy(logits.view(-1, 64), y.view(-1))


model = Bigram()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
for _ in range(6):
    x, y = get_batch()
    loss = model(x, y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
