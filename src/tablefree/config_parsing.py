"""Dataclass configs from YAML and ``a.b.c=value`` overrides, naming the offending field on any mistake.

Every config is a plain dataclass. ``from_dict`` builds one from nested dicts (as read from YAML);
``apply_overrides`` applies dotted ``KEY=VALUE`` strings from the command line; ``from_dict_with_overrides``
says whether a mistake came from the file or from the command line.
"""

from __future__ import annotations

import copy
import dataclasses
import re
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml

T = TypeVar("T")


def from_dict(cls: type[T], data: dict[str, Any] | None, where: str = "config") -> T:
    """Build dataclass ``cls`` from a nested dict, rejecting unknown fields and ill-typed values by name."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ValueError(_at(where, f"expected a mapping for {cls.__name__}, got {type(data).__name__}"))
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ValueError(
            _at(where, f"unknown field(s) {unknown} for {cls.__name__}; expected some of {sorted(names)}")
        )
    kwargs = {key: _coerce(hints[key], value, _join(where, key)) for key, value in data.items()}
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as error:
        raise ValueError(_at(where, str(error))) from error


def _join(where: str, key: str) -> str:
    """The dotted path of ``key`` inside ``where`` ("" is the top level)."""
    return f"{where}.{key}" if where else key


def _at(where: str, message: str) -> str:
    return f"{where}: {message}" if where else message


def to_dict(obj: Any) -> dict[str, Any]:
    """A dataclass as a plain nested dict (JSON/YAML friendly)."""
    return dataclasses.asdict(obj)


def _coerce(hint: Any, value: Any, where: str) -> Any:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(hint)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _coerce(option, value, where)
            except ValueError as error:
                errors.append(str(error))
        raise ValueError(errors[0] if errors else _at(where, f"bad value {value!r}"))
    if dataclasses.is_dataclass(hint):
        if hasattr(hint, "from_config"):  # a polymorphic section (the input interface) reads itself
            return hint.from_config(value, where)
        return value if isinstance(value, hint) else from_dict(hint, value, where)
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ValueError(_at(where, f"expected a list, got {value!r}"))
        (item,) = typing.get_args(hint)[:1] or (Any,)
        return [_coerce(item, v, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict or hint is Any:
        return value
    if hint is bool:
        if isinstance(value, bool):
            return value
        raise ValueError(_at(where, f"expected true/false, got {value!r}"))
    if hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            return parse_count(value, where)
        raise ValueError(_at(where, f"expected an integer, got {value!r}"))
    if hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
        raise ValueError(_at(where, f"expected a number, got {value!r}"))
    if hint is str:
        if isinstance(value, str):
            return value
        raise ValueError(_at(where, f"expected a string, got {value!r}"))
    return value


_SUFFIXES = {"": 1, "k": 10**3, "m": 10**6, "b": 10**9, "g": 10**9, "t": 10**12}


def parse_count(text: str | int, where: str = "value") -> int:
    """Parse ``100B``, ``2.5M``, ``1_000``, ``64k`` into an int (decimal suffixes k, M, B/G, T)."""
    if isinstance(text, int):
        return text
    match = re.fullmatch(r"\s*([0-9][0-9_]*(?:\.[0-9]+)?(?:e[0-9]+)?)\s*([kKmMbBgGtT]?)\s*", str(text))
    if not match:
        raise ValueError(f"{where}: expected an integer such as 1000, 64k, 2.5M or 100B, got {text!r}")
    number = float(match.group(1).replace("_", "")) * _SUFFIXES[match.group(2).lower()]
    if not number.is_integer():
        raise ValueError(f"{where}: {text!r} is not a whole number")
    return int(number)


def parse_bytes(text: str, where: str = "value") -> int:
    """``80GiB``, ``141GB``, ``512MiB`` or a plain byte count: binary (KiB, MiB, GiB, TiB) and decimal (kB, MB, GB,
    TB) suffixes."""
    units = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}
    units |= {"kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*", str(text))
    unit = match.group(2).lower() if match else None
    if match is None or unit not in units or float(match.group(1)) <= 0:
        raise ValueError(
            f"{where}: expected a size such as 80GiB, 141GB or 85899345920 (bytes), got {text!r}"
        )
    return int(float(match.group(1)) * units[unit])


def parse_token_budgets(values: list[str | int], where: str = "predict_at") -> list[int]:
    """Positive token counts (``17B``, ``100B``) from a list, each parsed by ``parse_count``; a boolean, 0 or a
    negative count is refused, naming its index."""
    budgets = []
    for index, value in enumerate(values):
        at = f"{where}[{index}]"
        if isinstance(value, bool) or parse_count(value, at) <= 0:
            raise ValueError(f"{at}: expected a positive token count such as 17B, got {value!r}")
        budgets.append(parse_count(value, at))
    return budgets


class _StrictLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a mapping naming a key twice: PyYAML keeps the last value and drops the
    first without a word, so a recipe edited in two places would silently train the one the user did not read."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        first_line: dict[Any, int] = {}
        for key_node, _ in node.value:
            # `<<: *base` may be overridden by the mapping's own keys: not a duplicate
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                seen = key in first_line
            except TypeError:  # an unhashable key: SafeLoader's own error says so
                continue
            if seen:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping",
                    node.start_mark,
                    f"found duplicate key {key!r} (first given on line {first_line[key] + 1})",
                    key_node.start_mark,
                )
            first_line[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


def load_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML mapping; errors name the file (and the line, for a key given twice)."""
    path = Path(path)
    try:
        with path.open(encoding="utf-8") as stream:  # a stream, so YAML's marks name the file
            data = yaml.load(stream, Loader=_StrictLoader)
    except FileNotFoundError:
        raise FileNotFoundError(f"config file not found: {path}") from None
    except yaml.YAMLError as error:
        raise ValueError(f"{path}: invalid YAML: {error}") from error
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    return data


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``a.b.c=value`` overrides (value parsed as YAML) to a nested dict, in order, returning a new dict.

    A section can be named by its ``name`` alone, in the file (``interface: affine``) or in an override: a bare
    name given to a section sets its ``name`` and keeps its other fields (``model.interface=affine``), and an
    override inside a section given by name keeps that name (``model.interface.seed=3``), in any order.
    """
    result = copy.deepcopy(data)
    for item in overrides:
        if "=" not in item:
            raise ValueError(f"override {item!r}: expected KEY=VALUE with a dotted key, e.g. optim.lr=3e-4")
        key, raw = item.split("=", 1)
        parts = [part.strip() for part in key.split(".")]
        if not all(parts):
            raise ValueError(f"override {item!r}: {key!r} is not a dotted key such as optim.lr")
        node = result
        for depth, part in enumerate(parts[:-1]):
            child = node.setdefault(part, {})
            if isinstance(child, str):  # a section given by name: keep the name, add the field
                child = node[part] = {"name": child}
            if not isinstance(child, dict):
                section = ".".join(parts[: depth + 1])
                raise ValueError(f"override {item!r}: {section} is {child!r}, not a section with fields")
            node = child
        value = _parse_scalar(raw)
        current = node.get(parts[-1])
        if isinstance(current, dict) and isinstance(value, str):
            current["name"] = value  # `model.interface=affine`: the section's name, its options kept
        else:
            node[parts[-1]] = value
    return result


def from_dict_with_overrides(
    cls: type[T],
    data: dict[str, Any],
    overrides: list[str],
    where: str,
    options: dict[str, Any] | None = None,
) -> T:
    """``from_dict(cls, data + overrides + options)``; an error says where the bad value came from.

    ``data`` is what was read from ``where`` (a file), ``overrides`` the command line's ``KEY=VALUE`` strings and
    ``options`` top-level values set by the command line's own options (``--seeds``), applied last. A mistake
    in the file is reported against the file; one that an override brings in names that override as typed.
    """
    merged = apply_overrides(data, overrides)
    merged.update(options or {})
    try:
        return from_dict(cls, merged, where=where)
    except ValueError as error:
        culprit = _first_bad_override(cls, data, overrides)
        if culprit is None:
            raise
        item, message = culprit
        raise ValueError(f"command-line override {item!r} (applied over {where}): {message}") from error


def _first_bad_override(cls: type, data: dict[str, Any], overrides: list[str]) -> tuple[str, str] | None:
    """The first override after which ``data`` stops being a valid ``cls``, and the error it causes; None when
    ``data`` itself is invalid (the file is to blame) or no override alone breaks it."""
    try:
        from_dict(cls, data, where="")
    except ValueError:
        return None
    for n, item in enumerate(overrides, start=1):
        try:
            from_dict(cls, apply_overrides(data, overrides[:n]), where="")
        except ValueError as error:
            return item, str(error)
    return None


def _parse_scalar(raw: str) -> Any:
    """YAML value, with numbers like ``3e-4`` (a string to YAML 1.1) read as floats."""
    value = yaml.load(raw, Loader=_StrictLoader) if raw.strip() else ""
    if isinstance(value, str):
        try:
            return float(value) if re.fullmatch(r"[-+]?[0-9.]+[eE][-+]?[0-9]+", value.strip()) else value
        except ValueError:
            return value
    return value
