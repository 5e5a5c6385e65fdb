"""Party keys: a roster lists each key once, secret key files are private, key messages bind the run."""

import os
import re
import subprocess
import sys

import pytest

from helpers import REPO
from prbmrm.errors import InputError
from prbmrm.party.keys import keygen, load_roster, load_signing_key, write_roster
from prbmrm.party.secure import run_identifier


def cli(*args, cwd):
    return subprocess.run([sys.executable, "-m", "prbmrm", "party", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=120, stdin=subprocess.DEVNULL,
                          env={**os.environ, "PYTHONPATH": REPO})


def test_roster_refuses_a_key_listed_twice(tmp_path):
    for r in range(3):
        assert cli("keygen", f"s{r}", cwd=tmp_path).returncode == 0
    done = cli("roster", "s0.pub", "s1.pub", "s1.pub", "--out", "roster.json", cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.count("\n") == 1
    assert re.search(r"error: s1.pub: party 2 has the same public key \(fingerprint [0-9a-f]{16}\) as party 1",
                     done.stderr), done.stderr
    assert not (tmp_path / "roster.json").exists()
    assert cli("roster", "s0.pub", "s1.pub", "s2.pub", "--out", "roster.json", cwd=tmp_path).returncode == 0
    assert len(load_roster(str(tmp_path / "roster.json"))) == 3


def test_a_roster_edited_to_repeat_a_key_is_refused_when_loaded(tmp_path):
    for r in range(3):
        keygen(str(tmp_path / f"s{r}"))
    write_roster([str(tmp_path / f"s{r}.pub") for r in (0, 1, 2)], str(tmp_path / "roster.json"))
    text = (tmp_path / "roster.json").read_text()
    one = load_roster(str(tmp_path / "roster.json"))[0].hex()
    two = load_roster(str(tmp_path / "roster.json"))[2].hex()
    (tmp_path / "roster.json").write_text(text.replace(two, one))
    with pytest.raises(InputError, match=r"roster.json: party 2 has the same public key .* as party 0"):
        load_roster(str(tmp_path / "roster.json"))


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660, 0o606])
def test_a_secret_key_not_private_to_its_owner_is_refused(tmp_path, mode):
    keygen(str(tmp_path / "site"))
    path = tmp_path / "site.key"
    assert path.stat().st_mode & 0o777 == 0o600
    load_signing_key(str(path))
    path.chmod(mode)
    with pytest.raises(InputError, match=rf"site.key: the party's signing key is accessible to others "
                                         rf"\(mode {mode:04o}\): it must be private to its owner \(chmod 600 "):
        load_signing_key(str(path))
    path.chmod(0o400)
    load_signing_key(str(path))


def test_the_run_identifier_depends_on_every_partys_nonce():
    nonces = [bytes([r]) * 32 for r in range(3)]
    base = run_identifier(nonces)
    for r in range(3):
        changed = list(nonces)
        changed[r] = bytes([9]) * 32
        assert run_identifier(changed) != base
    assert run_identifier(nonces[::-1]) != base
