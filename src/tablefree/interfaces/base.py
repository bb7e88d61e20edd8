"""The input-interface contract: what every part of tablefree needs from an interface, and the registry.

An interface is one file under ``tablefree/interfaces/`` holding an options dataclass (a subclass of
``interfaces.options.InterfaceConfig``) and a module class derived from ``InputInterface`` and registered by name::

    @dataclass
    class MyOptions(InterfaceConfig):
        name: str = "my-code"
        scale: float = 1.0

    @register_interface("my-code")
    class MyCode(InputInterface):
        Options = MyOptions
        def forward(self, ids): ...                 # (...,) int ids -> (..., d) inputs
        def describe(self) -> str: ...              # a paragraph for the exported model card

Everything else has a default that fits a fixed (parameter-free) interface: ``table`` evaluates ``forward`` on
every id (the V×d matrix an export writes), ``reset_fixed_state`` recomputes buffers from the options (after
``to_empty`` on a meta-built model: ``load_model``, the sharded build), ``export_state`` is what an
export must carry besides the table, and ``adopt_table`` recognises an exported table on import. The model
(``init_weights``), checkpoints, ``export``/``import-hf``, ``params`` and the CLI use only this contract.
"""

from __future__ import annotations

import contextlib
import contextvars
import itertools
from collections.abc import Callable
from typing import Any, ClassVar, TypeVar

import torch
from torch import nn

from tablefree.interfaces.options import INTERFACES, InterfaceConfig, parse_interface_options

TABLE_CHUNK = 4096  # ids per forward when materialising a table (bounds the memory of large-d tables)

Interface = TypeVar("Interface", bound=type["InputInterface"])


class InputInterface(nn.Module):
    """Base of every input interface: token ids (B, T) -> inputs (B, T, d).

    Subclasses set ``Options`` (their options dataclass) and implement ``forward`` and ``describe``; the
    registry sets ``name``. Trainable state is ``nn.Parameter`` (initialised by the model's ``init_weights``:
    N(0, init_std) per 2-D parameter, seeded by its name, unless ``init_parameter`` initialises it); fixed
    state is buffers, filled by ``reset_fixed_state`` and never touched by ``init_weights``.
    """

    name: ClassVar[str] = ""
    Options: ClassVar[type[InterfaceConfig]] = InterfaceConfig

    def __init__(self, options: InterfaceConfig, vocab_size: int, d_model: int) -> None:
        super().__init__()
        if not isinstance(options, self.Options):
            raise TypeError(
                f"{type(self).__name__} takes {self.Options.__name__}, got {type(options).__name__}"
            )
        self.options = options
        self.vocab_size = vocab_size
        self.d_model = d_model

    def forward(self, ids: torch.Tensor) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def describe(self) -> str:  # pragma: no cover - abstract
        """What row t of the exported table is, in a few sentences of markdown (the model card)."""
        raise NotImplementedError

    @property
    def is_fixed(self) -> bool:
        """True when the interface has no trainable parameter: its input is a fixed function of the id."""
        return not any(True for _ in self.parameters())

    def reset_fixed_state(self) -> None:
        """(Re)compute the fixed buffers from the options, e.g. after ``to_empty`` on a meta-built model."""

    def init_parameter(self, name: str, tensor: torch.Tensor) -> bool:
        """Initialise the full tensor of parameter ``name`` (relative to this module) in place and return True,
        or return False to leave it to the model's default. Deterministic: a sharded build calls it per full
        tensor."""
        return False

    @torch.no_grad()
    def table(self) -> torch.Tensor:
        """The V×d input matrix, row t = the input of token t, as float32 on the CPU (what export writes)."""
        tensor = next(itertools.chain(self.parameters(), self.buffers()), None)
        device = tensor.device if tensor is not None and tensor.device.type != "meta" else torch.device("cpu")
        rows = [
            self(torch.arange(start, min(start + TABLE_CHUNK, self.vocab_size), device=device)).float().cpu()
            for start in range(0, self.vocab_size, TABLE_CHUNK)
        ]
        return torch.cat(rows)

    def export_state(self) -> dict[str, torch.Tensor]:
        """Tensors an export carries besides the table so that import restores the interface exactly: by
        default its whole state (parameters and persistent buffers)."""
        return {name: t.detach().cpu().contiguous() for name, t in self.state_dict().items()}

    @torch.no_grad()
    def adopt_table(
        self, table: torch.Tensor, state: dict[str, torch.Tensor]
    ) -> dict[str, torch.Tensor] | None:
        """Recognise an exported table: load ``state`` (from ``export_state``; a state that does not load raises)
        and return this interface's state dict when its own table, rounded to the exported dtype, equals
        ``table`` exactly; else None."""
        self.load_state_dict(state, strict=True)  # a state that does not fit is an error, not "another table"
        mine = self.table()
        if mine.shape != table.shape or not torch.equal(mine.to(table.dtype), table):
            return None
        return {name: t.detach().cpu() for name, t in self.state_dict().items()}


# ----------------------------------------------------------------------------------------------------------
# Registry


def register_interface(name: str) -> Callable[[Interface], Interface]:
    """Class decorator: register an ``InputInterface`` under ``name`` (its options' ``name`` default)."""

    def decorate(cls: Interface) -> Interface:
        if name in INTERFACES and INTERFACES[name] is not cls:
            raise ValueError(f"input interface {name!r} is already registered ({INTERFACES[name].__name__})")
        cls.name = name
        INTERFACES[name] = cls
        return cls

    return decorate


def interface_class(name: Any, where: str = "model.interface.name") -> type[InputInterface]:
    if not isinstance(name, str) or name not in INTERFACES:
        raise ValueError(f"{where}: unknown interface {name!r}; expected one of {sorted(INTERFACES)}")
    return INTERFACES[name]


def build_interface(
    options: InterfaceConfig | dict[str, Any] | str, vocab_size: int, d_model: int
) -> InputInterface:
    """Build the input interface named by ``options.name`` (options may also be a name or a mapping)."""
    options = parse_interface_options(options)
    return INTERFACES[options.name](options, vocab_size, d_model)


_IDS_CHECKED_BY_CALLER = contextvars.ContextVar("tablefree_ids_checked_by_caller", default=False)


@contextlib.contextmanager
def ids_checked_by_caller():
    """Inside, ``check_token_ids`` does nothing: the caller has checked the ids already, on the CPU (the
    trainer, batch by batch; reading a GPU tensor's min and max would make the host wait for the device)."""
    token = _IDS_CHECKED_BY_CALLER.set(True)
    try:
        yield
    finally:
        _IDS_CHECKED_BY_CALLER.reset(token)


def check_token_ids(ids: torch.Tensor, vocab_size: int) -> None:
    """Raise a clear error for ids outside [0, V). Skipped while compiling (a data-dependent branch) and inside
    ``ids_checked_by_caller``."""
    if _is_compiling() or ids.numel() == 0 or _IDS_CHECKED_BY_CALLER.get():
        return
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or high >= vocab_size:
        bad = low if low < 0 else high
        raise ValueError(f"token id {bad} is outside [0, {vocab_size}) (vocabulary size V={vocab_size})")


def _is_compiling() -> bool:
    compiler = getattr(torch, "compiler", None)
    return bool(compiler is not None and hasattr(compiler, "is_compiling") and compiler.is_compiling())
