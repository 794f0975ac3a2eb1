"""The step trace read a step late (record/latewrite.py), on the CPU under Triton's interpreter:
`late_trace.py FOLDER KIND [kill]`. KIND: sgd (one optimizer), gan (two), hand (no optimizer),
explicit (twice.Run.step-style records). Trains twice, into FOLDER/late with the late writer
taking CPU tensors (its Triton fold run by the interpreter), and into FOLDER/now synchronously,
each tensor digested as a CUDA tensor is (`device_digest` of `device_fold`, the fold's CPU
reference); prints, as JSON, the lines each trace held after each step. With `kill`, the late
run sends itself SIGTERM after step 3."""

import json
import os
import signal
import sys
from pathlib import Path

import torch

from twice.core.device_fold import device_fold
from twice.core.digests import device_digest, local_tensor
from twice.record import hooks
from twice.record.latewrite import LateDigest, LateWriter
from twice.record.recorder import Recorder


def device_style(recorder: Recorder) -> Recorder:
    """Each tensor digested now as it would be on a CUDA device, unless the late writer takes
    it (the recorder's step data digests every tensor through its `digests`)."""
    plain = recorder.data.digests

    def digests(tensors, norms, late=False):
        digests, found = plain(tensors, norms, late)
        if any(isinstance(d, LateDigest) for d in digests):
            return digests, found
        tensors = [local_tensor(t).detach() for t in tensors]
        return [device_digest(t.dtype, tuple(t.shape), device_fold(t)) for t in tensors], found

    recorder.data.digests = digests
    return recorder


folder, kind = Path(sys.argv[1]), sys.argv[2]
kill = sys.argv[3:] == ["kill"]


def lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def train(run_dir: Path, late: bool) -> list[int]:
    torch.manual_seed(0)
    recorder = device_style(Recorder(run_dir, params_every=2))
    if late:
        recorder.data.late = LateWriter(devices=("cuda", "cpu"))
        recorder.data.late.on_kill.append(recorder.data.flush_late)
    hooks.install(recorder)
    trace, seen = run_dir / "trace.jsonl", []
    model = torch.nn.Sequential(torch.nn.Linear(6, 9), torch.nn.Tanh(), torch.nn.Linear(9, 1))
    other = torch.nn.Linear(1, 1)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    opt2 = torch.optim.SGD(other.parameters(), lr=0.1)
    try:
        for step in range(5):
            x = torch.randn(8, 6)
            loss = model(x).pow(2).mean()
            if kind == "hand":
                model.zero_grad()
                loss.backward()
                with torch.no_grad():
                    for p in model.parameters():
                        p -= 0.1 * p.grad
                model(x)  # the next forward ends the hand step
            elif kind == "explicit":
                model.zero_grad()
                loss.backward()
                recorder.record_explicit(loss=loss, batch=x, params=list(model.named_parameters()))
            else:
                opt.zero_grad()
                loss.backward()
                opt.step()
                if kind == "gan":
                    opt2.zero_grad()
                    other(model(x).detach()).mean().backward()
                    opt2.step()
            seen.append(lines(trace))
            if kill and late and step == 3:
                os.kill(os.getpid(), signal.SIGTERM)
    finally:
        hooks.uninstall()
        recorder.finish()
    seen.append(lines(trace))
    return seen


now = train(folder / "now", False)
signal.signal(signal.SIGTERM, lambda *_: (print(json.dumps({"now": now, "killed": True})),
                                           sys.stdout.flush(), os._exit(0)))  # fmt: skip
late = train(folder / "late", True)
print(json.dumps({"now": now, "late": late}))
