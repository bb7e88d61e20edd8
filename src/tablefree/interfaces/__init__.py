"""The input interfaces, one file each, behind one registry (``INTERFACES``) and one contract (``base``).

* ``learned``   — an ordinary trainable V×d embedding table (the control).
* ``canonical`` — the token id's own K-bit binary code, lifted to width d.
* ``affine``    — that code recoded by a fixed random invertible affine map over GF(2), c' = A·c ⊕ b.

Ablations (issue 14), each answering one question about why fixed codes work:

* ``gaussian``    — a frozen random N(0, σ²) table computed from (seed, id): structure, or only distinctness?
* ``projected``   — the canonical/affine code, then a trainable K×d map: does the missing projection cost?
* ``wide-random`` — a seeded random code of W > K bits, distinct by construction: do more bits help?
* ``hashed``      — codes of K' < K bits, so ids collide: the negative control. Does identity matter?

The table-light alternative (issue 34), between ``canonical`` (0 trainable input parameters) and ``learned`` (V·d):

* ``separable``   — the id as C mixed-radix digits, a small trainable codebook per digit, combined (sum or
  concatenation) and optionally passed through a small generator MLP.

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
    ids_checked_by_caller,
    interface_class,
    register_interface,
)
from tablefree.interfaces.canonical import CanonicalCode
from tablefree.interfaces.fixed_code import CodeOptions, FixedCode, LiftOptions, check_lift_width, lift_index
from tablefree.interfaces.gaussian import GaussianOptions, GaussianTable
from tablefree.interfaces.hashed import HashedCode, HashedOptions
from tablefree.interfaces.learned import LearnedEmbedding, LearnedOptions
from tablefree.interfaces.options import InterfaceConfig, OptionError, parse_interface_options
from tablefree.interfaces.projected import ProjectedCode, ProjectedOptions
from tablefree.interfaces.separable import SeparableCodebooks, SeparableOptions
from tablefree.interfaces.wide_random import WideRandomCode, WideRandomOptions

__all__ = [
    "INTERFACES",
    "AffineCode",
    "AffineOptions",
    "CanonicalCode",
    "CodeOptions",
    "FixedCode",
    "GaussianOptions",
    "GaussianTable",
    "HashedCode",
    "HashedOptions",
    "InputInterface",
    "InterfaceConfig",
    "LearnedEmbedding",
    "LearnedOptions",
    "LiftOptions",
    "OptionError",
    "ProjectedCode",
    "ProjectedOptions",
    "SeparableCodebooks",
    "SeparableOptions",
    "WideRandomCode",
    "WideRandomOptions",
    "build_interface",
    "check_lift_width",
    "check_token_ids",
    "ids_checked_by_caller",
    "interface_class",
    "lift_index",
    "parse_interface_options",
    "register_interface",
]
