from __future__ import annotations

import pytest

from tablefree.config_parsing import apply_overrides, from_dict, load_yaml, parse_count
from tablefree.model_config import ModelConfig, preset


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
    with pytest.raises(ValueError, match=r"model.interface.nam: no interface has the option .nam."):
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


def test_a_key_given_twice_is_refused_with_both_lines(tmp_path) -> None:
    # PyYAML keeps the later value without a word: the recipe read would not be the recipe trained
    path = tmp_path / "twice.yaml"
    path.write_text("model:\n  d_model: 64\noptim:\n  lr: 0.001\nmodel:\n  d_model: 128\n")
    with pytest.raises(
        ValueError, match=r"(?s)duplicate key 'model' \(first given on line 1\).*twice\.yaml\", line 5"
    ):
        load_yaml(path)
    nested = tmp_path / "nested.yaml"
    nested.write_text("optim:\n  lr: 0.001\n  lr: 0.002\n")
    with pytest.raises(ValueError, match=r"duplicate key 'lr' \(first given on line 2\)"):
        load_yaml(nested)
    # a merge key's values may be overridden by the mapping's own keys: that is not a duplicate
    merged = tmp_path / "merged.yaml"
    merged.write_text("base: &b {lr: 0.001, wd: 0.1}\noptim:\n  <<: *b\n  lr: 0.002\n")
    assert load_yaml(merged)["optim"] == {"lr": 0.002, "wd": 0.1}


def test_preset_overrides() -> None:
    config = preset("tiny", interface="affine", vocab_size=1000)
    assert config.vocab_size == 1000 and config.interface.name == "affine"
    with pytest.raises(ValueError, match="unknown preset"):
        preset("huge")


def test_a_named_section_keeps_its_options_in_either_order() -> None:
    base = {"model": {"interface": {"name": "canonical", "lift": "interleave"}}}
    one = apply_overrides(base, ["model.interface.affine_seed=3", "model.interface=affine"])
    other = apply_overrides(base, ["model.interface=affine", "model.interface.affine_seed=3"])
    expected = {"name": "affine", "lift": "interleave", "affine_seed": 3}
    assert one["model"]["interface"] == other["model"]["interface"] == expected
    # A section given by its name in the file takes fields too.
    named = apply_overrides({"model": {"interface": "affine"}}, ["model.interface.affine_seed=4"])
    assert named["model"]["interface"] == {"name": "affine", "affine_seed": 4}
    with pytest.raises(ValueError, match=r"optim\.lr is 0\.1, not a section"):
        apply_overrides({"optim": {"lr": 0.1}}, ["optim.lr.x=1"])
    with pytest.raises(ValueError, match="not a dotted key"):
        apply_overrides({}, ["optim..lr=1"])


def test_errors_name_the_override_or_the_file_that_brought_the_mistake(tmp_path) -> None:
    from tablefree.config_parsing import from_dict_with_overrides

    good = {"d_model": 64, "n_heads": 4}
    with pytest.raises(ValueError) as caught:
        from_dict_with_overrides(ModelConfig, good, ["n_layers=2", "n_layrs=3"], "m.yaml")
    message = str(caught.value)
    assert message.startswith("command-line override 'n_layrs=3' (applied over m.yaml): unknown field(s)")
    assert "['n_layrs']" in message
    with pytest.raises(
        ValueError, match=r"override 'interface\.lift=3' .*interface\.lift: expected a string"
    ):
        from_dict_with_overrides(ModelConfig, good, ["interface.lift=3"], "m.yaml")
    # The file's own mistake is the file's, even when overrides are given too.
    with pytest.raises(ValueError, match=r"^m\.yaml: unknown field\(s\) \['dmodel'\]"):
        from_dict_with_overrides(ModelConfig, {"dmodel": 3}, ["n_layers=2"], "m.yaml")
    config = from_dict_with_overrides(ModelConfig, good, ["n_layers=2"], "m.yaml", {"d_ff": 32})
    assert (config.n_layers, config.d_ff, config.d_model) == (2, 32, 64)


def test_train_config_blames_the_command_line_not_the_file(tmp_path) -> None:
    from tablefree.train.recipe import load_train_config

    path = tmp_path / "recipe.yaml"
    path.write_text("optim: {lr: 0.001}\n")
    with pytest.raises(ValueError, match=r"^command-line override 'optim\.lrr=3'.*\['lrr'\]") as caught:
        load_train_config(path, ["optim.lrr=3"])
    assert "recipe.yaml.optim" not in str(caught.value)
    path.write_text("optim: {lrr: 0.001}\n")
    with pytest.raises(ValueError, match=r"recipe\.yaml\.optim: unknown field\(s\) \['lrr'\]"):
        load_train_config(path, ["seed=1"])
