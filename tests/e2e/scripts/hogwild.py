# Hogwild: two processes update shared-memory parameters without a lock (seeded, identical data).
import torch
import torch.multiprocessing as mp


def train(model, rank):
    # One thread per worker, as Hogwild runs them: a forked child must not enter the OpenMP pool
    # its parent started (with Intel's MKL the first matrix product then waits on it forever).
    torch.set_num_threads(1)
    torch.manual_seed(rank)
    data = torch.randn(200, 64)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for i in range(200):
        opt.zero_grad()
        model(data[i:i + 1]).pow(2).sum().backward()
        opt.step()


if __name__ == "__main__":
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.Tanh(), torch.nn.Linear(256, 64))
    model.share_memory()
    ctx = mp.get_context("fork")
    workers = [ctx.Process(target=train, args=(model, rank)) for rank in range(2)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
