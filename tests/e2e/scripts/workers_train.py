"""Workers started by a multiprocessing start method (argv[1]), each training its own model,
while the parent trains one too: every process that steps must get a trace of its own."""

import multiprocessing
import subprocess
import sys

import torch


def train(steps: int, lr: float) -> None:
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    x, y = torch.randn(16, 4), torch.randn(16, 1)
    for _ in range(steps):
        optimizer.zero_grad()
        ((model(x) - y) ** 2).mean().backward()
        optimizer.step()


if __name__ == "__main__":
    method = sys.argv[1]
    if method == "subprocess":
        # not multiprocessing's: named in the order the traces are claimed, so one at a time
        subprocess.run([sys.executable, "-c", "import workers_train as w; w.train(3, 0.2)"])
        train(4, 0.1)
    else:
        context = multiprocessing.get_context(method)
        workers = [context.Process(target=train, args=(3, 0.1 * (i + 2))) for i in range(1)]
        for worker in workers:
            worker.start()
            worker.join()  # one after another: the names must not depend on a race
        train(4, 0.1)
