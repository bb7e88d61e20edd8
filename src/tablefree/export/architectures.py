"""Our model <-> the two ``transformers`` architectures it maps onto exactly, in both directions.

* RMSNorm + SwiGLU (the Llama body, with or without grouped-query attention) <-> ``LlamaForCausalLM``.
* LayerNorm + GELU MLP with multi-head attention <-> ``GPTNeoXForCausalLM`` with ``use_parallel_residual=False``,
  ``rotary_pct=1.0``, exact ``gelu`` and all biases zero. NeoX fuses q/k/v per head: rows ``[q_h; k_h; v_h]``.

Export: ``hf_architecture`` picks the class (or refuses a variant with no exact equivalent), ``*_state_dict`` and
``*_config`` write the weights and ``config.json``. Import: ``CONVERSIONS[model_type]`` reads ``config.json``
(every size a whole number within ``SIZE_LIMITS``, every unsupported feature refused by name) into our config,
the tensor shapes it implies and the mapping back to our weight names.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from tablefree.model import TablefreeLM
from tablefree.model_config import ModelConfig
from tablefree.safetensors_header import is_count

# ----------------------------------------------------------------------------------------------------------
# Export: our weights and config as transformers'


def hf_architecture(config: ModelConfig) -> str:
    """``"llama"`` or ``"gpt_neox"``: the ``transformers`` model type that computes exactly what ours does.

    Raises ``ValueError`` naming the mismatch for a variant with no exact equivalent.
    """
    if config.norm == "rmsnorm" and config.mlp == "swiglu":
        return "llama"
    if config.norm == "layernorm" and config.mlp == "gelu":
        if config.n_kv_heads != config.n_heads:
            raise ValueError(
                f"cannot export: the LayerNorm/GELU variant maps onto GPTNeoXForCausalLM, which has no "
                f"grouped-query attention (n_kv_heads={config.n_kv_heads} != n_heads={config.n_heads})"
            )
        return "gpt_neox"
    raise ValueError(
        f"cannot export: norm={config.norm!r} with mlp={config.mlp!r} has no exact transformers equivalent "
        f"(exportable: rmsnorm+swiglu -> LlamaForCausalLM, layernorm+gelu -> GPTNeoXForCausalLM)"
    )


def input_table(model: TablefreeLM) -> torch.Tensor:
    """The V×d input table, fp32 on the CPU: the interface's own materialisation (``InputInterface.table``)."""
    return model.input.table()


def llama_state_dict(model: TablefreeLM) -> dict[str, torch.Tensor]:
    """tablefree weight names -> ``LlamaForCausalLM`` names (identical layouts, RoPE included)."""
    state = {"model.embed_tokens.weight": input_table(model)}
    for i, block in enumerate(model.layers):
        hf = f"model.layers.{i}"
        state[f"{hf}.self_attn.q_proj.weight"] = block.attn.wq.weight
        state[f"{hf}.self_attn.k_proj.weight"] = block.attn.wk.weight
        state[f"{hf}.self_attn.v_proj.weight"] = block.attn.wv.weight
        state[f"{hf}.self_attn.o_proj.weight"] = block.attn.wo.weight
        state[f"{hf}.mlp.gate_proj.weight"] = block.mlp.w1.weight
        state[f"{hf}.mlp.up_proj.weight"] = block.mlp.w3.weight
        state[f"{hf}.mlp.down_proj.weight"] = block.mlp.w2.weight
        state[f"{hf}.input_layernorm.weight"] = block.attn_norm.weight
        state[f"{hf}.post_attention_layernorm.weight"] = block.mlp_norm.weight
    state["model.norm.weight"] = model.norm.weight
    state["lm_head.weight"] = model.head.weight
    return state


def neox_state_dict(model: TablefreeLM) -> dict[str, torch.Tensor]:
    """tablefree weight names -> ``GPTNeoXForCausalLM`` names (hub layout: ``embed_out`` is the head).

    NeoX splits its fused projection as ``view(B, T, H, 3*hd).chunk(3)``, so the rows are grouped per head:
    ``[q_0; k_0; v_0; q_1; k_1; v_1; ...]``. Biases NeoX always has (MLP, LayerNorm) are written as zeros.
    """
    config = model.config
    d, hd, h = config.d_model, config.head_dim, config.n_heads
    state = {"gpt_neox.embed_in.weight": input_table(model)}
    for i, block in enumerate(model.layers):
        hf = f"gpt_neox.layers.{i}"
        q, k, v = (w.weight.view(h, hd, d) for w in (block.attn.wq, block.attn.wk, block.attn.wv))
        state[f"{hf}.attention.query_key_value.weight"] = torch.cat((q, k, v), dim=1).reshape(3 * d, d)
        state[f"{hf}.attention.dense.weight"] = block.attn.wo.weight
        state[f"{hf}.mlp.dense_h_to_4h.weight"] = block.mlp.w1.weight
        state[f"{hf}.mlp.dense_h_to_4h.bias"] = torch.zeros(config.d_ff)
        state[f"{hf}.mlp.dense_4h_to_h.weight"] = block.mlp.w2.weight
        state[f"{hf}.mlp.dense_4h_to_h.bias"] = torch.zeros(d)
        for ours, theirs in (
            (block.attn_norm, "input_layernorm"),
            (block.mlp_norm, "post_attention_layernorm"),
        ):
            state[f"{hf}.{theirs}.weight"] = ours.weight
            state[f"{hf}.{theirs}.bias"] = torch.zeros(d)
    state["gpt_neox.final_layer_norm.weight"] = model.norm.weight
    state["gpt_neox.final_layer_norm.bias"] = torch.zeros(d)
    state["embed_out.weight"] = model.head.weight
    return state


def llama_config(config: ModelConfig, dtype: str, special: dict[str, int | None]) -> dict[str, Any]:
    """``config.json`` of ``LlamaForCausalLM``. RoPE is written both as ``rope_parameters`` (transformers 5)
    and as ``rope_theta`` / ``rope_scaling`` (transformers 4)."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": config.vocab_size,
        "hidden_size": config.d_model,
        "intermediate_size": config.d_ff,
        "num_hidden_layers": config.n_layers,
        "num_attention_heads": config.n_heads,
        "num_key_value_heads": config.n_kv_heads,
        "head_dim": config.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": config.max_seq_len,
        "initializer_range": config.init_std,
        "rms_norm_eps": config.norm_eps,
        "rope_theta": config.rope_theta,
        "rope_scaling": None,
        "rope_parameters": {"rope_type": "default", "rope_theta": config.rope_theta},
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "pretraining_tp": 1,
        "tie_word_embeddings": False,
        "use_cache": True,
        "dtype": dtype,
        "torch_dtype": dtype,
        **special,
    }


def neox_config(config: ModelConfig, dtype: str, special: dict[str, int | None]) -> dict[str, Any]:
    """``config.json`` of ``GPTNeoXForCausalLM`` equivalent to our LayerNorm/GELU variant."""
    return {
        "architectures": ["GPTNeoXForCausalLM"],
        "model_type": "gpt_neox",
        "vocab_size": config.vocab_size,
        "hidden_size": config.d_model,
        "intermediate_size": config.d_ff,
        "num_hidden_layers": config.n_layers,
        "num_attention_heads": config.n_heads,
        "hidden_act": "gelu",  # exact (erf) GELU, as torch.nn.functional.gelu
        "max_position_embeddings": config.max_seq_len,
        "initializer_range": config.init_std,
        "layer_norm_eps": config.norm_eps,
        "use_parallel_residual": False,
        "rotary_pct": 1.0,
        "rotary_emb_base": config.rope_theta,
        "rope_scaling": None,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": config.rope_theta,
            "partial_rotary_factor": 1.0,
        },
        "attention_bias": False,
        "attention_dropout": 0.0,
        "hidden_dropout": 0.0,
        "classifier_dropout": 0.0,
        "tie_word_embeddings": False,
        "use_cache": True,
        "dtype": dtype,
        "torch_dtype": dtype,
        **special,
    }


# ----------------------------------------------------------------------------------------------------------
# Import: config.json fields, checked


# Bounds on the sizes an imported config may state: far above anything tablefree trains, far below what
# would make a table allocation absurd. A size outside them is refused before any tensor is read.
SIZE_LIMITS = {
    "vocab_size": 1 << 24,
    "hidden_size": 1 << 16,
    "intermediate_size": 1 << 18,
    "num_hidden_layers": 1024,
    "num_attention_heads": 1024,
    "num_key_value_heads": 1024,
    "head_dim": 4096,
    "max_position_embeddings": 1 << 18,
}


def _size(hf_config: dict[str, Any], key: str, where: Path, default: int | None = None) -> int:
    """A size field of ``config.json``: a whole number in [1, SIZE_LIMITS[key]]."""
    value = hf_config.get(key, default)
    if value is None:
        raise ValueError(f"{where}: missing the field {key!r}")
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    limit = SIZE_LIMITS[key]
    if not is_count(value) or value > limit:
        raise ValueError(f"{where}: {key} = {value!r}: expected a whole number from 1 to {limit:,}")
    return value


def _number(hf_config: dict[str, Any], key: str, where: Path, default: float) -> float:
    value = hf_config.get(key, default)
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ValueError(f"{where}: {key} = {value!r}: expected a positive number")
    return float(value)


def _require(condition: bool, where: Path, message: str) -> None:
    if not condition:
        raise ValueError(f"{where}: {message}; no exact tablefree equivalent")


def _rope_theta(hf_config: dict[str, Any], where: Path, default: float) -> float:
    rope = hf_config.get("rope_parameters") or {}
    scaling = hf_config.get("rope_scaling")
    if not isinstance(rope, dict) or not isinstance(scaling or {}, dict):
        raise ValueError(f"{where}: rope_parameters / rope_scaling: expected a mapping or null")
    kind = (rope or scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
    _require(kind == "default", where, f"RoPE type {kind!r} (only default RoPE is supported)")
    merged = {"rope_theta": hf_config.get("rope_theta", hf_config.get("rotary_emb_base", default)), **rope}
    return _number(merged, "rope_theta", where, default)


def _model_config(where: Path, **fields: Any) -> ModelConfig:
    try:
        return ModelConfig(**fields)
    except ValueError as error:
        raise ValueError(f"{where}: {error}") from None


# ----------------------------------------------------------------------------------------------------------
# Import: the two architectures


@dataclass
class Conversion:
    """An imported architecture: our config, the HF tensors it needs (with shapes), and the mapping."""

    config: ModelConfig
    expected: dict[str, tuple[int, ...]]
    optional: set[str]
    sizes: str  # the config.json fields the shapes come from, for error messages
    convert: Any  # (state, where) -> our state dict, with "input.weight" for the embedding matrix


def _body_sizes(hf_config: dict[str, Any], where: Path) -> tuple[int, int, int, int, int]:
    """(vocab, width, heads, layers, feed-forward width) from an HF config.json."""
    return tuple(  # type: ignore[return-value]
        _size(hf_config, key, where)
        for key in (
            "vocab_size",
            "hidden_size",
            "num_attention_heads",
            "num_hidden_layers",
            "intermediate_size",
        )
    )


def _imported_config(
    hf_config: dict[str, Any],
    where: Path,
    sizes: tuple[int, int, int, int, int],
    *,
    eps_field: tuple[str, float],
    **architecture: Any,
) -> ModelConfig:
    """Our config of an imported model: its ``_body_sizes``, context, RoPE base, norm epsilon (config.json's
    field ``eps_field[0]``, default ``eps_field[1]``) and init scale, a learned input table, and
    ``architecture``."""
    v, d, heads, layers, ff = sizes
    return _model_config(
        where,
        vocab_size=v,
        d_model=d,
        n_layers=layers,
        n_heads=heads,
        d_ff=ff,
        max_seq_len=_size(hf_config, "max_position_embeddings", where, 2048),
        rope_theta=_rope_theta(hf_config, where, 10_000.0),
        norm_eps=_number(hf_config, eps_field[0], where, eps_field[1]),
        init_std=_number(hf_config, "initializer_range", where, 0.02),
        interface="learned",
        **architecture,
    )


def _llama(hf_config: dict[str, Any], where: Path) -> Conversion:
    _require(not hf_config.get("attention_bias", False), where, "attention_bias=true")
    _require(not hf_config.get("mlp_bias", False), where, "mlp_bias=true")
    _require(
        hf_config.get("hidden_act", "silu") == "silu", where, f"hidden_act={hf_config.get('hidden_act')!r}"
    )
    _require(hf_config.get("pretraining_tp", 1) in (1, None), where, "pretraining_tp != 1")
    sizes = v, d, heads, layers, ff = _body_sizes(hf_config, where)
    kv = _size(hf_config, "num_key_value_heads", where, heads)
    head_dim = _size(hf_config, "head_dim", where, d // heads) if hf_config.get("head_dim") else d // heads
    _require(head_dim * heads == d, where, f"head_dim {head_dim} × {heads} heads != hidden_size {d}")
    config = _imported_config(
        hf_config, where, sizes, n_kv_heads=kv, mlp="swiglu", norm="rmsnorm", eps_field=("rms_norm_eps", 1e-6)
    )
    names = {
        "self_attn.q_proj": ("attn.wq", (heads * head_dim, d)),
        "self_attn.k_proj": ("attn.wk", (kv * head_dim, d)),
        "self_attn.v_proj": ("attn.wv", (kv * head_dim, d)),
        "self_attn.o_proj": ("attn.wo", (d, heads * head_dim)),
        "mlp.gate_proj": ("mlp.w1", (ff, d)),
        "mlp.up_proj": ("mlp.w3", (ff, d)),
        "mlp.down_proj": ("mlp.w2", (d, ff)),
        "input_layernorm": ("attn_norm", (d,)),
        "post_attention_layernorm": ("mlp_norm", (d,)),
    }
    expected = {"model.embed_tokens.weight": (v, d), "model.norm.weight": (d,), "lm_head.weight": (v, d)}
    for i in range(layers):
        expected |= {f"model.layers.{i}.{theirs}.weight": shape for theirs, (_, shape) in names.items()}
    tied = bool(hf_config.get("tie_word_embeddings", False))

    def convert(state: dict[str, torch.Tensor], where: Path) -> dict[str, torch.Tensor]:
        ours = {
            "input.weight": state.pop("model.embed_tokens.weight"),
            "norm.weight": state.pop("model.norm.weight"),
        }
        for i in range(layers):
            for theirs, (mine, _) in names.items():
                ours[f"layers.{i}.{mine}.weight"] = state.pop(f"model.layers.{i}.{theirs}.weight")
        head = state.pop("lm_head.weight", None)
        _require(head is not None or tied, where, "no lm_head.weight and untied embeddings")
        ours["head.weight"] = head if head is not None else ours["input.weight"].clone()
        _require_consumed(state, where)
        return ours

    sizes = "vocab_size, hidden_size, intermediate_size, num_attention_heads, num_key_value_heads, head_dim"
    return Conversion(config, expected, {"lm_head.weight"} if tied else set(), sizes, convert)


def _neox(hf_config: dict[str, Any], where: Path) -> Conversion:
    _require(hf_config.get("use_parallel_residual") is False, where, "use_parallel_residual is not false")
    rope = hf_config.get("rope_parameters") or {}
    partial = (rope if isinstance(rope, dict) else {}).get(
        "partial_rotary_factor", hf_config.get("rotary_pct", 0.25)
    )
    _require(partial == 1.0, where, f"partial rotary factor {partial} (ours rotates the whole head)")
    _require(
        hf_config.get("hidden_act", "gelu") == "gelu", where, f"hidden_act={hf_config.get('hidden_act')!r}"
    )
    sizes = v, d, heads, layers, ff = _body_sizes(hf_config, where)
    _require(d % heads == 0, where, f"hidden_size {d} is not a multiple of num_attention_heads {heads}")
    hd = d // heads
    config = _imported_config(
        hf_config, where, sizes, mlp="gelu", norm="layernorm", eps_field=("layer_norm_eps", 1e-5)
    )
    expected = {"gpt_neox.embed_in.weight": (v, d), "embed_out.weight": (v, d), "lm_head.weight": (v, d)}
    expected |= {"gpt_neox.final_layer_norm.weight": (d,), "gpt_neox.final_layer_norm.bias": (d,)}
    for i in range(layers):
        hf = f"gpt_neox.layers.{i}"
        expected |= {
            f"{hf}.attention.query_key_value.weight": (3 * d, d),
            f"{hf}.attention.query_key_value.bias": (3 * d,),
            f"{hf}.attention.dense.weight": (d, d),
            f"{hf}.attention.dense.bias": (d,),
            f"{hf}.mlp.dense_h_to_4h.weight": (ff, d),
            f"{hf}.mlp.dense_h_to_4h.bias": (ff,),
            f"{hf}.mlp.dense_4h_to_h.weight": (d, ff),
            f"{hf}.mlp.dense_4h_to_h.bias": (d,),
            **{
                f"{hf}.{norm}.{p}": (d,)
                for norm in ("input_layernorm", "post_attention_layernorm")
                for p in ("weight", "bias")
            },
        }
    optional = {name for name in expected if name.endswith(".bias")} | {"embed_out.weight", "lm_head.weight"}

    def convert(state: dict[str, torch.Tensor], where: Path) -> dict[str, torch.Tensor]:
        ours = {"input.weight": state.pop("gpt_neox.embed_in.weight")}
        for i in range(layers):
            hf = f"gpt_neox.layers.{i}"
            qkv = state.pop(f"{hf}.attention.query_key_value.weight").view(heads, 3, hd, d)
            for j, name in enumerate(("wq", "wk", "wv")):
                ours[f"layers.{i}.attn.{name}.weight"] = qkv[:, j].reshape(d, d)
            ours[f"layers.{i}.attn.wo.weight"] = state.pop(f"{hf}.attention.dense.weight")
            ours[f"layers.{i}.mlp.w1.weight"] = state.pop(f"{hf}.mlp.dense_h_to_4h.weight")
            ours[f"layers.{i}.mlp.w2.weight"] = state.pop(f"{hf}.mlp.dense_4h_to_h.weight")
            ours[f"layers.{i}.attn_norm.weight"] = state.pop(f"{hf}.input_layernorm.weight")
            ours[f"layers.{i}.mlp_norm.weight"] = state.pop(f"{hf}.post_attention_layernorm.weight")
        ours["norm.weight"] = state.pop("gpt_neox.final_layer_norm.weight")
        head = state.pop("embed_out.weight", None)
        if head is None:
            head = state.pop("lm_head.weight", None)
        _require(head is not None, where, "no embed_out.weight")
        ours["head.weight"] = head
        for name in [n for n in state if n.endswith(".bias")]:
            _require(not state[name].any(), where, f"nonzero bias {name}")
            state.pop(name)
        _require_consumed(state, where)
        return ours

    return Conversion(config, expected, optional, "vocab_size, hidden_size, intermediate_size", convert)


CONVERSIONS = {"llama": _llama, "gpt_neox": _neox}


def _require_consumed(state: dict[str, torch.Tensor], where: Path) -> None:
    leftover = sorted(n for n in state if not n.endswith(("rotary_emb.inv_freq", "attention.masked_bias")))
    _require(not leftover, where, f"unexpected weights {leftover[:5]}")
