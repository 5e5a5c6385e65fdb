"""The option groups of a run (prbmrm.options): one definition each for the CLI, the TOML config and fit."""

import dataclasses

import numpy as np
import pytest

from prbmrm.distributed.comm import SerialComm
from prbmrm.errors import UsageError
from prbmrm.options import (GROUPS, BundleOptions, Checkpointing, PartySettings, Stopping, add_arguments,
                            from_namespace, option)
from prbmrm.cli.train import build_parser
from prbmrm.cli.common import ArgumentParser
from prbmrm.cli.config import add_config_options, parse_configured

# For every field that is an option: (its value on the command line or in TOML, the value parsed).
# A new field needs a line here: the test below lists the fields and fails without it.
SAMPLES = {
    "epsilon": ("1e-5", 1e-5), "rel_epsilon": ("1e-4", 1e-4), "max_iter": ("7", 7),
    "idle_age": ("3", 3), "bundle_size": ("5", 5), "bundle_memory": ("2GB", 2 * 10**9),
    "checkpoint": ("ck.h5", "ck.h5"), "checkpoint_every": ("2", 2), "resume": ("r.h5", "r.h5"),
    "checkpoint_key": ("key", "key"),
    "resume_if_exists": (True, True),
    "model_to": ("0,2", [0, 2]), "allow_score_sharing": (True, True), "verify_coordinator": (True, True),
    "audit_log": ("a-{rank}.jsonl", "a-{rank}.jsonl"), "dp_epsilon": ("1.5", 1.5), "dp_delta": ("1e-6", 1e-6),
    "dp_clip": ("2.5", 2.5), "dp_coalition": ("1", 1), "signing_key": ("k-{rank}.key", "k-{rank}.key"),
    "roster": ("roster.json", "roster.json"),
}
SECTIONS = {PartySettings: "privacy"}  # the TOML table of a group's keys ("" : the top level)


def option_fields():
    return [(group, field) for group in GROUPS for field in dataclasses.fields(group) if field.metadata.get("flag")]


def toml_value(text, parsed):
    """How a configuration file writes the sample: numbers as numbers, the rest as given."""
    if isinstance(parsed, bool) or isinstance(parsed, (int, float)) and not isinstance(text, str):
        return str(parsed).lower()
    if isinstance(parsed, (int, float)) and text.replace(".", "").replace("e-", "").isdigit():
        return text
    return f'"{text}"'


def test_every_option_field_has_a_sample():
    assert {field.name for _, field in option_fields()} == set(SAMPLES)


@pytest.mark.parametrize("group, field", option_fields(), ids=lambda x: getattr(x, "name", getattr(x, "__name__", "")))
def test_the_cli_and_the_config_accept_each_field(tmp_path, group, field):
    text, parsed = SAMPLES[field.name]
    flag, dest = field.metadata["flag"], field.metadata.get("dest") or field.name
    parser = build_parser()
    args = parser.parse_args([flag] if text is True else [flag, text])
    assert getattr(args, dest) == parsed
    section = SECTIONS.get(group, "")
    config = tmp_path / "run.toml"
    config.write_text((f"[{section}]\n" if section else "") + f"{dest} = {toml_value(text, parsed)}\n")
    args = parse_configured(build_parser(), ["--config", str(config)], SerialComm())
    assert getattr(args, dest) == parsed
    # What a field needs beside it to make a valid group.
    context = {"checkpoint_every": {"checkpoint": "ck.h5"}, "resume_if_exists": {"checkpoint": "ck.h5"},
               "dp_epsilon": {"dp_delta": 1e-6}, "dp_delta": {"dp_epsilon": 1.0}}.get(field.name, {})
    assert getattr(from_namespace(group, args, **context), field.name) == parsed


def test_a_new_field_is_an_option_and_a_config_key_with_no_other_code(tmp_path):
    @dataclasses.dataclass(frozen=True)
    class WithDeadline(Stopping):
        max_seconds: object = option(None, "--max-seconds", type=float, help="stop after this many seconds")

    parser = ArgumentParser(prog="t")
    add_arguments(parser, WithDeadline)
    add_config_options(parser)
    config = tmp_path / "run.toml"
    config.write_text("max_seconds = 30.0\nmax_iter = 9\n")
    args = parse_configured(parser, ["--config", str(config), "--epsilon", "0.5"], SerialComm())
    assert from_namespace(WithDeadline, args) == WithDeadline(epsilon=0.5, max_iter=9, max_seconds=30.0)


@pytest.mark.parametrize("build, message", [
    (lambda: Stopping(max_iter=0), "--max-iter must be >= 1"),
    (lambda: Stopping(epsilon=-1.0), "--epsilon must be >= 0"),
    (lambda: Stopping(rel_epsilon=float("nan")), "--rel-epsilon must be >= 0"),
    (lambda: BundleOptions(bundle_size=1), "--bundle-size must be 0"),
    (lambda: BundleOptions(idle_age=-1), "--idle-age must be >= 0"),
    (lambda: BundleOptions(bundle_memory="lots"), "--bundle-memory: expected a size"),
    (lambda: Checkpointing(checkpoint_every=3), "--checkpoint-every needs --checkpoint"),
    (lambda: Checkpointing(resume_if_exists=True), "--resume-if-exists needs --checkpoint"),
    (lambda: PartySettings(dp_epsilon=1.0), "needs both --dp-epsilon and --dp-delta"),
    (lambda: PartySettings(dp_epsilon=1.0, dp_delta=2.0), "--dp-delta must be in"),
])
def test_each_group_validates_itself_once_built(build, message):
    with pytest.raises(UsageError, match=message):
        build()


def test_groups_are_frozen_and_hold_bytes():
    stopping = Stopping(max_iter=5)
    with pytest.raises(dataclasses.FrozenInstanceError):
        stopping.max_iter = 6
    assert BundleOptions(bundle_memory="1KiB").bundle_memory == 1024
    assert Stopping(epsilon=1e-3).tolerances == (1e-3, 0.0) and Stopping().tolerances == (0.0, 1e-3)


def test_party_mode_is_validated_by_its_settings():
    from prbmrm.party.session import Party

    with pytest.raises(UsageError, match="--dp-clip must be > 0"):
        Party(dp_epsilon=1.0, dp_delta=1e-5, dp_clip=0.0)


def test_fit_takes_the_groups_or_their_fields_alike():
    from prbmrm.training import run

    by_object = run(None, stopping=Stopping(max_iter=12, rel_epsilon=0.0), bundle=BundleOptions(idle_age=2))[0]
    by_keywords = run(None, max_iter=12, rel_epsilon=0.0, idle_age=2)[0]
    assert by_object.nit == by_keywords.nit == 12
    assert by_object.w.tobytes() == by_keywords.w.tobytes()
    assert np.array_equal(by_object.history["objective"], by_keywords.history["objective"])
    with pytest.raises(UsageError, match="--max-iter must be >= 1"):
        run(None, max_iter=0)
    with pytest.raises(TypeError, match="unexpected keyword argument 'max_iterations'"):
        run(None, max_iterations=3)
