"""msprobe_readers.report: the HTML report of hand-written dumps (L1, MindSpore cells) and, rendered in headless
Chromium, of a real 2-rank job (acceptance 4).

The Chromium test needs the Debian package: ``apt-get install -y chromium``; skipped without it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

from msprobe_readers.report import build_report

from .reader_util import NAN, count_color, dump_cli, e2e, fwd, launch_script, leaf, read_png, write_dump

CHROMIUM = next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)


def _screenshot(html: str, png: str, profile: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={profile}", f"--screenshot={png}", "--window-size=1200,900", "file://" + html],
        capture_output=True, text=True, timeout=120)


def test_report_of_an_l1_dump_with_nan(tmp_path):
    d = tmp_path / "dump"
    for step in range(2):
        for rank in range(2):
            bad = step == 1 and rank == 1
            write_dump(d / f"step{step}" / f"rank{rank}", {
                "Functional.linear.0.forward": fwd(leaf(mean=NAN if bad else 0.0)),
                "Functional.mse_loss.0.forward": fwd(leaf()),
                "Functional.linear.0.backward": {"input": [leaf()], "output": [leaf(norm=NAN if bad else 1.0 + rank)]},
            })
    html = tmp_path / "r.html"
    info = build_report(str(d), str(html), records=[r"mse_loss"], stats=["Max", "Norm"])
    text = html.read_text()
    assert info["first_nan"].label == "1" and "id='first-nan'" in text
    assert "backward outputs (no parameters_grad: L1 dump)" in text and ">NaN</text>" in text
    assert "<title>rank 0, Functional.linear.0: 1</title>" in text  # a backward record's layer: its call
    assert text.count('<svg class="series"') == 2  # one record, output leaf, two statistics
    assert "<script" not in text


def test_report_heat_map_names_mindspore_cells_by_path(tmp_path):
    d = tmp_path / "dump"
    for rank in range(2):
        write_dump(d / "step0" / f"rank{rank}", {
            "Cell.net.fc1.Dense.forward.0": fwd(leaf()),
            "Cell.net.fc2.Dense.parameters_grad.0": {"weight": [leaf(norm=3.0)], "bias": [leaf(norm=4.0)]},
            "Cell.net.fc1.Dense.parameters_grad.0": {"weight": [leaf(norm=1.0 + rank)]},
        }, header={"framework": "mindspore"})
    html = tmp_path / "r.html"
    build_report(str(d), str(html))
    text = html.read_text()
    # layers in forward order, named by the cell's path; the norm of a layer combines its parameters
    cells = re.findall(r"<title>rank (\d), ([^:<]+): ([^<]+)</title>", text)
    assert cells[:4] == [("0", "net.fc1", "1"), ("0", "net.fc2", "5"), ("1", "net.fc1", "2"), ("1", "net.fc2", "5")]
    assert "parameters_grad.0:" not in text


@e2e
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
