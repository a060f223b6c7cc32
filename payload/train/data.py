"""Synthetic token batches, made on the node from a seed: nothing is downloaded.

Each micro-batch is a pure function of (seed, rank, position): the data
position saved in a checkpoint is all a restored run needs to continue with
the very batches the uninterrupted run saw. The tokens are learnable, so a
healthy run's loss falls: the first half of each sequence is drawn from a
Zipf-like (log-uniform) distribution over the vocabulary, the second half
repeats the first (what induction heads learn).

torch is imported inside the methods.
"""

from typing import Any, Dict, Tuple

_MIX = 0x9E3779B97F4A7C15  # golden-ratio constant: spreads (seed, rank, position) over 63 bits


class SyntheticTokens:
    def __init__(self, seed: int, rank: int, vocab: int, seq_len: int, batch: int) -> None:
        self.seed = seed
        self.rank = rank
        self.vocab = vocab
        self.seq_len = seq_len
        self.batch = batch
        self.position = 0  # micro-batches handed out so far

    def _key(self, position: int) -> int:
        k = (self.seed * _MIX + (self.rank + 1) * 1000003 + position * 7919) % (1 << 63)
        return k

    def batch_at(self, position: int) -> Tuple[Any, Any]:
        """(inputs, targets) on the CPU, int64, shape (batch, seq_len)."""
        import torch

        g = torch.Generator().manual_seed(self._key(position))
        half = (self.seq_len + 2) // 2
        u = torch.rand(self.batch, half, generator=g, dtype=torch.float64)
        first = (torch.pow(float(self.vocab), u).floor().long() - 1).clamp_(0, self.vocab - 1)
        seq = torch.cat([first, first], dim=1)[:, : self.seq_len + 1]
        return seq[:, :-1].contiguous(), seq[:, 1:].contiguous()

    def next(self) -> Tuple[Any, Any]:
        out = self.batch_at(self.position)
        self.position += 1
        return out

    def state_dict(self) -> Dict[str, int]:
        return {"position": self.position, "seed": self.seed, "rank": self.rank}

    def load_state_dict(self, state: Dict[str, int]) -> None:
        if state.get("seed") != self.seed:
            raise ValueError("checkpoint data seed %s differs from this run's %s"
                             % (state.get("seed"), self.seed))
        self.position = int(state["position"])
