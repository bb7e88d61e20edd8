"""Parameter accounting by component, computed on the meta device so the big presets allocate nothing."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

import torch

from tablefree.interfaces import parse_interface_options
from tablefree.model import TablefreeLM, build_model
from tablefree.model_config import ModelConfig


@dataclass(frozen=True)
class ParamBreakdown:
    interface: str
    input_interface: int
    attention: int
    mlp: int
    norms: int
    head: int
    total_trainable: int
    learned_total: int  # the same model with the learned table

    @property
    def removed_vs_learned(self) -> int:
        return self.learned_total - self.total_trainable

    @property
    def non_embedding(self) -> int:
        """Trainable parameters excluding the input interface (the head included), used for FLOPs."""
        return self.total_trainable - self.input_interface

    def as_dict(self) -> dict[str, int | str | float]:
        data: dict[str, int | str | float] = asdict(self)
        data["removed_vs_learned"] = self.removed_vs_learned
        data["removed_percent"] = 100.0 * self.removed_vs_learned / self.learned_total
        data["non_embedding"] = self.non_embedding
        return data


def component_of(name: str) -> str:
    if name.startswith("input."):
        return "input_interface"
    if name.startswith("head."):
        return "head"
    if "norm" in name:
        return "norms"
    if ".attn." in name:
        return "attention"
    if ".mlp." in name:
        return "mlp"
    raise ValueError(f"parameter {name!r} belongs to no known component")


def count_trainable(model: torch.nn.Module) -> dict[str, int]:
    counts = {"input_interface": 0, "attention": 0, "mlp": 0, "norms": 0, "head": 0}
    for name, parameter in model.named_parameters():
        if parameter.requires_grad:
            counts[component_of(name)] += parameter.numel()
    return counts


def _meta_model(config: ModelConfig) -> TablefreeLM:
    return build_model(config, device="meta")


def param_breakdown(config: ModelConfig) -> ParamBreakdown:
    counts = count_trainable(_meta_model(config))
    learned = replace(config, interface=parse_interface_options("learned"))
    learned_total = sum(count_trainable(_meta_model(learned)).values())
    return ParamBreakdown(
        interface=config.interface.name,
        total_trainable=sum(counts.values()),
        learned_total=learned_total,
        **counts,
    )


def format_breakdown(b: ParamBreakdown) -> str:
    rows = [
        ("input interface", b.input_interface),
        ("attention", b.attention),
        ("MLP", b.mlp),
        ("norms", b.norms),
        ("output head", b.head),
        ("total trainable", b.total_trainable),
        ("learned-table total", b.learned_total),
        ("removed vs learned", b.removed_vs_learned),
    ]
    lines = [f"interface: {b.interface}"]
    lines += [f"  {label:<22}{value:>16,}" for label, value in rows]
    lines.append(f"  {'removed (% of learned)':<22}{100.0 * b.removed_vs_learned / b.learned_total:>15.2f}%")
    return "\n".join(lines)


def format_comparison(breakdowns: list[ParamBreakdown]) -> str:
    """One line per interface: its input parameters, the model's total and the difference from learned."""
    lines = [f"  {'interface':<14}{'input interface':>18}{'total trainable':>18}{'removed vs learned':>20}"]
    lines += [
        f"  {b.interface:<14}{b.input_interface:>18,}{b.total_trainable:>18,}{b.removed_vs_learned:>20,}"
        for b in breakdowns
    ]
    return "\n".join(lines)
