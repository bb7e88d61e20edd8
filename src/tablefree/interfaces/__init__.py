"""The input interfaces, one file each, behind one registry (``INTERFACES``) and one contract (``base``).

* ``learned``   — an ordinary trainable V×d embedding table (the control).
* ``canonical`` — the token id's own K-bit binary code, lifted to width d.
* ``affine``    — that code recoded by a fixed random invertible affine map over GF(2), c' = A·c ⊕ b.

The fixed codes have **no trainable parameters and no V-sized buffer**: codes are computed from ids on the fly
(``tablefree.codes``). Adding an interface is one file here (its options dataclass and an ``InputInterface``
registered by name) plus an import below; see ``base`` and docs/models.md.
"""

from __future__ import annotations

from tablefree.interfaces.affine import AffineCode, AffineOptions
from tablefree.interfaces.base import (
    INTERFACES,
    InputInterface,
    build_interface,
    check_token_ids,
    interface_class,
    parse_interface_options,
    register_interface,
)
from tablefree.interfaces.canonical import CanonicalCode
from tablefree.interfaces.fixed_code import CodeOptions, FixedCode, LiftOptions, check_lift_width, lift_index
from tablefree.interfaces.learned import LearnedEmbedding, LearnedOptions

__all__ = [
    "INTERFACES",
    "AffineCode",
    "AffineOptions",
    "CanonicalCode",
    "CodeOptions",
    "FixedCode",
    "InputInterface",
    "LearnedEmbedding",
    "LearnedOptions",
    "LiftOptions",
    "build_interface",
    "check_lift_width",
    "check_token_ids",
    "interface_class",
    "lift_index",
    "parse_interface_options",
    "register_interface",
]
