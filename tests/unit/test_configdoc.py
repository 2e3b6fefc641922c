"""docs/configuration.md is what the key sets of the core and of every front door say:
each key has a description, and the committed file equals the generated one."""

import os

from mqserver import cli
from mqserver.config import CORE, door_keysets
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
