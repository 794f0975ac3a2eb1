"""Portable mode's proof script: an MLP, a CNN with batch norm and a small transformer with
dropout, each trained a few steps with SGD (momentum, weight decay), Adam and AdamW, from torch's
own initialisation, seeded data and dropout; and one of each further family with Adam: an LSTM
language model, a DCGAN (transposed convolutions, binary cross-entropy), a VAE (randn_like,
KL divergence), a ResNet-style CNN (residual blocks, average and adaptive pooling, bilinear
upsampling) and an MLP under bfloat16 autocast. Prints one line per (model, optimizer): the losses'
bits and the final parameters' digest, so that runs under different thread counts, instruction
sets and BLAS settings can be compared byte for byte. Writes the digests to portable.json, and
the final parameters to portable_params.pt. PORTABLE_DEVICE (default cpu) trains on that device
from the same data (made on the CPU and moved), so a CPU run and a GPU run compare too."""

import hashlib
import json
import os
import sys

import torch
from torch import nn

STEPS = 3
DEVICE = torch.device(os.environ.get("PORTABLE_DEVICE", "cpu"))


def mlp():
    model = nn.Sequential(
        nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 10)
    )
    return model, lambda: (torch.randn(16, 32), torch.randint(0, 10, (16,)))


def cnn():
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(8, 8, 3, stride=2),
        nn.BatchNorm2d(8),
        nn.SiLU(),
        nn.Flatten(),
        nn.Linear(8 * 3 * 3, 10),
    )
    return model, lambda: (torch.randn(8, 3, 16, 16), torch.randint(0, 10, (8,)))


class Transformer(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(50, 32)
        layer = nn.TransformerEncoderLayer(
            32, 4, 64, dropout=0.1, batch_first=True, activation="gelu"
        )
        self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(32, 10)

    def forward(self, x):
        return self.head(self.enc(self.emb(x)).mean(1))


def transformer():
    return Transformer(), lambda: (torch.randint(0, 50, (8, 12)), torch.randint(0, 10, (8,)))


class LSTMLanguageModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(40, 16)
        self.rnn = nn.LSTM(16, 24, num_layers=2, batch_first=True, dropout=0.1)
        self.cell = nn.GRUCell(24, 24)
        self.head = nn.Linear(24, 40)

    def forward(self, x):
        out, _ = self.rnn(self.emb(x))
        return self.head(self.cell(out[:, -1]))


def lstm():
    return LSTMLanguageModel(), lambda: (torch.randint(0, 40, (6, 10)), torch.randint(0, 40, (6,)))


class DCGAN(nn.Module):
    def __init__(self):
        super().__init__()
        self.g = nn.Sequential(
            nn.ConvTranspose2d(8, 16, 4, 1, 0), nn.BatchNorm2d(16), nn.ReLU(),
            nn.ConvTranspose2d(16, 1, 4, 2, 1), nn.Tanh(),
        )  # fmt: skip
        self.d = nn.Sequential(
            nn.Conv2d(1, 8, 4, 2, 1), nn.LeakyReLU(0.2), nn.Flatten(), nn.Linear(8 * 4 * 4, 1),
            nn.Sigmoid(),
        )  # fmt: skip

    def forward(self, z):
        return self.d(self.g(z))


def dcgan():
    def batch():
        return torch.randn(6, 8, 1, 1), torch.rand(6, 1).round()

    return DCGAN(), batch, nn.functional.binary_cross_entropy


class VAE(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc, self.dec = nn.Linear(20, 8), nn.Linear(4, 20)

    def forward(self, x):
        mu, logvar = self.enc(x).chunk(2, -1)
        z = mu + torch.randn_like(mu) * torch.exp(0.5 * logvar)
        kl = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())
        return torch.sigmoid(self.dec(z)), kl


def vae():
    def loss(out, x):
        recon, kl = out
        return nn.functional.binary_cross_entropy(recon, x, reduction="sum") + kl

    return VAE(), lambda: (torch.rand(6, 20),) * 2, loss


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(c, c, 3, padding=1), nn.BatchNorm2d(c), nn.ReLU(), nn.Conv2d(c, c, 3, padding=1)
        )

    def forward(self, x):
        return torch.relu(x + self.body(x))


def resnet():
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), Block(8), nn.AvgPool2d(2), Block(8),
        nn.Upsample(scale_factor=2, mode="bilinear"), nn.AdaptiveAvgPool2d(3), nn.Flatten(),
        nn.Linear(72, 10),
    )  # fmt: skip
    return model, lambda: (torch.randn(4, 3, 12, 12), torch.randint(0, 10, (4,)))


class Autocast(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 10))

    def forward(self, x):
        with torch.autocast(DEVICE.type, dtype=torch.bfloat16):
            return self.net(x).float()


def bf16():
    return Autocast(), lambda: (torch.randn(8, 16), torch.randint(0, 10, (8,)))


FAMILIES = ("lstm", "dcgan", "vae", "resnet", "bf16")  # trained with Adam only

OPTIMIZERS = {
    "sgd": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, weight_decay=1e-4),
    "adam": lambda p: torch.optim.Adam(p, lr=1e-3),
    "adamw": lambda p: torch.optim.AdamW(p, lr=1e-3),
}


def main():
    models = sys.argv[1].split(",") if len(sys.argv) > 1 else ["mlp", "cnn", "transformer"]
    models += [] if len(sys.argv) > 1 else list(FAMILIES)
    results, params = {}, {}
    for name in models:
        for opt_name, make in OPTIMIZERS.items():
            if name in FAMILIES and opt_name != "adam":
                continue
            torch.manual_seed(0)
            model, data, *rest = globals()[name]()
            model = model.to(DEVICE)
            loss_fn = rest[0] if rest else nn.functional.cross_entropy
            opt = make(model.parameters())
            losses = []
            for _ in range(STEPS):
                x, y = (t.to(DEVICE) for t in data())
                loss = loss_fn(model(x), y)
                opt.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
                losses.append(loss.item().hex())
            h = hashlib.sha256()
            state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
            for value in state.values():
                h.update(value.numpy().tobytes())
            results[f"{name}/{opt_name}"] = {"losses": losses, "params": h.hexdigest()}
            params[f"{name}/{opt_name}"] = state
            print(name, opt_name, h.hexdigest()[:16], losses[-1])
    with open("portable.json", "w") as out:
        json.dump(results, out, sort_keys=True)
    torch.save(params, "portable_params.pt")


if __name__ == "__main__":
    main()
