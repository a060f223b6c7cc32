"""Model presets and the configuration one training run receives as JSON.

The controller sends the suite's ``train`` section, resolved against a preset,
as ``--params JSON``; the rank program reads it back with :func:`from_json`.
The FLOPs per token formula lives here too, so the controller's MFU and the
node's printed figures use the same arithmetic.

Standard library only, Python 3.8 compatible.
"""

import json
from typing import Any, Dict

# d_model, layers, heads, vocabulary, sequence length, micro-batch per rank
PRESETS: Dict[str, Dict[str, int]] = {
    # CPU tests: the whole protocol with two ranks in seconds
    "tiny": {"d_model": 64, "n_layers": 2, "n_heads": 4, "vocab_size": 256, "seq_len": 64,
             "micro_batch": 4},
    # GPT-2 medium shape: about 354M parameters
    "350m": {"d_model": 1024, "n_layers": 24, "n_heads": 16, "vocab_size": 50304,
             "seq_len": 1024, "micro_batch": 16},
    # about 1.01B parameters, tied embeddings (the reference figures' shape)
    "1b": {"d_model": 2048, "n_layers": 18, "n_heads": 16, "vocab_size": 50304, "seq_len": 2048,
           "micro_batch": 8},
}

# Defaults of everything the rank program reads; the suite overrides them.
DEFAULTS: Dict[str, Any] = {
    "model": "tiny",
    "steps": 12,
    "ckpt_step": 5,
    "grad_accum": 1,
    "lr": 3e-4,
    "min_lr_ratio": 0.1,
    "warmup_steps": 3,
    "weight_decay": 0.1,
    "beta1": 0.9,
    "beta2": 0.95,
    "grad_clip": 1.0,
    "dropout": 0.0,
    "seed": 1234,
    "dtype": "bf16",  # autocast dtype on GPU; CPU runs in fp32
    "compile": True,  # GPU only
    "deterministic": True,
    # timed steps on the fastest kernels after the reference's verified ones (0: none)
    "throughput_steps": 10,
    "parallel": "auto",  # ddp | fsdp | auto (fsdp when DDP's replicas would not fit)
    "collective_timeout_s": 300.0,
    "inject_nan_at_step": None,
    "manifest_delay_s": 0.0,  # pause before a later save's manifest (the kill lands there)
    # the earlier saves' files hashed for their manifests beside the training, each
    # manifest written before the next save's commit (where a before-manifest kill lands)
    "manifest_behind": False,
}


def resolve(params: Dict[str, Any]) -> Dict[str, Any]:
    """Defaults, then the preset's dimensions, then explicit overrides."""
    cfg = dict(DEFAULTS)
    cfg.update({k: v for k, v in params.items() if v is not None or k not in DEFAULTS})
    name = cfg["model"]
    if name not in PRESETS:
        raise ValueError("unknown model preset %r (known: %s)" % (name, ", ".join(sorted(PRESETS))))
    for k, v in PRESETS[name].items():
        if cfg.get(k) is None:
            cfg[k] = v
    if cfg["d_model"] % cfg["n_heads"]:
        raise ValueError("d_model %d is not a multiple of n_heads %d"
                         % (cfg["d_model"], cfg["n_heads"]))
    if not 1 <= cfg["ckpt_step"] < cfg["steps"]:
        raise ValueError("ckpt_step must lie in [1, steps)")
    return cfg


def from_json(text: str) -> Dict[str, Any]:
    return resolve(json.loads(text))


def param_count(cfg: Dict[str, Any]) -> int:
    """Parameters of the GPT in model.py, position embeddings excluded (as in the
    usual MFU accounting: they cost no matmul FLOPs).

    Per block: attention qkv + out (4 d^2), MLP (8 d^2), two RMSNorm weights;
    a final norm; token embeddings tied with the output projection.
    """
    d, n, v = cfg["d_model"], cfg["n_layers"], cfg["vocab_size"]
    return n * (12 * d * d + 2 * d) + d + v * d


def flops_per_token(cfg: Dict[str, Any]) -> float:
    """Training FLOPs per token: 6 N for the matmuls of forward and backward, plus
    12 L d T for attention scores and values (PaLM appendix B; nanoGPT's MFU)."""
    return 6.0 * param_count(cfg) + 12.0 * cfg["n_layers"] * cfg["d_model"] * cfg["seq_len"]


def tokens_per_step(cfg: Dict[str, Any]) -> int:
    """Per rank, per optimizer step."""
    return int(cfg["micro_batch"]) * int(cfg["seq_len"]) * int(cfg["grad_accum"])
