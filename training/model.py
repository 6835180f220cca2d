"""A GPT-style decoder (after nanoGPT), small enough to read in one sitting; with
`causal=False` the same stack is a BERT-style encoder trained to fill in masked tokens.

Every model the trainer runs follows one interface: `forward(inputs, targets)` returns
the scalar loss (targets of -100 are ignored, as in PyTorch's cross_entropy).
`flops_per_token(seq_len)` is optional; the trainer falls back to 6N.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint

from training.spec.presets import ENCODER_PRESETS, PRESETS


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int
    seq_len: int
    n_layer: int
    n_head: int
    n_embd: int
    dropout: float = 0.0
    activation_checkpointing: bool = False
    causal: bool = True  # False: every token attends to every other (BERT-style encoder)


class SelfAttention(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.n_head = config.n_head
        self.causal = config.causal
        self.qkv = nn.Linear(config.n_embd, 3 * config.n_embd)
        self.proj = nn.Linear(config.n_embd, config.n_embd)
        self.dropout = config.dropout
        self.resid_dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = self.qkv(x).split(width, dim=2)
        q, k, v = (
            t.view(batch, length, self.n_head, width // self.n_head).transpose(1, 2)
            for t in (q, k, v)
        )
        y = F.scaled_dot_product_attention(
            q, k, v, is_causal=self.causal, dropout_p=self.dropout if self.training else 0.0
        )
        y = y.transpose(1, 2).contiguous().view(batch, length, width)
        return self.resid_dropout(self.proj(y))


class MLP(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.fc = nn.Linear(config.n_embd, 4 * config.n_embd)
        self.proj = nn.Linear(4 * config.n_embd, config.n_embd)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.proj(F.gelu(self.fc(x))))


class Block(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd)
        self.attn = SelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """Token and position embeddings, n_layer pre-LayerNorm blocks, a tied output layer."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.seq_len, config.n_embd)
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # weight tying, as in GPT-2
        # Module by module, in Module.apply's order: the same random draws whether or not
        # the parameters were created partitioned (ZeRO-3), and at most one module's
        # parameters gathered at a time.
        for module in _post_order(self):
            with _gathered(list(module.parameters(recurse=False))):
                self._init_weights(module)
        # GPT-2: scale the residual projections by 1/sqrt(2 * n_layer).
        for name, param in self.named_parameters():
            if name.endswith("proj.weight"):
                with _gathered([param]):
                    nn.init.normal_(param, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(inputs.shape[1], device=inputs.device)
        x = self.drop(self.wte(inputs) + self.wpe(positions))
        for block in self.blocks:
            if self.config.activation_checkpointing and self.training:
                # Recompute the block's activations in backward instead of storing them.
                x = checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))

    def num_params(self, *, non_embedding: bool = True) -> int:
        """Parameter count; the position table is left out by default (nanoGPT's convention).

        The token table stays in: it is tied to lm_head, whose matmul costs real FLOPs.
        """
        # A ZeRO-3 partitioned parameter keeps its full size in ds_numel.
        total = sum(getattr(p, "ds_numel", p.numel()) for p in self.parameters())
        position_table = getattr(self.wpe.weight, "ds_numel", self.wpe.weight.numel())
        return total - position_table if non_embedding else total

    def flops_per_token(self, seq_len: int) -> int:
        """Training FLOPs per token: 6N + 12·L·H·Q·T (PaLM appendix B, nanoGPT's estimate_mfu)."""
        c = self.config
        return 6 * self.num_params() + 12 * c.n_layer * c.n_head * (c.n_embd // c.n_head) * seq_len


def _post_order(module: nn.Module):
    """Every module, children before their parent (the order of Module.apply)."""
    for child in module.children():
        yield from _post_order(child)
    yield module


def _gathered(params: list[nn.Parameter]):
    """Full ZeRO-3 partitioned parameters for the block, written back from rank 0 after."""
    if not any(hasattr(p, "ds_id") for p in params):
        return contextlib.nullcontext()
    import deepspeed

    return deepspeed.zero.GatheredParameters(params, modifier_rank=0)


def build_gpt(
    preset: str,
    *,
    vocab_size: int,
    seq_len: int,
    dropout: float = 0.0,
    activation_checkpointing: bool = False,
    **shape: int | None,
) -> GPT:
    """A model from a preset name, with any of n_layer/n_head/n_embd overridden.

    Encoder presets get one more token than `vocab_size`: the mask token
    (`mask_token_id(vocab_size)`), which never occurs in the data.
    """
    dims = PRESETS[preset] | {key: value for key, value in shape.items() if value is not None}
    encoder = preset in ENCODER_PRESETS
    return GPT(
        GPTConfig(
            vocab_size=vocab_size + 1 if encoder else vocab_size,
            seq_len=seq_len,
            dropout=dropout,
            activation_checkpointing=activation_checkpointing,
            causal=not encoder,
            **dims,
        )
    )


def mask_token_id(data_vocab_size: int) -> int:
    """The id an encoder reads in place of a masked token: one past the data's vocabulary."""
    return data_vocab_size
