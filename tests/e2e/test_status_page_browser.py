"""The status page in a real headless browser: a real daemon holds a job while a protected
program uses the (stand-in) GPU, and the page a person would open shows the job, that it is
held, and why.  Skipped where Debian's chromium and its driver are not installed, unless
``ARBITER_REQUIRE`` names ``browser`` (as .ci/run sets it once it installed them)."""

from __future__ import annotations

import os
import shutil
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from arbiter_testing.needs import need
from arbiter_testing.node import PYTHON, HarnessNode

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Any]:
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.exists()]
    if missing:
        need("browser", f"{' and '.join(missing)} not installed (Debian: apt-get install chromium chromium-driver)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        "--window-size=1400,1800",
        f"--user-data-dir={tmp_path / 'chromium-profile'}",
    ):
        options.add_argument(arg)
    service = Service(executable_path=str(CHROMEDRIVER), log_output=str(tmp_path / "chromedriver.log"))
    driver = webdriver.Chrome(service=service, options=options)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


def held_row(driver: Any, job_id: str, code: str) -> dict[str, str] | None:
    """The job's row as the browser rendered it, once it shows the reason's code."""
    from selenium.webdriver.common.by import By

    for row in driver.find_elements(By.CSS_SELECTOR, "section#jobs table.jobs tbody tr"):
        cells = row.find_elements(By.TAG_NAME, "td")
        if len(cells) == 6 and job_id in cells[0].text:
            codes = [c.text for c in cells[5].find_elements(By.CSS_SELECTOR, ".code")]
            if code in codes:
                return {"state": cells[1].text, "why": cells[5].text}
    return None


def save_screenshot(driver: Any, tmp_path: Path, name: str = "status-page.png") -> Path:
    shot = tmp_path / name
    assert driver.save_screenshot(str(shot)), "the browser could not take a screenshot"
    artifacts = os.environ.get("ARBITER_ARTIFACTS")
    if artifacts:
        Path(artifacts).mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, Path(artifacts) / shot.name)
    return shot


def test_the_status_page_shows_a_held_job_and_why_in_a_real_browser(
    node: HarnessNode, tmp_path: Path, browser: Any
) -> None:
    from PIL import Image
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.support.wait import WebDriverWait

    node.add_rule(
        "prot",
        {
            "id": "prot",
            "priority": 50,
            "match": {
                "cmdline": [f"arbiter.demo.protected --events {tmp_path / 'p.jsonl'}"]
            },  # this test's stand-in alone
            "protect": {"metric": "gpu_share"},
        },
    )
    node.start()
    node.spawn([PYTHON, "-m", "arbiter.demo.protected", "--events", str(tmp_path / "p.jsonl")])
    node.wait_for(lambda: node.status()["rules"][0]["using_gpu"], timeout=30)
    node.job_run([PYTHON, "-m", "arbiter.demo.job", "--plain"], "--name", "plain")
    (reason,) = [
        r for r in node.reasons("plain", "PROTECTED_GPU_BUSY", timeout=30) if r["code"] == "PROTECTED_GPU_BUSY"
    ]
    job = node.known_job("plain")

    browser.get(node.info()["http"] + "/")
    # the page refreshes itself: a row read mid-refresh goes stale and is read again
    row = WebDriverWait(browser, 30, poll_frequency=0.2, ignored_exceptions=(StaleElementReferenceException,)).until(
        lambda d: held_row(d, job["id"], "PROTECTED_GPU_BUSY")
    )
    assert row is not None  # until() answers the first row found
    assert row["state"].split()[0] in ("held", "paused")
    assert "protected program 'prot' uses the GPU" in row["why"]  # the message; its share moves between reads
    assert reason["remedy"] in row["why"]
    assert "arbiter" in browser.title
    try:  # what the page's A/B images ask for: the daemon's provider draws plots (no run here: 404)
        urllib.request.urlopen(node.info()["http"] + "/v1/ab/no-such-run/plot", timeout=10)
    except urllib.error.HTTPError as exc:
        assert exc.code == 404, exc.read()
    else:
        raise AssertionError("an unknown run's plot was served")

    # the job's id links to its history: the timeline with its entries alone
    from selenium.webdriver.common.by import By

    WebDriverWait(browser, 30, poll_frequency=0.2, ignored_exceptions=(StaleElementReferenceException,)).until(
        lambda d: d.find_element(By.LINK_TEXT, job["id"])
    ).click()
    WebDriverWait(browser, 30, poll_frequency=0.2, ignored_exceptions=(StaleElementReferenceException,)).until(
        lambda d: "JOB_HELD" in d.find_element(By.CSS_SELECTOR, "section#timeline").text
    )
    history = browser.find_element(By.CSS_SELECTOR, "section#timeline").text
    assert f"only {job['id']}" in history and "PROTECTION_GPU_ON" not in history  # the tenant's entry is not its
    assert "gpu_jobs: when_no_gpu_protected" in browser.find_element(By.CSS_SELECTOR, "section#budget").text

    # the GPU share over time: the protected program's line and the jobs' total, drawn inline
    def share_lines(d: Any) -> set[str] | None:
        lines = d.find_elements(By.CSS_SELECTOR, "section#gpu figure.shares svg.share-chart polyline.share-line")
        tenants = {line.get_attribute("data-tenant") for line in lines}
        return tenants if {"prot", "jobs"} <= tenants else None

    assert WebDriverWait(browser, 30, poll_frequency=0.2, ignored_exceptions=(StaleElementReferenceException,)).until(
        share_lines
    ) == {"prot", "jobs"}
    chart = browser.find_element(By.CSS_SELECTOR, "section#gpu svg.share-chart")
    assert chart.size["width"] > 300 and chart.size["height"] > 100  # rendered, not just in the markup
    caption = browser.find_element(By.CSS_SELECTOR, "section#gpu figcaption").text
    assert "GPU share per tenant" in caption and "prot " in caption and "jobs " in caption

    shot = save_screenshot(browser, tmp_path)
    print(f"\nscreenshot: {shot}")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with Image.open(shot) as image:
        assert image.width >= 800 and image.height >= 600
        colours = image.convert("RGB").getcolors(maxcolors=1 << 16)
        assert colours is None or len(colours) > 20, "the screenshot is (nearly) blank"
