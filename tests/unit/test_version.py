"""One version: setup.cfg's, read from the installed package's metadata, with the
package's constant as the fallback when it is not installed."""

import configparser
import os
from importlib import metadata

import mqserver
from mqserver import version as version_module

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def setup_cfg_version():
    cfg = configparser.ConfigParser()
    cfg.read(os.path.join(ROOT, "setup.cfg"))
    return cfg["metadata"]["version"]


def test_the_fallback_constant_is_setup_cfg_version():
    """mqserver.__version__ (used when the package is not installed) never drifts from
    setup.cfg."""
    assert mqserver.__version__ == setup_cfg_version()


def test_version_is_the_installed_distribution_version():
    """version() answers what the package's metadata says."""
    version_module.version.cache_clear()
    assert version_module.version() == metadata.version("mqserver")


def test_version_falls_back_to_the_constant_when_not_installed(monkeypatch):
    """A source tree run without installing still has a version."""
    version_module.version.cache_clear()
    monkeypatch.setattr(version_module, "DISTRIBUTION", "mqserver-not-installed-here")
    try:
        assert version_module.version() == mqserver.__version__
    finally:
        version_module.version.cache_clear()
