# Fault injection: forked trainers write checkpoints continuously and are killed with SIGKILL at
# random moments; after each kill the newest loadable checkpoint must be valid, and training
# resumed from it must end bit-identical to an uninterrupted run. Prints a JSON report.
import json
import os
import random
import signal
import sys
import time
import warnings
from pathlib import Path

import torch

from twice import checkpoint

STEPS = 40
folder = Path(sys.argv[1])
kills = int(sys.argv[2])  # trials go on until this many trainers were killed mid-run (a fast one may finish first)


def build():
    model = torch.nn.Sequential(torch.nn.Linear(384, 384), torch.nn.Tanh(), torch.nn.Linear(384, 384))
    model.load_state_dict({k: torch.full_like(v, 0.01) for k, v in model.state_dict().items()})
    return model, torch.optim.Adam(model.parameters(), lr=1e-3)


def train(model, opt, start, stop, save_to=None):
    for step in range(start, stop):
        x = torch.randn(16, 384, generator=torch.Generator().manual_seed(step))
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
        if save_to is not None:
            checkpoint.save(checkpoint.step_dir(save_to, step + 1), keep_last=3, model=model, optimizer=opt,
                            counters={"step": step + 1})


def resume_from(path):
    model, opt = build()
    start = 0
    if path is not None:
        start = checkpoint.load(path, model=model, optimizer=opt)["counters"]["step"]
    return model, opt, start


torch.set_num_threads(1)
reference, ref_opt = build()
train(reference, ref_opt, 0, STEPS)
rng = random.Random(1234)
report = {"trials": 0, "killed_mid_run": 0, "valid": 0, "matched": 0, "skipped_damaged": 0, "failures": []}
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    trial = -1
    while report["killed_mid_run"] < kills and report["trials"] < 3 * kills:
        trial += 1
        pid = os.fork()
        if pid == 0:  # a trainer restarting from the latest checkpoint, as a preempted job does
            model, opt, start = resume_from(checkpoint.latest(folder))
            train(model, opt, start, STEPS, save_to=folder)
            os._exit(0)
        time.sleep(rng.uniform(0.0, 0.25))
        os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        report["trials"] += 1
        report["killed_mid_run"] += int(os.WIFSIGNALED(status))
        latest = checkpoint.latest(folder)
        try:
            model, opt, start = resume_from(latest)
            report["valid"] += 1
            train(model, opt, start, STEPS)
            if all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), reference.state_dict().values())):
                report["matched"] += 1
            else:
                report["failures"].append(f"trial {trial}: resumed from {latest} differs")
        except Exception as exc:  # noqa: BLE001 - report every failure, keep injecting
            report["failures"].append(f"trial {trial}: {latest}: {exc}")
        if latest is not None and int(latest.name.split("-")[1]) >= STEPS:
            for old in checkpoint.list_checkpoints(folder):  # finished: start over, keep killing
                __import__("shutil").rmtree(old)
report["skipped_damaged"] = sum("skipping checkpoint" in str(w.message) for w in caught)
report["leftover_temporaries"] = sorted(p.name for p in folder.iterdir() if p.name.startswith("."))
print(json.dumps(report))
