# Seeds torch only; the Dataset draws from Python's random, which stays unseeded without twice.
import random

import torch
from torch.utils.data import DataLoader, Dataset

torch.manual_seed(0)


class RandomCrop(Dataset):
    def __len__(self):
        return 32

    def __getitem__(self, i):
        offset = random.randint(0, 3)
        return torch.arange(8, dtype=torch.float32)[offset:offset + 4]


model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for batch in DataLoader(RandomCrop(), batch_size=4, shuffle=False):
    opt.zero_grad()
    model(batch).pow(2).mean().backward()
    opt.step()
