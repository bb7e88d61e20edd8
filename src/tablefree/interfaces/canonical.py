"""``canonical``: the token id's own K-bit binary code, K = ceil(log2 V), lifted to width d. No parameters, and
no V-sized state: the bits are shifted out of the id itself (see ``fixed_code``)."""

from __future__ import annotations

from tablefree.interfaces.base import register_interface
from tablefree.interfaces.fixed_code import CodeOptions, FixedCode


@register_interface("canonical")
class CanonicalCode(FixedCode):
    """The token id's own binary code."""

    Options = CodeOptions
