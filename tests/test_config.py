from __future__ import annotations

import pytest

from tablefree.config import ModelConfig, apply_overrides, from_dict, load_yaml, parse_count, preset


@pytest.mark.parametrize(
    ("text", "value"),
    [("100B", 100_000_000_000), ("2.5M", 2_500_000), ("64k", 64_000), ("1_000", 1000), (12, 12)],
)
def test_parse_count(text, value) -> None:
    assert parse_count(text) == value


def test_parse_count_rejects_garbage() -> None:
    with pytest.raises(ValueError, match="budget"):
        parse_count("lots", "budget")


def test_from_dict_names_unknown_and_bad_fields() -> None:
    with pytest.raises(ValueError, match=r"model: unknown field\(s\) \['dmodel'\]"):
        from_dict(ModelConfig, {"dmodel": 3}, where="model")
    with pytest.raises(ValueError, match=r"model.n_layers: expected an integer"):
        from_dict(ModelConfig, {"n_layers": "four"}, where="model")
    with pytest.raises(ValueError, match=r"model.interface: unknown field"):
        from_dict(ModelConfig, {"interface": {"nam": "x"}}, where="model")


def test_from_dict_nested_and_validation() -> None:
    config = from_dict(ModelConfig, {"d_model": 64, "n_heads": 4, "interface": {"name": "affine"}})
    assert config.interface.name == "affine" and config.n_kv_heads == 4
    with pytest.raises(ValueError, match="divisible"):
        from_dict(ModelConfig, {"d_model": 63, "n_heads": 4})


def test_overrides_and_yaml(tmp_path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("model:\n  d_model: 64\noptim:\n  lr: 0.001\n")
    data = apply_overrides(load_yaml(path), ["model.interface.name=affine", "optim.lr=3e-4", "budget=100B"])
    assert data == {
        "model": {"d_model": 64, "interface": {"name": "affine"}},
        "optim": {"lr": 3e-4},
        "budget": "100B",
    }
    with pytest.raises(ValueError, match="KEY=VALUE"):
        apply_overrides({}, ["oops"])
    bad = tmp_path / "bad.yaml"
    bad.write_text("a: [1,\n")
    with pytest.raises(ValueError, match=r"bad\.yaml"):
        load_yaml(bad)


def test_preset_overrides() -> None:
    config = preset("tiny", interface="affine", vocab_size=1000)
    assert config.vocab_size == 1000 and config.interface.name == "affine"
    with pytest.raises(ValueError, match="unknown preset"):
        preset("huge")
