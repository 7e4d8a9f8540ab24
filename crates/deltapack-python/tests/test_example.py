"""The page-pool example runs (so it cannot rot)."""

import subprocess
import sys

from conftest import ROOT


def test_page_pool_example(tmp_path):
    p = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "python" / "page_pool.py"), f"file://{tmp_path / 's'}"],
        capture_output=True, text=True, timeout=120,
    )
    assert p.returncode == 0, p.stderr
    assert "every page is in its slot, bit-exact" in p.stdout
