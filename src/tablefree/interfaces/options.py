"""Interface options: ``InterfaceConfig`` (the base of every interface's options dataclass), its registry by
interface name, and ``parse_interface_options``, the one reader of ``model.interface`` from a config.

An option of another interface is dropped (so one recipe can carry options for every interface of a sweep, and
checkpoints of the earlier flat format load); an option no interface has, or an unknown name, is an error
naming the field. Old option names are mapped by ``tablefree.compat``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from tablefree.compat import interface_option_keys
from tablefree.config_parsing import from_dict

# The registry: interface name -> its InputInterface class, whose ``Options`` is its options dataclass (filled by
# ``base.register_interface``; typed loosely here, below the module that defines the class).
INTERFACES: dict[str, Any] = {}


@dataclass
class InterfaceConfig:
    """Base of every input interface's options: the interface's registered name, then its own options.

    Each interface declares its own subclass (``CodeOptions`` for ``canonical``, ``AffineOptions`` for
    ``affine``, ...), and a saved or typed ``{name: ..., option: ...}`` mapping is read into the subclass
    registered under ``name`` (``from_config``). An interface's own seed is the option ``seed``: None means
    "the training seed", filled in by ``resolve_seed``.
    """

    name: str = "learned"

    @classmethod
    def from_config(cls, value: Any, where: str = "model.interface") -> InterfaceConfig:
        """The options of the interface named in ``value`` (a name, a mapping, or options to re-read)."""
        return parse_interface_options(value, where)

    def resolve_seed(self, seed: int) -> InterfaceConfig:
        """These options with the interface's seed, when left to the training seed (None), set to ``seed``."""
        if getattr(self, "seed", 0) is None:
            return dataclasses.replace(self, seed=seed)
        return self


class OptionError(ValueError):
    """A bad value of one interface option (raised by an options dataclass's ``__post_init__``)."""

    def __init__(self, option: str, message: str) -> None:
        super().__init__(f"{option}: {message}")
        self.option, self.message = option, message


# The largest size of a fixed input's values (``scale``, ``sigma``): past it the fp32 residual stream (its
# spacing is 2^-24 of its largest value, 6e-4 at 1e4) rounds away the blocks' first outputs (of order
# init_std = 0.02), and past about 1.8e19 the first RMSNorm's mean of squares overflows (inf: a NaN loss at
# step 1; on a d = 64 model 1e12 still left the uniform loss in 25 steps, 1e19 never did). Table-matched
# scales are about 0.03, sqrt(d) ones below 100.
MAX_INPUT_SCALE = 1e4


def input_scale_error(value: float) -> str:
    """The message for an input scale outside (0, MAX_INPUT_SCALE]: the range that works and why."""
    return (
        f"expected a positive number up to {MAX_INPUT_SCALE:g}, got {value!r}: past {MAX_INPUT_SCALE:g} the "
        "fp32 residual stream rounds away the blocks' outputs beside the input, and past about 1.8e19 the "
        "first norm's mean of squares overflows"
    )


def choice(option: str, value: Any, allowed: tuple[str, ...]) -> None:
    """Options validation: ``value`` must be one of ``allowed``."""
    if value not in allowed:
        raise OptionError(option, f"expected one of {list(allowed)}, got {value!r}")


def options_class(name: Any, where: str = "model.interface.name") -> type[InterfaceConfig]:
    if not isinstance(name, str) or name not in INTERFACES:
        raise ValueError(f"{where}: unknown interface {name!r}; expected one of {sorted(INTERFACES)}")
    return INTERFACES[name].Options


def option_names(options: type[InterfaceConfig]) -> list[str]:
    return [f.name for f in dataclasses.fields(options) if f.init and f.name != "name"]


def parse_interface_options(value: Any, where: str = "model.interface") -> InterfaceConfig:
    """The options dataclass of the interface named by ``value``: a name, a ``{name: ..., option: ...}``
    mapping, or options (returned as they are when already the interface's own; a bare
    ``InterfaceConfig(name=...)`` becomes the interface's own).

    Options of another registered interface are dropped (a sweep's shared recipe, the earlier flat format);
    an option no interface has is an error naming the field and the interface's options.
    """
    if isinstance(value, InterfaceConfig):
        if type(value) is not InterfaceConfig and type(value) is options_class(value.name):
            return value
        value = dataclasses.asdict(value)
    if isinstance(value, str):
        value = {"name": value}
    if not isinstance(value, dict):
        raise ValueError(
            f"{where}: expected an interface name or a mapping with 'name' and options, got {value!r}"
        )
    value = interface_option_keys(value, where)
    options = options_class(value.get("name", "learned"), f"{where}.name")
    own = set(option_names(options))
    for key, option_value in value.items():
        if key != "name" and key not in own:  # another interface's option: checked there, then dropped
            _check_foreign_option(key, option_value, value.get("name", "learned"), sorted(own), where)
    kept = {key: v for key, v in value.items() if key == "name" or key in own}
    return _options_from_dict(options, kept, where)


def _options_from_dict(options: type[InterfaceConfig], data: dict[str, Any], where: str) -> InterfaceConfig:
    try:
        return from_dict(options, data, where)
    except ValueError as error:
        if isinstance(error.__cause__, OptionError):  # name the option itself: model.interface.lift
            raise ValueError(f"{where}.{error.__cause__.option}: {error.__cause__.message}") from None
        raise


def _check_foreign_option(key: str, value: Any, name: str, own: list[str], where: str) -> None:
    """An option ``name`` does not take must be a valid option of some other interface (so a typo in its
    name or value is still an error), and is then ignored."""
    owner = next((cls for cls in INTERFACES.values() if key in option_names(cls.Options)), None)
    if owner is None:
        raise ValueError(
            f"{where}.{key}: no interface has the option {key!r}; {name!r} takes {own or 'no options'}"
        )
    _options_from_dict(owner.Options, {"name": owner.name, key: value}, where)
