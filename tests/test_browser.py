"""The lab's HTML report in a real browser: headless Chromium through selenium.

Needs `chromium` and `chromedriver` (Debian: `apt-get install -y chromium chromium-driver`) and
selenium (`pip install -e '.[browser]'`); without them the test is skipped, saying so. Set
GRAPHKERNEL_UPDATE_SCREENSHOT=1 to refresh docs/lab-report.png from this test's screenshot.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile

import pytest

from graphkernel.ir.dot import cluster_label
from graphkernel.tools.lab import run_lab
from graphkernel.tools.report import write_lab_report

pytestmark = pytest.mark.browser

INSTALL_HINT = ("install headless Chromium and its driver (`apt-get install -y chromium "
                "chromium-driver`) and selenium (`pip install -e '.[browser]'`)")
DOCS_SCREENSHOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                               "docs", "lab-report.png")
# Wide enough for the two graphs of a section to sit side by side, tall enough to show the
# conclusions, the overview and the first graph with its kernel tables.
WINDOW = (1400, 2000)


def _find(*names: str) -> str | None:
    for name in names:
        path = shutil.which(name)
        if path:
            return path
    return None


@pytest.fixture
def driver():
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.skip(f"selenium is not installed: {INSTALL_HINT}")
    browser = _find("chromium", "chromium-browser", "google-chrome")
    chromedriver = _find("chromedriver")
    if browser is None or chromedriver is None:
        missing = " and ".join(n for n, p in (("chromium", browser), ("chromedriver", chromedriver))
                               if p is None)
        pytest.skip(f"{missing} not found: {INSTALL_HINT}")
    profile = tempfile.mkdtemp(prefix="gk-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", f"--user-data-dir={profile}",
                 f"--window-size={WINDOW[0]},{WINDOW[1]}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    drv = webdriver.Chrome(service=Service(executable_path=chromedriver), options=options)
    drv.set_page_load_timeout(60)
    try:
        yield drv
    finally:
        drv.quit()
        shutil.rmtree(profile, ignore_errors=True)


# Per kernel table: the kernel times, the between-kernels row and the call (microseconds).
TABLE_TIMES_JS = """
const num = t => parseFloat(t.replace(/,/g, ''));
return Array.from(document.querySelectorAll('table.kernels')).map(table => ({
  kernels: Array.from(table.querySelectorAll('tbody tr:not(.between)'))
      .map(r => num(r.cells[r.cells.length - 1].textContent)),
  between: num(table.querySelector('tbody tr.between').lastElementChild.textContent),
  call: num(table.querySelector('tfoot td.call').textContent)}));
"""


def _kernels_fit_in_their_call(driver) -> None:
    """No kernel takes longer than the call it was timed in, and the rows add up to it."""
    tables = driver.execute_script(TABLE_TIMES_JS)
    assert len(tables) == 6  # fused and unfused per fusion-on section, one per fusion-off one
    for t in tables:
        assert t["kernels"] and all(0 < k <= t["call"] for k in t["kernels"]), t
        # Each shown to 0.1 us: the sum may be off by the rounding of each row.
        slack = 0.05 * (len(t["kernels"]) + 2)
        assert abs(sum(t["kernels"]) + t["between"] - t["call"]) <= slack, t


# Text of every cluster label in the second (processed) / first (initial) SVG of a section.
CLUSTER_LABELS_JS = """
const svgs = arguments[0].querySelectorAll('svg.graph-svg');
return Array.from(svgs).map(svg => Array.from(svg.querySelectorAll('g.cluster > text'))
    .map(t => t.textContent));
"""


def test_lab_report_in_headless_chromium(driver, tmp_path, monkeypatch):
    # From the folder it runs in, as README's `graphkernel lab --report lab_output/report.html`.
    monkeypatch.chdir(tmp_path)
    lab = run_lab("lab_output", echo=False)
    results, found = lab
    report = write_lab_report("lab_output", "lab_output/report.html", lab=lab, repeats=20)
    driver.get("file://" + os.path.abspath(report))

    severe = [e for e in driver.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]
    assert severe == [], severe
    # The log channel works: an error the page would print does arrive.
    driver.execute_script("console.error('gk-probe')")
    assert any("gk-probe" in e["message"] for e in driver.get_log("browser"))

    sections = driver.find_elements("css selector", "section.graph")
    # The lab report's order: each net with fusion on, then off.
    order = ["test_basic_fuse", "test_basic_fuse_no", "test_composite_fuse",
             "test_composite_fuse_no"]
    assert len(sections) == len(order)
    for section, name in zip(sections, order):
        exe = results[name].executable
        svgs = section.find_elements("css selector", "svg.graph-svg")
        assert len(svgs) == 2, name
        for svg in svgs:
            assert svg.size["width"] > 80 and svg.size["height"] > 80, (name, svg.size)
        # Side by side: same top, the processed graph to the right of the initial one.
        left, right = (s.find_element("xpath", "ancestor::figure") for s in svgs)
        assert abs(left.location["y"] - right.location["y"]) < 2, name
        assert right.location["x"] > left.location["x"] + left.size["width"] - 2, name
        initial_labels, final_labels = driver.execute_script(CLUSTER_LABELS_JS, section)
        # Every composite kernel that runs is a cluster labelled with its name, and only those.
        composites = sorted(cluster_label(n) for n in exe.stages["hwopt_d_end"].nodes
                            if n.subgraph is not None)
        assert sorted(final_labels) == composites, name
        initial_composites = sorted(cluster_label(n) for n in exe.stages["6_validate"].nodes
                                    if n.subgraph is not None)
        assert sorted(initial_labels) == initial_composites, name
    labels = driver.execute_script(CLUSTER_LABELS_JS, sections[0])[1]
    assert labels == ["Fused_Mul_Add_Mul"]
    labels = driver.execute_script(CLUSTER_LABELS_JS, sections[3])
    # The user's composite, fusion off: named as the user's, in both graphs.
    assert labels == [["user GraphKernel: Composite"], ["user GraphKernel: Composite"]]

    duplicate_ids = driver.execute_script("""
        const ids = Array.from(document.querySelectorAll('[id]')).map(e => e.id);
        return ids.filter((id, i) => ids.indexOf(id) !== i);""")
    assert duplicate_ids == []

    badges = [b.text for b in driver.find_elements("css selector", ".conclusion .badge")]
    assert badges == ["holds" if c.holds else "does not hold" for c in found]
    assert len(badges) == 3

    rows = sections[0].find_elements("css selector", "table.kernels.fused tbody tr:not(.between)")
    assert [r.find_elements("css selector", "td")[1].text for r in rows] == ["Fused_Mul_Add_Mul"]
    rows = sections[0].find_elements("css selector", "table.kernels.unfused tbody tr:not(.between)")
    assert len(rows) == 3
    _kernels_fit_in_their_call(driver)

    shot = tmp_path / "lab-report.png"
    assert driver.save_screenshot(str(shot))
    data = shot.read_bytes()
    assert data.startswith(b"\x89PNG") and len(data) > 20_000
    if os.environ.get("GRAPHKERNEL_UPDATE_SCREENSHOT") == "1":
        shutil.copy(shot, DOCS_SCREENSHOT)


def test_readme_lab_command_leaves_a_report_the_browser_loads(driver, tmp_path):
    """README's main command, as a user runs it from a fresh clone (the venv's own script)."""
    script = os.path.join(os.path.dirname(sys.executable), "graphkernel")
    proc = subprocess.run([script, "lab", "--out", "lab_output"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == "report: lab_output/report.html"
    driver.get("file://" + str(tmp_path / "lab_output" / "report.html"))
    severe = [e for e in driver.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]
    assert severe == [], severe
    assert len(driver.find_elements("css selector", "section.graph")) == 4
    assert len(driver.find_elements("css selector", "section.graph svg.graph-svg")) == 8
    _kernels_fit_in_their_call(driver)
