"""Export a tablefree checkpoint to a Hugging Face ``transformers`` directory, and import one back.

Two architectures map exactly onto a standard ``transformers`` class, so the exported directory loads with
``AutoModelForCausalLM.from_pretrained(DIR)`` and no ``trust_remote_code``:

* RMSNorm + SwiGLU (the Llama body, with or without grouped-query attention) -> ``LlamaForCausalLM``.
* LayerNorm + GELU MLP with multi-head attention (the GPT-style variant) -> ``GPTNeoXForCausalLM`` with
  ``use_parallel_residual=False`` (sequential residual, as ours), ``rotary_pct=1.0`` (full rotate-half RoPE),
  exact ``gelu``, and all biases zero (ours have none). NeoX fuses q/k/v per head: rows ``[q_h; k_h; v_h]``.

Any other combination (LayerNorm + SwiGLU, RMSNorm + GELU, or GELU with grouped-query attention) has no exact
``transformers`` equivalent and is refused.

The input interface is exported through its contract (``tablefree.interfaces.base.InputInterface``): its V×d
``table()`` becomes the embedding matrix (untied from the head), its ``describe()`` goes into the model card,
its options into ``config.json`` under ``"tablefree"``, and its ``export_state()`` (e.g. affine's A and b,
projected's K×d map) into ``tablefree_interface.safetensors``. ``import_hf`` rebuilds the recorded interface
and keeps it when its ``adopt_table`` recognises the embedding matrix exactly; otherwise (or without a record)
the matrix becomes a ``learned`` table, with a warning when a record was there.

Import checks ``config.json`` against the safetensors headers (read without loading a tensor) before it
allocates anything: sizes must be whole numbers within bounds, every tensor must exist with the shape the config
implies, and a truncated or malformed file is refused naming the file.

Python API: ``export_hf(checkpoint, out_dir)``, ``import_hf(hf_dir, out_checkpoint)``.

The package, one job per module: ``layout`` (the files of an exported directory), ``architectures`` (our model
<-> the two ``transformers`` architectures, weight names and ``config.json``, both directions), ``hf_export``
(a checkpoint -> a directory, with its tokenizer files and model card), ``hf_import`` (a directory -> a
checkpoint, checked before anything is allocated).
"""

from __future__ import annotations

from tablefree.export.hf_export import export_hf
from tablefree.export.hf_import import import_hf
from tablefree.export.layout import EXPORT_FORMATS

__all__ = ["EXPORT_FORMATS", "export_hf", "import_hf"]
