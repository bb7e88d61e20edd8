"""A fixed input interface defined outside the package, as a user's own file would define one: a seeded V×d
float codebook held in a buffer (std ``scale``). Tests register it for their duration only."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from tablefree.interfaces import INTERFACES, InputInterface, check_token_ids, register_interface
from tablefree.interfaces.options import InterfaceConfig


@dataclass
class ScratchOptions(InterfaceConfig):
    name: str = "scratch"
    scale: float = 1.0


class ScratchCodebook(InputInterface):
    Options = ScratchOptions

    def __init__(self, options: ScratchOptions, vocab_size: int, d_model: int) -> None:
        super().__init__(options, vocab_size, d_model)
        self.register_buffer("codebook", torch.empty(vocab_size, d_model))
        self.reset_fixed_state()

    def reset_fixed_state(self) -> None:
        if self.codebook.device.type != "meta":
            generator = torch.Generator().manual_seed(123)
            noise = torch.randn(self.codebook.shape, generator=generator) * self.options.scale
            self.codebook.copy_(noise)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        check_token_ids(ids, self.vocab_size)
        return self.codebook[ids]

    def describe(self) -> str:
        return f"Row t is row t of a seeded N(0, {self.options.scale}²) codebook."


@contextlib.contextmanager
def scratch_interface() -> Iterator[type[ScratchCodebook]]:
    register_interface("scratch")(ScratchCodebook)
    try:
        yield ScratchCodebook
    finally:
        INTERFACES.pop("scratch", None)
