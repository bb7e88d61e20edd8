"""The model's configuration: ``ModelConfig`` and the presets.

The input interface's options are ``tablefree.interfaces.options``; reading configs from YAML and the command
line is ``tablefree.config_parsing``; the training recipe is ``tablefree.train.recipe``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from tablefree.config_parsing import from_dict
from tablefree.interfaces.options import InterfaceConfig


@dataclass
class ModelConfig:
    vocab_size: int = 4096
    d_model: int = 128
    n_layers: int = 4
    n_heads: int = 4
    n_kv_heads: int | None = None  # None: same as n_heads (no grouped-query attention)
    d_ff: int = 384
    max_seq_len: int = 256
    rope_theta: float = 10_000.0
    mlp: str = "swiglu"  # swiglu | gelu
    norm: str = "rmsnorm"  # rmsnorm | layernorm
    norm_eps: float = 1e-5
    init_std: float = 0.02
    interface: InterfaceConfig = field(default_factory=InterfaceConfig)

    def __post_init__(self) -> None:
        if type(self.interface) is InterfaceConfig or not isinstance(self.interface, InterfaceConfig):
            self.interface = InterfaceConfig.from_config(self.interface, "interface")  # a name, a dict
        if self.n_kv_heads is None:
            self.n_kv_heads = self.n_heads
        checks = [
            (
                self.d_model % self.n_heads == 0,
                f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})",
            ),
            (
                self.n_heads % self.n_kv_heads == 0,
                f"n_heads ({self.n_heads}) must be divisible by n_kv_heads ({self.n_kv_heads})",
            ),
            ((self.d_model // self.n_heads) % 2 == 0, "head dimension must be even for RoPE"),
            (self.mlp in ("swiglu", "gelu"), f"mlp must be 'swiglu' or 'gelu', got {self.mlp!r}"),
            (
                self.norm in ("rmsnorm", "layernorm"),
                f"norm must be 'rmsnorm' or 'layernorm', got {self.norm!r}",
            ),
            (self.vocab_size >= 2, f"vocab_size must be >= 2, got {self.vocab_size}"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(f"model config: {message}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    def resolve_seed(self, seed: int) -> ModelConfig:
        """This config with the interface's seeds that follow the training seed set to ``seed`` (what a run
        records, so that reloading and export rebuild exactly the same interface)."""
        interface = self.interface.resolve_seed(seed)
        return self if interface is self.interface else dataclasses.replace(self, interface=interface)


PRESETS: dict[str, dict[str, Any]] = {
    # SmolLM2-1.7B-shaped Llama body of the 100B-token study (untied head).
    "paper-1.7b": dict(
        vocab_size=49_152,
        d_model=2048,
        n_layers=24,
        n_heads=32,
        n_kv_heads=32,
        d_ff=8192,
        max_seq_len=2048,
        rope_theta=130_000.0,
        mlp="swiglu",
        norm="rmsnorm",
    ),
    # The earlier study: GPT-style, GELU 4x MLP, LayerNorm; RoPE positions (see docs/models.md).
    "paper-32l-1024": dict(
        vocab_size=65_536,
        d_model=1024,
        n_layers=32,
        n_heads=32,
        d_ff=4096,
        max_seq_len=1024,
        rope_theta=10_000.0,
        mlp="gelu",
        norm="layernorm",
    ),
    # CPU presets. vocab_size is a default; training takes V from the dataset's tokenizer.
    "tiny": dict(vocab_size=4096, d_model=128, n_layers=4, n_heads=4, d_ff=384, max_seq_len=256),
    "small": dict(vocab_size=8192, d_model=384, n_layers=6, n_heads=6, d_ff=1024, max_seq_len=512),
}


def preset(name: str, **overrides: Any) -> ModelConfig:
    """A ModelConfig from a named preset, with keyword overrides (``interface``: a name, a dict or options)."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; expected one of {sorted(PRESETS)}")
    data: dict[str, Any] = dict(PRESETS[name])
    interface = overrides.pop("interface", None)
    data.update(overrides)
    if isinstance(interface, str):
        interface = {"name": interface}
    if interface is not None:
        data["interface"] = interface
    return from_dict(ModelConfig, data, where=f"preset {name}")
