"""What the broker loads before any client asks for it (its idle resident size,
bench/idle_rss.py)."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(code):
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, env=dict(os.environ, PYTHONPATH=ROOT))
    assert done.returncode == 0, done.stderr


def test_cramjam_loaded_only_when_a_stream_needs_it():
    """The NSQ door does not load cramjam (about 1.5 MB resident) until a client
    negotiates snappy; then the codec works as before."""
    _run(
        "import sys\n"
        "import protocols.nsq.factory, protocols.nsq.protocol\n"
        "assert 'cramjam' not in sys.modules, 'cramjam loaded at import'\n"
        "from protocols.nsq.compress import SnappyCompressor, SnappyDecompressor\n"
        "data = SnappyCompressor().compress(b'abc' * 100)\n"
        "assert SnappyDecompressor().decompress(data) == b'abc' * 100\n"
        "assert 'cramjam' in sys.modules\n"
    )
