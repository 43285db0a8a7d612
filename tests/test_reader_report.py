"""msprobe-dump report renders in headless Chromium (acceptance 4).

Needs the Debian package: ``apt-get install -y chromium``; skipped without it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest
from launch_util import runtime_available
from reader_util import count_color, dump_cli, launch_script, read_png

CHROMIUM = next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(not runtime_available(), reason="the in-rank runtime (msprobe_inject.zero_code) is missing"),
]


def _screenshot(html: str, png: str, profile: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={profile}", f"--screenshot={png}", "--window-size=1200,900", "file://" + html],
        capture_output=True, text=True, timeout=120)


def test_report_renders_in_headless_chromium(tmp_path):
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (Debian: apt-get install -y chromium)")
    dump, _ = launch_script(tmp_path, "perturb_grad.py")
    html = str(tmp_path / "report.html")
    proc = dump_cli(["report", dump, "-o", html], tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "first cross-rank departure: rank 1, step 1" in proc.stdout
    with open(html, encoding="utf-8") as fh:
        text = fh.read()
    # self-contained: no script, nothing loaded from elsewhere
    assert "<script" not in text and not re.search(r"""(?:src|href)\s*=\s*["']?(?:https?:|//|file:)""", text)
    assert text.count('<svg class="heatmap"') >= 2 and text.count('<svg class="series"') >= 4
    assert "id='first-departure'" in text and "module.fc2.weight" in text
    assert "module.fc1" in text and "module.fc2" in text  # heat map columns: layers

    png = str(tmp_path / "shot.png")
    shot = _screenshot(html, png, str(tmp_path / "profile"))
    assert shot.returncode == 0 and os.path.isfile(png), shot.stderr[-2000:]
    assert os.path.getsize(png) > 10_000
    img = read_png(png)
    assert img.shape == (900, 1200, 3)
    assert (img < 235).any(axis=2).mean() > 0.05  # not a blank page
    # drawn, not just present in the file: the orange divergence box and the heat-map cells on the first screen
    assert count_color(img, (255, 127, 14)) > 150
    viridis = [(68, 1, 84), (253, 231, 37), (33, 145, 140), (72, 40, 120), (180, 222, 44)]
    assert sum(count_color(img, c, tol=40) for c in viridis) > 2000
