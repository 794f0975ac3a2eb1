"""What portable mode costs: a training step under `--portable` against the plain step, and each
kernel's throughput against torch's, measured side by side in one process.

Steps: for an MLP, a CNN with batch norm, a small transformer (dropout on), RepDL's LeNet, an
LSTM language model (and the same with GRU layers), a DCGAN, a VAE, a ResNet-style CNN, a
bfloat16-autocast MLP, a 3-D CNN and a small ViT, with Adam, the same loop runs in alternating
blocks with and without the portable dispatch mode (ROUNDS pairs of STEPS steps; each block's
first step untimed), at 1 and at 2 threads. The median of the per-pair ratios of wall time is
reported with the pairs' quartiles. Target: at most 3x. And a float64 family: pytorch/examples'
time_sequence_prediction (two LSTMCells over the sequence, LBFGS), its step timed the same way
with and without the mode.

Kernels: matrix products (float32, and float64's ordered one) and convolution in GFLOP/s,
elementwise exp and a sum in GB/s (bytes of the input read), portable against torch, the best of
several calls each.

Convolution routes: for ResNet, LeNet and DCGAN shapes, each route conv.py takes against the one
it stands in for, alternately in one process: the input gradient in cache against torch's
float64 kernel, and that against the chunked product and fold; the forward and weight gradient
multiplied in cache against columns written to memory.

`python bench/bench_portable.py` runs everything; words given pick the cases whose names hold
them all (`bench_portable.py cnn`, `bench_portable.py kernels`).
"""

import statistics
import sys
import time

import torch
from _common import TINY, size
from torch import nn

from twice.portable import native
from twice.portable.arithmetic import elementwise as ew
from twice.portable.arithmetic.exact import beta_for, exact_matmul, exact_sum, integer_matmul
from twice.portable.dispatch.mode import PortableMode
from twice.portable.native import conv as native_conv
from twice.portable.ops import conv as pconv

STEPS = size("STEPS", 6, 2)  # the first of a block is not timed
ROUNDS = size("ROUNDS", 12, 2)


def mlp():
    model = nn.Sequential(
        nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10)
    )
    return model, lambda: (torch.randn(64, 784), torch.randint(0, 10, (64,)))


def cnn():
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.BatchNorm2d(32),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(32 * 8 * 8, 10),
    )
    return model, lambda: (torch.randn(32, 3, 32, 32), torch.randint(0, 10, (32,)))


class Transformer(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(1000, 128)
        layer = nn.TransformerEncoderLayer(128, 4, 256, dropout=0.1, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(128, 10)

    def forward(self, x):
        return self.head(self.enc(self.emb(x)).mean(1))


def transformer():
    return Transformer(), lambda: (torch.randint(0, 1000, (16, 64)), torch.randint(0, 10, (16,)))


def lenet():
    """RepDL's MNIST example model: small 5x5 convolutions with 1 and 6 input channels."""
    model = nn.Sequential(
        nn.Conv2d(1, 6, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(6, 16, 5), nn.ReLU(),
        nn.MaxPool2d(2), nn.Flatten(), nn.Linear(256, 120), nn.ReLU(), nn.Linear(120, 84),
        nn.ReLU(), nn.Linear(84, 10),
    )  # fmt: skip
    return model, lambda: (torch.randn(64, 1, 28, 28), torch.randint(0, 10, (64,)))


class LSTMLanguageModel(nn.Module):
    def __init__(self, layer=nn.LSTM):
        super().__init__()
        self.emb = nn.Embedding(1000, 128)
        self.rnn = layer(128, 256, num_layers=2, batch_first=True, dropout=0.1)
        self.head = nn.Linear(256, 1000)

    def forward(self, x):
        return self.head(self.rnn(self.emb(x))[0]).flatten(0, 1)


def lstm():
    def data():
        tokens = torch.randint(0, 1000, (16, 33))
        return tokens[:, :-1], tokens[:, 1:].flatten()

    return LSTMLanguageModel(), data


def gru():
    """The LSTM language model with GRU layers."""
    return LSTMLanguageModel(nn.GRU), lstm()[1]


class DCGAN(nn.Module):
    """A DCGAN generator (transposed convolutions, batch norm) and discriminator, trained as one
    module on the discriminator's binary cross-entropy."""

    def __init__(self):
        super().__init__()
        self.g = nn.Sequential(
            nn.ConvTranspose2d(64, 128, 4, 1, 0), nn.BatchNorm2d(128), nn.ReLU(),
            nn.ConvTranspose2d(128, 64, 4, 2, 1), nn.BatchNorm2d(64), nn.ReLU(),
            nn.ConvTranspose2d(64, 1, 4, 2, 1), nn.Tanh(),
        )  # fmt: skip
        self.d = nn.Sequential(
            nn.Conv2d(1, 64, 4, 2, 1), nn.LeakyReLU(0.2), nn.Conv2d(64, 128, 4, 2, 1),
            nn.BatchNorm2d(128), nn.LeakyReLU(0.2), nn.Flatten(), nn.Linear(128 * 4 * 4, 1),
        )  # fmt: skip

    def forward(self, z):
        return self.d(self.g(z)).squeeze(1)


def dcgan():
    return DCGAN(), lambda: (torch.randn(32, 64, 1, 1), torch.rand(32).round())


class VAE(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = nn.Sequential(nn.Linear(784, 400), nn.ReLU(), nn.Linear(400, 40))
        self.dec = nn.Sequential(nn.Linear(20, 400), nn.ReLU(), nn.Linear(400, 784))

    def forward(self, x):
        mu, logvar = self.enc(x).chunk(2, -1)
        z = mu + torch.randn_like(mu) * torch.exp(0.5 * logvar)
        kl = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())
        return torch.sigmoid(self.dec(z)), kl


def vae():
    x = lambda: torch.rand(64, 784)  # noqa: E731
    return VAE(), lambda: (x(),) * 2


class Residual(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(c, c, 3, padding=1), nn.BatchNorm2d(c), nn.ReLU(),
            nn.Conv2d(c, c, 3, padding=1), nn.BatchNorm2d(c),
        )  # fmt: skip

    def forward(self, x):
        return torch.relu(x + self.body(x))


def resnet():
    model = nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), Residual(32),
        nn.AvgPool2d(2), Residual(32), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10),
    )  # fmt: skip
    return model, lambda: (torch.randn(32, 3, 32, 32), torch.randint(0, 10, (32,)))


class Autocast(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = mlp()[0]

    def forward(self, x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return self.net(x).float()


def bf16():
    return Autocast(), mlp()[1]


def cnn3d():
    """A 3-D CNN over short clips (video, volumes): 3-d convolutions, batch norm, pooling."""
    model = nn.Sequential(
        nn.Conv3d(3, 8, 3, padding=1),
        nn.BatchNorm3d(8),
        nn.ReLU(),
        nn.MaxPool3d(2),
        nn.Conv3d(8, 16, 3, padding=1),
        nn.BatchNorm3d(16),
        nn.ReLU(),
        nn.AdaptiveAvgPool3d(1),
        nn.Flatten(),
        nn.Linear(16, 10),
    )
    return model, lambda: (torch.randn(4, 3, 8, 16, 16), torch.randint(0, 10, (4,)))


def vit():
    """A small ViT as timm builds one: patch embedding, class token, pre-norm attention blocks
    with GELU MLPs (nn.TransformerEncoderLayer's norm_first form), layer norm, a linear head."""

    class ViT(nn.Module):
        def __init__(self, dim=64):
            super().__init__()
            self.patch = nn.Conv2d(3, dim, 4, stride=4)
            self.cls = nn.Parameter(torch.zeros(1, 1, dim))
            self.pos = nn.Parameter(torch.randn(1, 65, dim) * 0.02)
            layer = nn.TransformerEncoderLayer(
                dim, 4, dim * 4, 0.1, activation="gelu", batch_first=True, norm_first=True
            )
            self.blocks = nn.TransformerEncoder(layer, 4, enable_nested_tensor=False)
            self.norm, self.head = nn.LayerNorm(dim), nn.Linear(dim, 10)

        def forward(self, x):
            x = self.patch(x).flatten(2).transpose(1, 2)
            x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], 1) + self.pos
            return self.head(self.norm(self.blocks(x))[:, 0])

    return ViT(), lambda: (torch.randn(16, 3, 32, 32), torch.randint(0, 10, (16,)))


class Sequence(nn.Module):
    """pytorch/examples' time_sequence_prediction: two LSTMCells and a linear layer, run over
    each time step of sine waves, in float64."""

    def __init__(self):
        super().__init__()
        self.lstm1, self.lstm2 = nn.LSTMCell(1, 51), nn.LSTMCell(51, 51)
        self.linear = nn.Linear(51, 1)

    def forward(self, x):
        state1 = [torch.zeros(x.size(0), 51, dtype=torch.double) for _ in range(2)]
        state2 = [torch.zeros(x.size(0), 51, dtype=torch.double) for _ in range(2)]
        outputs = []
        for step in x.split(1, dim=1):
            state1 = self.lstm1(step, state1)
            state2 = self.lstm2(state1[0], state2)
            outputs.append(self.linear(state2[0]))
        return torch.cat(outputs, dim=1)


def float64_case(threads):
    """The example's LBFGS step (a closure of up to 20 evaluations) on its 97 sequences, cut to
    SEQ_LENGTH steps, in alternate blocks with and without portable mode."""
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    length = size("SEQ_LENGTH", 200, 8)
    waves = torch.sin(
        (torch.arange(length + 1, dtype=torch.double) + torch.randint(-80, 80, (97, 1)).double())
        / 20.0
    )
    x, y = waves[:, :-1], waves[:, 1:]
    model = Sequence().double()
    opt = torch.optim.LBFGS(model.parameters(), lr=0.8, max_iter=size("LBFGS_ITER", 4, 1))

    def timed(portable):
        mode = PortableMode("warn") if portable else None
        if mode is not None:
            mode.__enter__()
        try:

            def closure():
                opt.zero_grad()
                loss = nn.functional.mse_loss(model(x), y)
                loss.backward()
                return loss

            start = time.perf_counter()
            opt.step(closure)
            return time.perf_counter() - start
        finally:
            if mode is not None:
                mode.__exit__(None, None, None)

    ratios, plain_s = [], []
    for _ in range(size("SEQ_ROUNDS", 3, 1)):
        plain = timed(False)
        ratios.append(timed(True) / plain)
        plain_s.append(plain)
    ratios.sort()
    low, med, high = ratios[0], statistics.median(ratios), ratios[-1]
    print(
        f"{'float64 LSTMCells + LBFGS, ' + str(threads) + ' thread(s)':28s} plain "
        f"{statistics.median(plain_s) * 1e3:7.1f} ms/step   portable {med:5.2f}x  "
        f"(range {low:.2f}x, {high:.2f}x)"
    )


def _loss(name):
    if name == "dcgan":
        return nn.functional.binary_cross_entropy_with_logits
    if name == "vae":

        def vae_loss(out, x):
            recon, kl = out
            return nn.functional.binary_cross_entropy(recon, x, reduction="sum") + kl

        return vae_loss
    return nn.functional.cross_entropy


def block(model, opt, data, portable: bool, loss_fn=nn.functional.cross_entropy) -> float:
    mode = PortableMode("warn") if portable else None
    if mode is not None:
        mode.__enter__()
    try:
        times = []
        for step in range(STEPS):
            x, y = data()
            start = time.perf_counter()
            opt.zero_grad()
            loss_fn(model(x), y).backward()
            opt.step()
            if step:
                times.append(time.perf_counter() - start)
        return statistics.median(times)
    finally:
        if mode is not None:
            mode.__exit__(None, None, None)


def step_case(name, build, threads):
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model, data = build()
    loss_fn = _loss(build.__name__)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    ratios, plain_ms = [], []
    for _ in range(ROUNDS):
        plain = block(model, opt, data, False, loss_fn)
        portable = block(model, opt, data, True, loss_fn)
        ratios.append(portable / plain)
        plain_ms.append(plain * 1e3)
    q1, med, q3 = statistics.quantiles(ratios, n=4)
    print(
        f"{name:28s} plain {statistics.median(plain_ms):7.2f} ms/step   portable "
        f"{med:5.2f}x  (quartiles {q1:.2f}x, {q3:.2f}x)"
    )


def best(fn, repeat=7) -> float:
    fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def kernels():
    torch.set_num_threads(1)
    native.keep_memory()  # as portable mode has it
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(256, 784, generator=g), torch.randn(784, 256, generator=g)
    flops = 2 * 256 * 784 * 256
    t_torch, t_port = best(lambda: a @ b), best(lambda: exact_matmul(a, b))
    print(
        f"matmul 256x784x256 float32     torch {flops / t_torch / 1e9:7.2f} GFLOP/s   portable "
        f"{flops / t_port / 1e9:7.2f} GFLOP/s  ({t_port / t_torch:.1f}x the time)"
    )
    for m, k, n in [(97, 51, 204), (97, 204, 51), (512, 512, 512), (2048, 2048, 1)]:
        a, b = torch.randn(m, k, generator=g).double(), torch.randn(k, n, generator=g).double()
        flops = 2 * m * k * n
        t_torch = best(lambda a=a, b=b: a @ b)
        t_port = best(lambda a=a, b=b: exact_matmul(a, b))
        print(
            f"{f'matmul {m}x{k}x{n} float64':30s} torch {flops / t_torch / 1e9:7.2f} GFLOP/s   "
            f"portable {flops / t_port / 1e9:7.2f} GFLOP/s  ({t_port / t_torch:.1f}x the time)"
        )
    for m, k, n in [(64, 784, 256), (16, 256, 1024), (512, 1000, 512)]:  # MLP, LSTM, LSTM head
        top = 2 ** beta_for(k, 2)  # integer slices at exact.py's bound
        a = torch.randint(-top, top, (m, k), generator=g).double()
        b = torch.randint(-top, top, (k, n), generator=g).double()
        flops, (t_torch, t_port) = 2 * m * k * n, _paired_times(a, b)
        print(
            f"{f'integer slices {m}x{k}x{n}':30s} torch {flops / t_torch / 1e9:7.2f} GFLOP/s   "
            f"portable {flops / t_port / 1e9:7.2f} GFLOP/s  ({t_port / t_torch:.2f}x the time)"
        )
    x, w = torch.randn(32, 16, 32, 32, generator=g), torch.randn(32, 16, 3, 3, generator=g)
    flops = 2 * 32 * 32 * 32 * 32 * 16 * 9
    t_torch = best(lambda: torch.nn.functional.conv2d(x, w, padding=1))
    t_port = best(lambda: pconv.convolution(x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1))
    print(
        f"conv2d 32x16x32x32, 32 3x3     torch {flops / t_torch / 1e9:7.2f} GFLOP/s   portable "
        f"{flops / t_port / 1e9:7.2f} GFLOP/s  ({t_port / t_torch:.1f}x the time)"
    )
    v = torch.randn(1 << 20, generator=g)
    size = v.numel() * 4
    for label, plain, ours in [
        ("exp", lambda: torch.exp(v), lambda: ew.exp(v.double()).float()),
        ("sum", lambda: v.sum(), lambda: exact_sum(v)),
    ]:
        t_torch, t_port = best(plain), best(ours)
        print(
            f"{label} of 2**20 float32{' ' * (12 - len(label))}torch {size / t_torch / 1e9:7.2f} "
            f"GB/s      portable {size / t_port / 1e9:7.2f} GB/s      "
            f"({t_port / t_torch:.1f}x the time)"
        )


def optimizer():
    """Adam's step alone on the MLP's parameters, plain against portable, single-tensor and
    fused (`fused=True`): both take one compiled pass a parameter under the mode."""
    for threads in (1,) if TINY else (1, 2):
        torch.set_num_threads(threads)
        for fused in (False, True):
            torch.manual_seed(0)
            model, data = mlp()
            x, _ = data()
            model(x).sum().backward()
            opt = torch.optim.Adam(model.parameters(), lr=1e-3, fused=fused)
            ratios, plain_ms = [], []
            for _ in range(ROUNDS):
                plain = best(opt.step, STEPS)
                with PortableMode("warn"):
                    portable = best(opt.step, STEPS)
                ratios.append(portable / plain)
                plain_ms.append(plain * 1e3)
            q1, med, q3 = statistics.quantiles(ratios, n=4)
            name = f"Adam{' fused' if fused else ''}, {threads} thread{'s' * (threads > 1)}"
            print(
                f"{name:28s} plain {statistics.median(plain_ms):7.3f} ms/step   portable "
                f"{med:5.2f}x  (quartiles {q1:.2f}x, {q3:.2f}x)"
            )


def _paired_times(a, b, rounds=7):
    """Median times of torch.matmul and p_integer_mm on the same integers, taken in turn."""
    pairs = [(best(lambda: a @ b, 3), best(lambda: integer_matmul(a, b), 3)) for _ in range(rounds)]
    return statistics.median(p[0] for p in pairs), statistics.median(p[1] for p in pairs)


def _paired(first, second, rounds):
    """Median and quartiles of first's time over second's, the two timed alternately (the best
    of 3 calls each, per round)."""
    ratios = [best(first, 3) / best(second, 3) for _ in range(rounds)]
    q1, med, q3 = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
    return med, q1, q3


def _route_ratios(x, w, stride, padding):
    """(input gradient: in cache over torch's kernel, torch's kernel over the fold; forward
    and weight gradient: in cache over columns in memory), each as (median, q1, q3)."""
    settings = ([stride] * 2, [padding] * 2, [1, 1], False, [0, 0], 1)
    go = torch.randn(pconv.convolution(x, w, None, *settings).shape)
    real = native_conv.forward, native_conv.weight_grad, native_conv.input_grad
    torch_route, off = pconv._torch_input_grad, (lambda *a: None)

    def grad_input(cached, by_torch):
        native_conv.input_grad = real[2] if cached else off
        pconv._torch_input_grad = torch_route if by_torch else off
        pconv.convolution_backward(go, x, w, None, *settings, [True, False, False])

    def forward_and_weight(cached):
        native_conv.forward, native_conv.weight_grad = real[:2] if cached else (off, off)
        pconv.convolution(x, w, None, *settings)
        pconv.convolution_backward(go, x, w, None, *settings, [False, True, False])

    try:
        cache = _paired(lambda: grad_input(True, True), lambda: grad_input(False, True), ROUNDS)
        by_torch = _paired(
            lambda: grad_input(False, True), lambda: grad_input(False, False), ROUNDS
        )
        cached = _paired(
            lambda: forward_and_weight(True), lambda: forward_and_weight(False), ROUNDS
        )
    finally:
        native_conv.forward, native_conv.weight_grad, native_conv.input_grad = real
        pconv._torch_input_grad = torch_route
    return cache, by_torch, cached


def conv_routes():
    """Each convolution route against the one it stands in for, side by side: the input gradient
    in cache (native_conv.input_grad) against torch's float64 kernel, and that against the
    chunked product and fold (each taken at stride 1 only), and the forward and weight gradient
    multiplied in cache (p_conv_forward, p_conv_weight_grad) against columns of integers written
    to memory and torch's float64 product."""
    native.keep_memory()
    assert hasattr(pconv, "_torch_input_grad") and hasattr(native_conv, "weight_grad")
    shapes = [  # (label, input, weight, stride, padding)
        ("ResNet 32x32x32, 3x3", (32, 32, 32, 32), (32, 32, 3, 3), 1, 1),
        ("ResNet 32x16x16, 3x3", (32, 32, 16, 16), (32, 32, 3, 3), 1, 1),
        ("LeNet 6x14x14, 5x5", (64, 6, 14, 14), (16, 6, 5, 5), 1, 0),
        ("DCGAN 64x8x8, 4x4 stride 2", (32, 64, 8, 8), (128, 64, 4, 4), 2, 1),
        ("64 channels 64x16x16, 3x3", (32, 64, 16, 16), (64, 64, 3, 3), 1, 1),
    ]
    if TINY:
        shapes = [("tiny", (2, 3, 8, 8), (4, 3, 3, 3), 1, 1)]
    print(
        "columns: input gradient in cache / torch's kernel; torch's kernel / fold; forward and "
        "weight gradient in cache / columns in memory"
    )
    for threads in (1,) if TINY else (1, 2):
        torch.set_num_threads(threads)
        for label, xs, ws, stride, padding in shapes:
            ratios = _route_ratios(torch.randn(xs), torch.randn(ws), stride, padding)
            cells = "   ".join(f"{m:.2f}x ({q1:.2f}x, {q3:.2f}x)" for m, q1, q3 in ratios)
            print(f"{label:28s} {threads} thread{'s' if threads > 1 else ' '}  {cells}")


CASES = {
    f"step {name} {threads} thread{'s' if threads > 1 else ''}": (
        lambda build=build, name=name, threads=threads: step_case(
            f"{name}, {threads} thread{'s' if threads > 1 else ''}", build, threads
        )
    )
    for threads in ((1,) if TINY else (1, 2))
    for name, build in (
        ("mlp", mlp),
        ("cnn", cnn),
        ("transformer", transformer),
        ("lenet", lenet),
        ("lstm", lstm),
        ("gru", gru),
        ("dcgan", dcgan),
        ("vae", vae),
        ("resnet", resnet),
        ("bf16", bf16),
        ("cnn3d", cnn3d),
        ("vit", vit),
    )
}
for _threads in (1,) if TINY else (1, 2):
    CASES[f"step float64 {_threads} thread{'s' if _threads > 1 else ''}"] = (
        lambda threads=_threads: float64_case(threads)
    )
CASES["kernels"] = kernels
CASES["optimizer"] = optimizer
CASES["conv routes"] = conv_routes


if __name__ == "__main__":
    words = sys.argv[1:]
    for case, run in CASES.items():
        if all(w in case for w in words):
            run()
