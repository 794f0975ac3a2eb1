# Two embedding lookups on two lines, deterministic on the CPU: audit must pass here and list both
# call sites of embedding_dense_backward as nondeterministic on CUDA.
import torch

emb = torch.nn.Embedding(10, 4)
opt = torch.optim.SGD(emb.parameters(), lr=0.1)
for step in range(3):
    opt.zero_grad()
    first = emb(torch.tensor([1, 2, 3]))
    second = emb(torch.tensor([3, 4]))
    (first.sum() + second.pow(2).sum()).backward()
    opt.step()
