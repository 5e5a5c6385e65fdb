"""Configuration files (--config, --print-config): equivalent to the flags, overridden by them, checked."""

import os

import numpy as np
import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from helpers import run_ranks
from prbmrm.cli import train
from prbmrm.cli.common import ArgumentParser, run
from prbmrm.cli.config import add_config_options, parse_configured
from prbmrm.distributed.comm import SerialComm
from prbmrm.model import load_model

FLAGS = ["--loss", "huber_hinge", "--loss-param", "delta=0.3", "--lam", "1e-3", "--bias",
         "--rel-epsilon", "1e-4", "--max-iter", "300", "--idle-age", "5", "--quiet"]
CONFIG = """
loss = "huber_hinge"
lam = 1e-3
bias = true
rel-epsilon = 1e-4      # dashes work as well as underscores
max_iter = 300
idle_age = 5
quiet = true

[loss_param]
delta = 0.3
"""


def train_main(*argv):
    return run(train.main, "prbmrm.cli.train", list(argv))


def write(tmp_path, text, name="run.toml"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def effective(capsys, *argv):
    """The --print-config output of `argv`, parsed."""
    capsys.readouterr()
    assert train_main(*argv, "--print-config") == 0
    text = capsys.readouterr().out
    return text, tomllib.loads(text)


def test_model_from_config_equals_model_from_flags(tmp_path):
    config = write(tmp_path, CONFIG)
    assert train_main(*FLAGS, "--out", str(tmp_path / "flags.h5")) == 0
    assert train_main("--config", config, "--out", str(tmp_path / "config.h5")) == 0
    flags, configured = (load_model(str(tmp_path / name)) for name in ("flags.h5", "config.h5"))
    np.testing.assert_array_equal(configured.w, flags.w)
    assert configured.bias == flags.bias
    for key in ("objective", "lower_bound", "iterations", "lam", "loss", "loss_params", "has_bias"):
        assert configured.attrs[key] == flags.attrs[key], key
    np.testing.assert_array_equal(configured.history["objective"], flags.history["objective"])


def test_flags_override_the_file(tmp_path, capsys):
    config = write(tmp_path, CONFIG)
    _, values = effective(capsys, "--config", config, "--lam", "1e-2", "--loss-param", "delta=0.7",
                          "--max-iter", "50")
    assert values["lam"] == 1e-2 and values["max_iter"] == 50
    assert values["loss_param"] == {"delta": 0.7}
    assert values["bias"] is True and values["idle_age"] == 5 and values["loss"] == "huber_hinge"


def test_print_config_round_trips(tmp_path, capsys):
    argv = ["--loss", "quantile", "--loss-param", "tau=0.3", "--lam", "1e-1,1e-2", "--bias",
            "--solver-param", "bundle_size=4", "--data", "shards/", "--log-json", "log.jsonl"]
    text, values = effective(capsys, *argv)
    assert values["lam"] == [0.1, 0.01] and values["loss_param"] == {"tau": 0.3}
    assert values["data"] == "shards/" and values["solver_param"] == {"bundle_size": 4}
    again, _ = effective(capsys, "--config", write(tmp_path, text))
    assert again == text
    parser = train.build_parser()
    direct = vars(parse_configured(parser, argv, SerialComm()))
    from_file = vars(parse_configured(train.build_parser(), ["--config", write(tmp_path, text, "b.toml")],
                                      SerialComm()))
    assert {k: v for k, v in from_file.items() if k != "config"} == {k: v for k, v in direct.items()
                                                                     if k != "config"}


PRIVACY = """
bias = true

[privacy]
parties = true
data = ["site-a/", "site-b/", "site-c/"]
model_to = [2, 0]
verify_coordinator = true
audit_log = "audit/{rank}.jsonl"
dp_epsilon = 1.0
dp_delta = 1e-5
"""


def test_privacy_table_sets_the_party_options_and_flags_override_it(tmp_path, capsys):
    config = write(tmp_path, PRIVACY)
    text, values = effective(capsys, "--config", config, "--model-to", "1", "--no-audit-log")
    privacy = values["privacy"]
    assert privacy["parties"] is True and privacy["data"] == ["site-a/", "site-b/", "site-c/"]
    assert privacy["model_to"] == [1] and privacy["no_audit_log"] is True
    assert privacy["verify_coordinator"] is True and privacy["audit_log"] == "audit/{rank}.jsonl"
    assert (privacy["dp_epsilon"], privacy["dp_delta"]) == (1.0, 1e-5) and values["bias"] is True
    assert "parties" not in values and "party_data" not in privacy  # only in their table, by their keys
    again, _ = effective(capsys, "--config", write(tmp_path, text, "again.toml"))
    assert again == text
    args = parse_configured(train.build_parser(), ["--config", config], SerialComm())
    flags = parse_configured(train.build_parser(), [
        "--bias", "--parties", "--party-data", "site-a/", "--party-data", "site-b/", "--party-data", "site-c/",
        "--model-to", "2,0", "--verify-coordinator", "--audit-log", "audit/{rank}.jsonl", "--dp-epsilon", "1",
        "--dp-delta", "1e-5"], SerialComm())
    assert {k: v for k, v in vars(args).items() if k != "config"} == {k: v for k, v in vars(flags).items()
                                                                      if k != "config"}


def test_privacy_data_template_is_one_string(tmp_path):
    config = write(tmp_path, '[privacy]\nparties = true\ndata = "site-{rank}.h5"\n')
    args = parse_configured(train.build_parser(), ["--config", config], SerialComm())
    assert train.party_data(args) == "site-{rank}.h5"
    assert train.party_data(train.build_parser().parse_args(["--party-data", "a", "--party-data", "b"])) == ["a", "b"]
    assert train.party_data(train.build_parser().parse_args(["--party-data", "a"])) == ["a"]  # no template


def test_every_option_has_a_key_and_new_options_appear(tmp_path):
    parser = ArgumentParser(prog="demo")
    parser.add_argument("--rate", type=float, default=1.0)
    parser.add_argument("--name")
    parser.add_argument("--count", type=int, default=3)
    parser.add_argument("--fast", action="store_true")
    parser.add_argument("--slow", dest="fast_off", action="store_false")
    parser.add_argument("--mode", choices=["a", "b"], default="a")
    parser.add_argument("--pair", action="append", metavar="NAME=VALUE")
    add_config_options(parser)
    config = write(tmp_path, 'rate = 2\nname = "x"\ncount = 7\nfast = true\nfast_off = true\nmode = "b"\n'
                             'pair = {k = "v", n = 1.5, on = false}\n')
    args = parse_configured(parser, ["--config", config, "--count", "8"], SerialComm())
    assert (args.rate, args.name, args.count, args.fast, args.fast_off, args.mode) == (2.0, "x", 8, True, False, "b")
    assert args.pair == ["k=v", "n=1.5", "on=false"]


@pytest.mark.parametrize("text, fragments", [
    ("lamda = 1e-3\n", ["run.toml", "unknown key 'lamda'", "did you mean 'lam'"]),
    ("colour = 1\n", ["unknown key 'colour'", "keys: data, loss"]),
    ('max_iter = "ten"\n', ["run.toml", "key 'max_iter'", "expected an integer, got a string 'ten'"]),
    ("max_iter = 1.5\n", ["key 'max_iter'", "expected an integer, got a number 1.5"]),
    ("epsilon = true\n", ["key 'epsilon'", "expected a number, got true or false True"]),
    ("bias = 1\n", ["key 'bias'", "expected true or false"]),
    ("loss = 3\n", ["key 'loss'", "expected a string"]),
    ('loss_param = "tau=0.5"\n', ["key 'loss_param'", "expected a table of NAME = VALUE"]),
    ("loss_param = {tau = [1]}\n", ["key 'loss_param': 'tau'", "expected a string, number or boolean"]),
    ('lam = "big"\n', ["key 'lam'", "comma-separated list of numbers, got 'big'"]),
    ("lam = \n", ["run.toml: not a valid TOML file"]),
    ("print_config = true\n", ["unknown key 'print_config'"]),
    ("parties = true\n", ["unknown key 'parties' here; it belongs in the [privacy] table"]),
    ("[privacy]\nlam = 1e-3\n", ["run.toml: [privacy]: unknown key 'lam' here; it belongs in the top level"]),
    ("[privacy]\nparties_ = true\n", ["[privacy]: unknown key 'parties_'; did you mean 'parties'?"]),
    ("privacy = 1\n", ["run.toml: [privacy]: expected a table, got an integer 1"]),
    ('[privacy]\nmodel_to = "a,b"\n', ["[privacy]: key 'model_to'", "comma-separated party numbers"]),
    ("[privacy]\ndata = [1, 2]\n", ["[privacy]: key 'data'", "expected a string, got an integer 1"]),
])
def test_bad_files_are_refused_with_the_file_and_key(tmp_path, capsys, text, fragments):
    config = write(tmp_path, text)
    capsys.readouterr()
    assert train_main("--config", config, "--out", str(tmp_path / "m.h5")) == 2
    error = capsys.readouterr().err
    for fragment in fragments:
        assert fragment in error
    assert not os.path.exists(tmp_path / "m.h5")


def test_missing_file(tmp_path, capsys):
    capsys.readouterr()
    assert train_main("--config", str(tmp_path / "missing.toml")) == 2
    assert "missing.toml: cannot read the configuration file: No such file" in capsys.readouterr().err


@pytest.mark.timeout(120)
@pytest.mark.parametrize("ranks", [2])
@pytest.mark.parametrize("problem, fragments", [
    ("unknown", ["unknown key 'lamda'"]),
    ("type", ["key 'max_iter'", "expected an integer"]),
    ("missing", ["missing.toml: cannot read the configuration file: No such file"]),
])
def test_bad_files_stop_every_rank(tmp_path, ranks, problem, fragments):
    """Every rank stops, rank 0 alone speaks (the in-process tests above are the 1-rank case)."""
    text = {"unknown": "lamda = 1e-3\n", "type": 'max_iter = "x"\n'}.get(problem)
    config = str(tmp_path / "missing.toml") if text is None else write(tmp_path, text)
    completed, _ = run_ranks(ranks, ["-m", "prbmrm.cli.train", "--config", config,
                                      "--out", str(tmp_path / "m.h5")])
    assert completed.returncode == 2
    errors = [line for line in completed.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and "Traceback" not in completed.stderr, completed.stderr
    for fragment in fragments:
        assert fragment in errors[0]
