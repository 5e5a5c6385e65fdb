"""Party mode against a hostile party: typed messages, signed keys, attributable flags, poisoning checks.

Each test runs ``prbmrm.cli.train --parties`` on 3 ranks through tests/party/hostile_ranks.py, one rank
patched to misbehave, and checks that the run stops non-zero with one clear message naming the
sender (or the check that failed), and that no code ran from another rank's bytes.
"""

import json
import os
import pickle
import re
import subprocess
import sys

import numpy as np
import pytest

from helpers import REPO, load_svmlight, run_ranks
from prbmrm.io import write_shards
from prbmrm.model import load_model

DRIVER = os.path.join(REPO, "tests", "party", "hostile_ranks.py")
PARTIES = 3


@pytest.fixture(scope="module")
def sites(tmp_path_factory):
    """The first 3000 rows of a9a split unevenly over 3 parties, each converted on its own."""
    root = tmp_path_factory.mktemp("hostile")
    X, y = load_svmlight("a9a.xz", 123)
    bounds = [0, 900, 2100, 3000]
    for r in range(PARTIES):
        write_shards(X[bounds[r]:bounds[r + 1]], y[bounds[r]:bounds[r + 1]], root / f"site-{r}", 1)
    return root


def hostile_run(sites, tmp_path, scenario, rank, *extra):
    marker = tmp_path / "marker"
    completed, _ = run_ranks(PARTIES, [
        DRIVER, scenario, str(rank), str(marker), "--parties", "--data", f"{sites}/site-{{rank}}", "--bias",
        "--lam", "1e-3", "--quiet", "--audit-log", f"{tmp_path}/audit-{{rank}}.jsonl",
        "--out", f"{tmp_path}/model-{{rank}}.h5", *extra], timeout=180)
    return completed, marker


def errors(completed):
    return [line for line in completed.stderr.splitlines() if "error" in line]


def test_the_crafted_pickle_runs_code_when_unpickled(tmp_path):
    """The control: the payload of the hostile tests does write its file if anyone unpickles it."""
    marker = tmp_path / "control"
    code = (f"import sys, pickle; sys.path.insert(0, {os.path.join(REPO, 'tests', 'party')!r}); "
            f"import hostile_ranks; pickle.loads(hostile_ranks.crafted({str(marker)!r}))")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60, stdin=subprocess.DEVNULL)
    assert marker.exists()


CHANNELS = [
    # coordinator -> parties
    ("pickle-result", 0, r"rank 1 refused the message of rank 0: not a UTF-8 JSON message"),
    ("oversized-result", 0, r"rank 0 sent a message beyond the limit of 67108864 bytes"),
    ("wrong-shape", 0, r"the result the coordinator \(party 0\) sent is malformed: w: expected float64 of "
                       r"shape \(124,\), got float64 of shape \(125,\)"),
    ("wrong-dtype", 0, r"the result the coordinator \(party 0\) sent is malformed: w: expected float64 of "
                       r"shape \(124,\), got int64 of shape \(124,\)"),
    ("unknown-kind", 0, r"rank 0 \(the coordinator in party mode\) sent the message kind 9.0: not a message"),
    ("unknown-service", 0, r"rank 0 \(the coordinator in party mode\) sent the service .*os.system.* "
                           r"\(known: argsup, pragam, tron\): not a message of the protocol"),
    # party -> coordinator (rank 0 is the first to refuse) and the other parties
    ("pickle-format", 2, r"rank 0 refused the message of rank 2: not a UTF-8 JSON message"),
    ("oversized-format", 2, r"rank 2 sent a message beyond the limit of 65536 bytes"),
    # party -> parties: its key message is a fixed 128-byte buffer, verified, never parsed
    ("pickle-key", 1, r"party 0 found that party 1's key agreement message is not signed by its signing key"),
]


STARTUP = ("pickle-format", "oversized-format", "pickle-key")  # stopped before any audit log opens


@pytest.mark.timeout(300)
@pytest.mark.parametrize("scenario, rank, message", CHANNELS, ids=[c[0] for c in CHANNELS])
def test_hostile_payloads_run_nothing_and_name_the_sender(sites, tmp_path, scenario, rank, message):
    completed, marker = hostile_run(sites, tmp_path, scenario, rank)
    assert completed.returncode == 2, completed.stderr[-3000:]
    assert not marker.exists()  # no rank ran the payload
    found = errors(completed)
    assert len(found) == 1 and "Traceback" not in completed.stderr, completed.stderr[-3000:]
    assert re.search(message, found[0]), found[0]
    assert not list(tmp_path.glob("model-*.h5"))
    for r in range(PARTIES):
        if r != rank and scenario not in STARTUP:  # every honest party's log ends with a summary saying why
            last = json.loads(open(tmp_path / f"audit-{r}.jsonl").read().splitlines()[-1])
            # (or, where the job is ended under a coordinator stuck in a collective, the provisional one)
            ended = ("error", "unfinished") if scenario.startswith("unknown") else ("error",)
            assert last["summary"]["outcome"].startswith(ended), last


def keys(tmp_path):
    from prbmrm.party.keys import keygen, write_roster

    for r in range(PARTIES):
        keygen(str(tmp_path / f"party-{r}"))
    write_roster([str(tmp_path / f"party-{r}.pub") for r in range(PARTIES)], str(tmp_path / "roster.json"))
    return ["--party-key", f"{tmp_path}/party-{{rank}}.key", "--roster", str(tmp_path / "roster.json")]


@pytest.mark.timeout(300)
def test_keys_checked_against_the_roster_and_a_substituted_key_is_named(sites, tmp_path):
    from prbmrm.party.keys import keygen

    options = keys(tmp_path)
    completed, _ = hostile_run(sites, tmp_path, "honest", 0, *options)
    assert completed.returncode == 0, completed.stderr[-3000:]
    model = load_model(str(tmp_path / "model-1.h5"))
    assert model.attrs["keys_authenticated"] is True
    roster = json.load(open(tmp_path / "roster.json"))
    assert json.loads(model.attrs["key_fingerprints"]) == [p["fingerprint"] for p in roster["parties"]]
    # Party 2's key replaced (a party in the middle presenting its own key for party 2).
    keygen(str(tmp_path / "party-2"))
    completed, _ = hostile_run(sites, tmp_path, "honest", 0, *options)
    assert completed.returncode == 2
    found = errors(completed)
    assert len(found) == 1, completed.stderr
    assert re.search(r"party 0 found that party 2's signing key \(fingerprint [0-9a-f]{16}\) is not the one "
                     r"of the roster \([0-9a-f]{16}\): a substituted key", found[0]), found[0]


@pytest.mark.timeout(300)
def test_a_key_message_replayed_from_an_earlier_run_is_refused_naming_the_party(sites, tmp_path):
    options = keys(tmp_path)
    completed, _ = hostile_run(sites, tmp_path, "record-key", 1, *options)
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert (tmp_path / "marker.key-message").stat().st_size == 128
    for model in tmp_path.glob("model-*.h5"):
        model.unlink()
    # Party 1's key message of the first run, byte for byte: signed, by the roster's key, for another run.
    completed, _ = hostile_run(sites, tmp_path, "replay-key", 1, *options)
    assert completed.returncode == 2, completed.stderr[-3000:]
    found = errors(completed)
    assert len(found) == 1 and "Traceback" not in completed.stderr, completed.stderr[-3000:]
    assert re.search(r"party [02] found that party 1's key agreement message is not signed by its signing key "
                     r"for this run \(run [0-9a-f]{16}\): forged, or replayed from another run", found[0]), found[0]
    assert not list(tmp_path.glob("model-*.h5"))


@pytest.mark.timeout(300)
def test_a_roster_with_a_repeated_key_and_a_shared_secret_key_are_refused_at_the_run(sites, tmp_path):
    options = keys(tmp_path)
    roster = json.load(open(tmp_path / "roster.json"))
    roster["parties"][2]["public_key"] = roster["parties"][1]["public_key"]  # edited by hand, past `roster`
    json.dump(roster, open(tmp_path / "roster.json", "w"))
    completed, _ = hostile_run(sites, tmp_path, "honest", 0, *options)
    assert completed.returncode == 2, completed.stderr[-3000:]
    found = errors(completed)
    assert len(found) == 1 and "Traceback" not in completed.stderr, completed.stderr[-3000:]
    assert re.search(r"roster.json: party 2 has the same public key \(fingerprint [0-9a-f]{16}\) as party 1",
                     found[0]), found[0]
    # Without a roster, one key holder playing two parties is refused all the same.
    (tmp_path / "party-2.key").write_text((tmp_path / "party-1.key").read_text())
    completed, _ = hostile_run(sites, tmp_path, "honest", 0, "--party-key", f"{tmp_path}/party-{{rank}}.key")
    assert completed.returncode == 2, completed.stderr[-3000:]
    found = errors(completed)
    assert len(found) == 1 and "Traceback" not in completed.stderr, completed.stderr[-3000:]
    assert re.search(r"found that party 2 and party 1 sent the same signing key", found[0]), found[0]
    # A secret key readable by others (with a sound roster).
    options = keys(tmp_path)
    (tmp_path / "party-2.key").chmod(0o644)
    completed, _ = hostile_run(sites, tmp_path, "honest", 0, *options)
    assert completed.returncode == 2, completed.stderr[-3000:]
    found = errors(completed)
    assert len(found) == 1 and "Traceback" not in completed.stderr, completed.stderr[-3000:]
    assert re.search(r"party-2.key: the party's signing key is accessible to others \(mode 0644\): it must be "
                     r"private to its owner", found[0]), found[0]
    assert not list(tmp_path.glob("model-*.h5"))


@pytest.mark.timeout(300)
def test_a_false_blame_names_the_blaming_party(sites, tmp_path):
    completed, _ = hostile_run(sites, tmp_path, "false-blame", 2)
    assert completed.returncode == 2
    assert "error: party 2 stopped the run: it says that the coordinator deviated" in completed.stderr
    assert "coordinator deviated (a false claim)" in completed.stderr  # party 2's own claim, as party 2's


@pytest.mark.timeout(300)
def test_a_tampered_status_counter_blames_nobody(sites, tmp_path):
    completed, _ = hostile_run(sites, tmp_path, "tampered-status", 2)
    assert completed.returncode == 2
    found = errors(completed)
    assert len(found) == 1 and "do not match what the parties declare" in found[0], completed.stderr
    assert "no party, the coordinator included, is blamed" in found[0]


POISONS = [
    ("times-50", r"the aggregated risk of evaluation 3 is -[0-9.e+]+, below the loss's floor 0: a party's "
                 r"contribution is not its risk and subgradient"),
    ("times-1e300", r"the aggregated risk of evaluation 3 and that of evaluation \d are not those of a convex "
                    r"function"),
    ("offset", r"the aggregated risk of evaluation \d and that of evaluation \d are not those of a convex "
               r"function"),
    ("nan", r"the aggregated risk of evaluation 3: party 2 sent non-finite values"),
]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("scenario, message", POISONS, ids=[p[0] for p in POISONS])
def test_a_poisoning_party_stops_the_run(sites, tmp_path, scenario, message):
    completed, _ = hostile_run(sites, tmp_path, scenario, 2)
    assert completed.returncode == 2, completed.stderr[-3000:]
    found = errors(completed)
    assert len(found) == 1 and "Traceback" not in completed.stderr, completed.stderr[-3000:]
    assert re.search(message, found[0]), found[0]
    assert not list(tmp_path.glob("model-*.h5"))


@pytest.mark.timeout(300)
def test_audit_logs_end_with_a_summary_when_a_party_is_killed(sites, tmp_path):
    completed, _ = hostile_run(sites, tmp_path, "killed", 2)
    assert completed.returncode != 0
    for r in range(PARTIES):
        lines = [json.loads(line) for line in open(tmp_path / f"audit-{r}.jsonl")]
        assert "summary" in lines[-1] and sum("summary" in line for line in lines) == 1
        assert lines[-1]["summary"]["queries"] == sum("query" in line for line in lines)
    last = json.loads(open(tmp_path / "audit-2.jsonl").read().splitlines()[-1])
    assert last["summary"]["outcome"].startswith("unfinished"), last
