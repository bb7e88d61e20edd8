"""``learned``: the control, an ordinary trainable V×d embedding table."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from tablefree.interfaces.base import InputInterface, check_token_ids, register_interface
from tablefree.interfaces.options import InterfaceConfig


@dataclass
class LearnedOptions(InterfaceConfig):
    name: str = "learned"


@register_interface("learned")
class LearnedEmbedding(InputInterface):
    """A trainable V×d table (V·d parameters), initialised N(0, init_std) by the model."""

    Options = LearnedOptions

    def __init__(self, options: LearnedOptions, vocab_size: int, d_model: int) -> None:
        super().__init__(options, vocab_size, d_model)
        self.weight = nn.Parameter(torch.empty(vocab_size, d_model))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        check_token_ids(ids, self.vocab_size)
        return nn.functional.embedding(ids, self.weight)

    @torch.no_grad()
    def table(self) -> torch.Tensor:
        return self.weight.detach().float().cpu()

    def describe(self) -> str:
        return "Row t is the trained embedding of token t (the `learned` control): V·d trainable parameters."

    def export_state(self) -> dict[str, torch.Tensor]:
        return {}  # the table is the whole state

    def adopt_table(self, table: torch.Tensor, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Any V×d table is a learned table (a foreign model's too)."""
        return {"weight": table.float()}
