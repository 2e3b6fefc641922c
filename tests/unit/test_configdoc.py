"""docs/configuration.md is what the key sets of the core and of every front door say:
each key has a description, and the committed file equals the generated one."""

import os
import re

import pytest

from mqserver import cli
from mqserver.config import CORE, SMSS_ONLY, UNUSED, ConfigError, build_config, door_keysets
from mqserver.configdoc import reference
from mqserver.frontdoor import front_doors

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOC = os.path.join(ROOT, "docs", "configuration.md")


def test_every_key_says_what_it_does():
    for keyset in [CORE] + door_keysets(front_doors()):
        assert set(keyset.docs) == set(keyset.keys), keyset.owner
        assert all(keyset.docs.values()), keyset.owner


def test_committed_reference_is_the_generated_one():
    """Regenerate with: mqserver config --reference > docs/configuration.md"""
    with open(DOC) as f:
        committed = f.read()
    assert committed == reference(front_doors())


def test_reference_lists_every_key_door_and_default():
    text = reference(front_doors())
    for keyset in [CORE] + door_keysets(front_doors()):
        for key in keyset.keys:
            assert f"| `{key}` |" in text, key
    for name, door in front_doors().items():
        assert f"| `{name}` | `{door.default_endpoint}` |" in text
    assert ("| `store.maxDays` | integer | `7` | >= 0 (0 keeps files forever) | retention of "
            "sealed segments, days |") in text
    assert "`time.server.alive` for `timeout.server.alive`" in text


def test_mqserver_config_reference_prints_it(capsys):
    assert cli.main(["config", "--reference"]) == 0
    assert capsys.readouterr().out == reference(front_doors())


def _code():
    """path -> text of every module of the broker and its doors."""
    out = {}
    for top in ("mqserver", "protocols"):
        for d, _, files in os.walk(os.path.join(ROOT, top)):
            out.update({os.path.join(d, f): open(os.path.join(d, f)).read()
                        for f in files if f.endswith(".py")})
    return out


def test_every_key_is_read_or_documented_as_accepted_and_unused():
    """A key the code never reads outside the module declaring it is one smss's
    config.yaml has, documented as accepted for compatibility and what smss does with
    it; one the code reads is not documented so."""
    code = _code()
    for keyset in [CORE] + door_keysets(front_doors()):
        own = os.path.join(ROOT, *("mqserver.config" if keyset.owner == "mqserver"
                                   else keyset.owner).split(".")) + ".py"
        for key in keyset.keys:
            literal = re.compile(r"[\"']%s[\"']" % re.escape(key))
            read = any(literal.search(text) for path, text in code.items() if path != own)
            doc = keyset.docs[key]
            assert read != doc.startswith(UNUSED), (keyset.owner, key, doc)
            if not read:
                assert len(doc) > len(UNUSED) + 10, key  # says what smss does with it


def test_smss_keys_mqserver_does_not_read_are_still_accepted():
    """A config written for smss starts mqserver: its keys are validated, not refused."""
    assert set(SMSS_ONLY) <= set(build_config().values)
    config = build_config({"log": {"sample": 5, "withGid": False},
                           "background": {"life": {"defaultScanSec": 60}}})
    assert config["log.sample"] == 5 and config["background.defaultScanSecond"] == 60


def test_log_level_is_not_a_key():
    """log.level was never read (twistd sets what is logged): it is refused as unknown."""
    with pytest.raises(ConfigError, match="log.level"):
        build_config({"log": {"level": "debug"}})
