"""The layout tables of the protocol docs are the ones their construct schemas give
(mqserver.layoutdoc): a schema edited without regenerating its doc fails here."""

import sys
from pathlib import Path

import pytest
from construct import Int8ul, Int16ul, Struct

from mqserver import layoutdoc
from mqserver.store import format as store_format
from protocols.nsq import wire as nsq_wire
from protocols.remoting import wire as remoting_wire
from protocols.smss import wire as smss_wire

ROOT = Path(__file__).resolve().parents[2]
DOCS = [
    ("docs/smss.md", smss_wire),
    ("docs/nsq.md", nsq_wire),
    ("docs/rocketmq-spec-notes.md", remoting_wire),
    ("docs/storage-format.md", store_format),
]


@pytest.mark.parametrize("doc, module", DOCS, ids=[d for d, _ in DOCS])
def test_doc_tables_match_the_schemas(doc, module):
    """Every table between schema markers is what its schema generates, and every schema
    the module lists for the doc has a table (run python -m mqserver.layoutdoc to fix)."""
    text = (ROOT / doc).read_text(encoding="utf-8")
    assert sorted(layoutdoc.shown(text)) == sorted(module.DOC_SCHEMAS)
    assert layoutdoc.render(text, module.DOC_SCHEMAS) == text


def test_a_changed_schema_changes_its_table(tmp_path, monkeypatch):
    """A table generated from one schema no longer matches after the schema changes, and
    --check says so; rewriting the document makes it match again."""
    doc = tmp_path / "doc.md"
    before = {"HEAD": Struct("code" / Int8ul * "the code", "size" / Int16ul)}
    doc.write_text(layoutdoc.render("<!-- schema: HEAD -->\n<!-- end schema -->\n", before))
    assert "| 1 | 2 | u16 | `size` |  |" in doc.read_text()
    after = {"HEAD": Struct("code" / Int16ul * "the code", "size" / Int16ul)}
    assert layoutdoc.render(doc.read_text(), after) != doc.read_text()
    # the command line, with the schemas of a module
    module = type(smss_wire)("fake_wire")
    module.DOC_SCHEMAS = after
    monkeypatch.setitem(sys.modules, "fake_wire", module)
    assert layoutdoc.main(["--check", str(doc), "fake_wire"]) == 1
    assert layoutdoc.main([str(doc), "fake_wire"]) == 0
    assert layoutdoc.main(["--check", str(doc), "fake_wire"]) == 0
    assert "| 2 | 2 | u16 | `size` |  |" in doc.read_text()
