"""A decoder-only transformer, GPT style: token and position embeddings,
pre-norm blocks (RMSNorm, causal scaled_dot_product_attention, GELU MLP), a
final norm and an output projection tied to the token embeddings.

torch is imported inside :func:`gpt_class` (the payload package must import
without it); the class is built once per process. Its parameter count is
``config.param_count`` plus the position embeddings; a unit test holds the two
together.
"""

import functools
import math
from typing import Any, Dict


@functools.lru_cache(maxsize=1)
def gpt_class() -> Any:
    import torch
    import torch.nn.functional as F
    from torch import nn

    class RMSNorm(nn.Module):
        def __init__(self, d: int, eps: float = 1e-6) -> None:
            super().__init__()
            self.eps = eps
            self.weight = nn.Parameter(torch.ones(d))

        def forward(self, x: Any) -> Any:
            xf = x.float()
            xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
            return xf.type_as(x) * self.weight

    class Block(nn.Module):
        def __init__(self, d: int, heads: int, dropout: float) -> None:
            super().__init__()
            self.heads = heads
            self.dropout = dropout
            self.norm1 = RMSNorm(d)
            self.qkv = nn.Linear(d, 3 * d, bias=False)
            self.proj = nn.Linear(d, d, bias=False)
            self.norm2 = RMSNorm(d)
            self.fc = nn.Linear(d, 4 * d, bias=False)
            self.out = nn.Linear(4 * d, d, bias=False)
            self.drop = nn.Dropout(dropout)

        def forward(self, x: Any) -> Any:
            b, t, d = x.shape
            q, k, v = self.qkv(self.norm1(x)).split(d, dim=2)
            shape = (b, t, self.heads, d // self.heads)
            q, k, v = (z.view(shape).transpose(1, 2) for z in (q, k, v))
            y = F.scaled_dot_product_attention(
                q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0)
            y = y.transpose(1, 2).contiguous().view(b, t, d)
            x = x + self.drop(self.proj(y))
            return x + self.drop(self.out(F.gelu(self.fc(self.norm2(x)), approximate="tanh")))

    class GPT(nn.Module):
        def __init__(self, cfg: Dict[str, Any]) -> None:
            super().__init__()
            d, n = cfg["d_model"], cfg["n_layers"]
            self.tok = nn.Embedding(cfg["vocab_size"], d)
            self.pos = nn.Embedding(cfg["seq_len"], d)
            self.drop = nn.Dropout(cfg["dropout"])
            self.blocks = nn.ModuleList(
                [Block(d, cfg["n_heads"], cfg["dropout"]) for _ in range(n)])
            self.norm = RMSNorm(d)
            self.head = nn.Linear(d, cfg["vocab_size"], bias=False)
            self.head.weight = self.tok.weight  # tied
            self.apply(self._init)
            for name, p in self.named_parameters():
                if name.endswith("proj.weight") or name.endswith("out.weight"):
                    nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * n))

        @staticmethod
        def _init(m: Any) -> None:
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, mean=0.0, std=0.02)

        def embed(self, idx: Any) -> Any:
            pos = torch.arange(idx.shape[1], device=idx.device)
            return self.drop(self.tok(idx) + self.pos(pos))

        def head_loss(self, x: Any, targets: Any) -> Any:
            logits = self.head(self.norm(x))
            return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1))

        def forward(self, idx: Any, targets: Any) -> Any:
            x = self.embed(idx)
            for block in self.blocks:
                x = block(x)
            return self.head_loss(x, targets)

    return GPT


def build(cfg: Dict[str, Any], device: Any) -> Any:
    """The model on `device`, initialised from the torch RNG (seeded by the caller)."""
    import torch

    with torch.device(device):
        return gpt_class()(cfg)
