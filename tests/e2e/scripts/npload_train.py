"""A ten-line loop that slices its batches from an array loaded with np.load."""

import numpy as np
import torch

table = torch.from_numpy(np.load("train.npy"))
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
for step in range(5):
    rows = table[step * 8 : (step + 1) * 8]
    loss = torch.nn.functional.mse_loss(model(rows[:, :4]), rows[:, 4:])
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
