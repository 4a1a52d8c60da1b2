"""Options written once (attnconv.options): config fields carry help, range and choices; flags and checks derive from them."""

import dataclasses
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from attnconv.cli import build_parser, main, ranges
from attnconv.config import InitFrom, TrainConfig, make_config
from attnconv.errors import AttnconvError
from attnconv.models import MODEL_CONFIGS, ClassifierConfig, build_model
from attnconv.options import FieldError, check_fields, flag_name, option, option_fields


def _train_parser():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    return sub.choices["train"]


def test_library_errors_name_the_field_and_the_cli_names_the_flag(tmp_path, capsys):
    with pytest.raises(FieldError, match=r"^epochs 0 is invalid: give a whole number") as err:
        make_config(preset="fmnist-sa-quadratic", epochs=0)
    assert "--" not in str(err.value) and err.value.field == "epochs"
    with pytest.raises(FieldError, match=r"^attention_lr_scale -1 is invalid"):
        make_config(preset="fmnist-sa-quadratic", attention_lr_scale=-1)
    with pytest.raises(FieldError, match=r"^momentum 1 is invalid"):  # the range is [0, 1)
        make_config(preset="fmnist-sa-quadratic", momentum=1)
    with pytest.raises(FieldError, match=r"^optimizer 'adam' is invalid: choose one of sgd, adamw"):
        make_config(preset="fmnist-sa-quadratic", optimizer="adam").validate()
    with pytest.raises(FieldError, match=r"^heads 0 is invalid"):
        build_model("sa-quadratic", heads=0)
    with pytest.raises(FieldError, match=r"^width 0 is invalid"):
        build_model("resnet18", width=0)
    # The command line: the same range, said with the flag (its range check knows the field's open upper end).
    assert main(["train", "--preset", "fmnist-sa-quadratic", "--momentum", "1", "--out", str(tmp_path / "r")]) == 2
    err_text = capsys.readouterr().err
    assert err_text.startswith("error: --momentum 1.0 is out of range: give a number >= 0 and below 1")
    assert not (tmp_path / "r").exists()


def test_field_error_as_flag_uses_the_flag_name():
    err = FieldError("alpha", -1.0, "give a positive number", flag="init-alpha")
    assert str(err) == "alpha -1.0 is invalid: give a positive number"
    assert err.as_flag() == "--init-alpha -1.0 is invalid: give a positive number"
    with pytest.raises(FieldError, match="^alpha 0 is invalid"):
        check_fields(InitFrom(run="x", alpha=0))


def test_every_config_field_with_a_flag_is_a_flag_of_train_with_its_help_and_range():
    parser = _train_parser()
    flags = {opt: action for action in parser._actions for opt in action.option_strings}
    for cls in (TrainConfig, InitFrom, *MODEL_CONFIGS):
        for f in option_fields(cls):
            if not f.metadata["cli"]:
                continue
            action = flags.get(f"--{flag_name(f)}")
            assert action is not None, f"{cls.__name__}.{f.name} has no --{flag_name(f)}"
            if f.metadata["help"]:
                assert action.help.replace("%%", "%") == f.metadata["help"]
            if f.metadata["choices"]:
                assert tuple(action.choices) == f.metadata["choices"]
            if f.metadata["low"] is not None:
                assert ranges()[action.dest][0] == f.metadata["low"], f.name


def test_model_flags_reach_the_model_config(tmp_path):
    parser = build_parser()
    args = parser.parse_args(["train", "--out", str(tmp_path), "--heads", "4", "--grad-checkpoint", "--width", "8",
                              "--impl", "dense", "--init-alpha", "2", "--no-fold-bn"])
    assert (args.heads, args.grad_checkpoint, args.width, args.impl, args.init_alpha, args.fold_bn) == \
        (4, True, 8, "dense", 2.0, False)


def test_init_from_is_typed_and_round_trips_through_json():
    cfg = make_config(preset="fmnist-resnet-small", init_from=InitFrom(run="runs/cnn", alpha=2.0, content=4))
    back = TrainConfig.from_dict(json.loads(json.dumps(cfg.to_dict())))
    assert back == cfg and isinstance(back.init_from, InitFrom)
    record = cfg.to_dict()
    record["init_from"] = {"run": "runs/cnn", "alpha": "two", "fold_bn": False}
    with pytest.raises(AttnconvError, match="init_from.alpha"):
        TrainConfig.from_dict(record)
    record["init_from"] = {"run": "runs/cnn", "alpha": 2.0}
    with pytest.raises(AttnconvError, match="fold_bn"):
        TrainConfig.from_dict(record)


@given(value=st.one_of(st.integers(-10, 10**7), st.floats(allow_nan=True, allow_infinity=True)))
def test_check_value_accepts_exactly_the_range(value):
    @dataclasses.dataclass
    class C:
        n: int = option(1, low=1, high=1000)
        x: float = option(0.5, low=0, high=1, high_open=True)

    for name, lo, hi, open_ in (("n", 1, 1000, False), ("x", 0, 1, True)):
        obj = C(**{name: value})
        is_int = isinstance(value, int)
        inside = (is_int or name == "x") and value == value and abs(value) != float("inf") and lo <= value and \
            (value < hi if open_ else value <= hi)
        if inside:
            check_fields(obj)
        else:
            with pytest.raises(FieldError, match=f"^{name} "):
                check_fields(obj)


def test_classifier_config_checks_combinations_by_field():
    with pytest.raises(FieldError, match="^downsample 3 is invalid: image_size 32"):
        ClassifierConfig(downsample=3).validate()
    with pytest.raises(FieldError, match="^init 'grid' is invalid"):
        ClassifierConfig(encoding="learned", init="grid").validate()
