"""A small vision transformer as timm builds one, trained a few steps: timm's trunc_normal_
initialisation (uniform, erfinv, scale, clamp), patch embedding by a strided convolution, a
class token and position embedding, pre-norm blocks of multi-head attention (qkv in one linear,
softmax over scaled scores) and a GELU MLP with dropout and stochastic depth, AdamW with weight
decay and a cosine schedule, label smoothing. Writes the final parameters' digest and the
losses' bits to vit.json, and the parameters to vit_params.pt. (timm itself needs torchvision,
which this environment cannot import beside its CPU torch build: this script is its equivalent.)
"""

import hashlib
import json
import math

import torch
from torch import nn

torch.manual_seed(0)


def trunc_normal_(tensor, mean=0.0, std=1.0, a=-2.0, b=2.0):
    """timm's truncated normal: uniform between the CDF's values at the bounds, then the
    inverse CDF through erfinv."""
    with torch.no_grad():
        low = (1.0 + math.erf((a - mean) / std / math.sqrt(2.0))) / 2.0
        high = (1.0 + math.erf((b - mean) / std / math.sqrt(2.0))) / 2.0
        tensor.uniform_(2 * low - 1, 2 * high - 1)
        tensor.erfinv_()
        tensor.mul_(std * math.sqrt(2.0))
        tensor.add_(mean)
        tensor.clamp_(min=a, max=b)
        return tensor


class Attention(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads, self.scale = heads, (dim // heads) ** -0.5
        self.qkv, self.proj = nn.Linear(dim, dim * 3), nn.Linear(dim, dim)

    def forward(self, x):
        b, n, c = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        attention = ((q * self.scale) @ k.transpose(-2, -1)).softmax(-1)
        return self.proj((attention @ v).transpose(1, 2).reshape(b, n, c))


class Block(nn.Module):
    def __init__(self, dim, heads, drop_path):
        super().__init__()
        self.norm1, self.attn = nn.LayerNorm(dim, eps=1e-6), Attention(dim, heads)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = nn.Sequential(
            nn.Linear(dim, dim * 4), nn.GELU(), nn.Dropout(0.1), nn.Linear(dim * 4, dim)
        )
        self.drop_path = drop_path

    def _path(self, x):
        if not self.training or self.drop_path == 0:
            return x
        keep = x.new_empty((x.shape[0], 1, 1)).bernoulli_(1 - self.drop_path)
        return x * keep / (1 - self.drop_path)

    def forward(self, x):
        x = x + self._path(self.attn(self.norm1(x)))
        return x + self._path(self.mlp(self.norm2(x)))


class ViT(nn.Module):
    def __init__(self, size=16, patch=4, dim=32, depth=2, heads=4, classes=10):
        super().__init__()
        self.patch = nn.Conv2d(3, dim, patch, stride=patch)
        tokens = (size // patch) ** 2
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos = nn.Parameter(torch.zeros(1, tokens + 1, dim))
        self.blocks = nn.Sequential(*[Block(dim, heads, 0.1 * i) for i in range(depth)])
        self.norm, self.head = nn.LayerNorm(dim, eps=1e-6), nn.Linear(dim, classes)
        trunc_normal_(self.pos, std=0.02)
        trunc_normal_(self.cls, std=0.02)
        self.apply(self._init)

    @staticmethod
    def _init(module):
        if isinstance(module, nn.Linear):
            trunc_normal_(module.weight, std=0.02)
            nn.init.zeros_(module.bias)

    def forward(self, images):
        x = self.patch(images).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], 1) + self.pos
        return self.head(self.norm(self.blocks(x))[:, 0])


def main():
    model = ViT()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, 4)
    loss_fn = nn.CrossEntropyLoss(label_smoothing=0.1)
    losses = []
    for _ in range(4):
        images, labels = torch.randn(8, 3, 16, 16), torch.randint(0, 10, (8,))
        loss = loss_fn(model(images), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
        losses.append(loss.item().hex())
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    digest = hashlib.sha256(b"".join(v.numpy().tobytes() for v in state.values())).hexdigest()
    torch.save(state, "vit_params.pt")
    with open("vit.json", "w") as out:
        json.dump({"losses": losses, "params": digest}, out)
    print(losses, digest)


main()
