"""ArchConfig validates itself and names the field and the reason of every refusal."""

from __future__ import annotations

import pytest

from cost_model import VARIANTS, ArchConfig, ArchConfigError


def make(**kw: object) -> ArchConfig:
    base: dict[str, object] = {"n_layers": 4, "d_model": 128, "n_heads": 4}
    base.update(kw)
    return ArchConfig(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("changes", "field", "fragment"),
    [
        ({"d_model": 130, "n_heads": 4}, "n_heads", "not divisible"),
        ({"variant": "block_attnres", "block_size": 9}, "block_size", "[1, 2·n_layers = 8]"),
        ({"variant": "block_attnres", "block_size": 0}, "block_size", "got 0"),
        ({"variant": "block_attnres"}, "block_size", "needs a block size"),
        ({"variant": "full_attnres", "block_size": 2}, "block_size", "has no block size"),
        ({"variant": "baseline", "block_size": 2}, "block_size", "has no block size"),
        ({"variant": "baseline", "mhc_streams": 4}, "mhc_streams", "only mhc_lite"),
        ({"variant": "mhc_lite", "mhc_streams": 7}, "mhc_streams", "at most 6"),
        ({"n_layers": 0}, "n_layers", "must be positive"),
        ({"d_model": -8}, "d_model", "must be positive"),
        ({"n_heads": 0}, "n_heads", "must be positive"),
        ({"vocab_size": 0}, "vocab_size", "must be positive"),
        ({"seq_len": 0}, "seq_len", "must be positive"),
        ({"d_ff": 0}, "d_ff", "must be positive"),
        ({"ff_ratio": -1.0}, "ff_ratio", "must be positive"),
        ({"d_ff": 256, "ff_ratio": 2.0}, "ff_ratio", "not both"),
        ({"n_kv_heads": 3}, "n_kv_heads", "not divisible"),
        ({"variant": "attnres_magic"}, "variant", "unknown value 'attnres_magic'"),
        ({"mlp": "relu"}, "mlp", "unknown value"),
        ({"norm": "batchnorm"}, "norm", "unknown value"),
        ({"positions": "alibi"}, "positions", "unknown value"),
        ({"dtype": "int8"}, "dtype", "unknown value"),
        ({"n_layers": 2.5}, "n_layers", "must be an integer"),
        ({"n_layers": True}, "n_layers", "must be an integer"),
        ({"bias": "yes"}, "bias", "true or false"),
        ({"d_model": 132, "n_heads": 12}, "n_heads", "even head dimension"),
    ],
)
def test_invalid_configs_name_field_and_reason(
    changes: dict[str, object], field: str, fragment: str
) -> None:
    with pytest.raises(ArchConfigError) as info:
        make(**changes)
    assert info.value.field == field
    assert fragment in info.value.reason
    assert str(info.value).startswith(f"{field}: ")


def test_valid_configs_for_every_variant() -> None:
    for variant in VARIANTS:
        cfg = make(variant=variant, block_size=3 if variant == "block_attnres" else None)
        assert cfg.variant == variant
        assert cfg.n_sublayers == 8


def test_derived_sizes() -> None:
    cfg = make(variant="block_attnres", block_size=3, n_kv_heads=2)
    assert cfg.n_blocks == 3  # 8 sublayers in blocks of 3, 3, 2
    assert cfg.head_dim == 32 and cfg.kv_dim == 64
    assert cfg.ffn_dim == 512
    assert make(mlp="swiglu").ffn_dim == round(128 * 8 / 3)
    assert make(variant="full_attnres").n_blocks == 8
    assert make(variant="mhc_lite").streams == 4
    assert make().aspect_ratio == 32.0


def test_replace_revalidates() -> None:
    cfg = make()
    with pytest.raises(ArchConfigError, match="n_heads"):
        cfg.replace(d_model=130)
    assert cfg.replace(n_layers=8).n_layers == 8


def test_pydantic_validates_the_dataclass() -> None:
    pydantic = pytest.importorskip("pydantic")
    adapter = pydantic.TypeAdapter(ArchConfig)
    ok = adapter.validate_python({"n_layers": 2, "d_model": 64, "n_heads": 2})
    assert ok.d_model == 64
    with pytest.raises(pydantic.ValidationError, match="not divisible"):
        adapter.validate_python({"n_layers": 2, "d_model": 65, "n_heads": 2})


def test_input_errors_survive_pickling() -> None:
    """They cross process boundaries (Ray workers to the runner) with field and reason."""
    import pickle

    from cost_model import CostInputError
    from cost_model._config import ArchConfigError

    for cls in (CostInputError, ArchConfigError):
        err = pickle.loads(pickle.dumps(cls("d_model", "must be positive")))
        assert type(err) is cls
        assert (err.field, err.reason, str(err)) == (
            "d_model",
            "must be positive",
            str(cls("d_model", "must be positive")),
        )
