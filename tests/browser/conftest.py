"""A real headless Chromium driven through Selenium (Debian's ``chromium`` and ``chromium-driver``,
installed by ``make test``), against pytest-django's live server, a real worker and a monitor."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.common.exceptions import WebDriverException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import WebDriverWait

from tests.processes import running, start_monitor, start_worker, wait_worker_ready

CHROMIUM = os.environ.get("TMS_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("TMS_CHROMEDRIVER", "/usr/bin/chromedriver")
#: Flags for a quiet, self-contained headless browser: no sandbox (containers run as root), no
#: GPU, no /dev/shm (small in containers), and nothing that phones home or updates itself.
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--window-size=1440,1000",
)


#: A phone's viewport (CSS pixels), as the back office must work on it.
PHONE = (390, 844)


def make_browser(profile: Path, *, window: str | None = None, phone: bool = False) -> WebDriver:
    """A headless Chromium with a fresh profile in ``profile``; fails the test if it is missing.
    ``phone``: a phone's viewport (:data:`PHONE`, touch, the page's viewport meta honoured), by
    Chromium's device emulation (a headless window cannot be narrower than 500 px)."""
    missing = [path for path in (CHROMIUM, CHROMEDRIVER) if not os.access(path, os.X_OK)]
    if missing:
        pytest.fail(
            f"{', '.join(missing)} not found: the browser tests need Debian's chromium and chromium-driver "
            "(`make test` installs them; or `apt-get install -y chromium chromium-driver` as root)."
        )
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    if window:
        options.add_argument(f"--window-size={window}")
    if phone:
        width, height = PHONE
        metrics = {"width": width, "height": height, "pixelRatio": 2, "mobile": True, "touch": True}
        options.add_experimental_option("mobileEmulation", {"deviceMetrics": metrics})
    options.add_argument(f"--user-data-dir={profile}")
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(60)
    return driver


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[WebDriver]:
    driver = make_browser(tmp_path / "chromium-profile")
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def phone_browser(tmp_path: Path) -> Iterator[WebDriver]:
    driver = make_browser(tmp_path / "chromium-phone-profile", phone=True)
    try:
        yield driver
    finally:
        driver.quit()


@contextmanager
def platform_running() -> Iterator[None]:
    """A real worker and monitor on this test's database and queue, for the ``with`` block."""
    worker, monitor = start_worker(concurrency=2), start_monitor()
    with running(worker, monitor):
        wait_worker_ready(worker)
        yield


@pytest.fixture
def platform() -> Iterator[None]:
    """:func:`platform_running` for the whole test."""
    with platform_running():
        yield


def log_in(driver: WebDriver, base_url: str, username: str, password: str) -> None:
    """Log in through the login form, as a person does."""
    driver.get(f"{base_url}/ui/login/")
    driver.find_element(By.NAME, "username").send_keys(username)
    driver.find_element(By.NAME, "password").send_keys(password)
    driver.find_element(By.CSS_SELECTOR, "form button[type=submit]").click()
    WebDriverWait(driver, 20).until(ec.presence_of_element_located((By.CSS_SELECTOR, ".topbar .who")))


def submit_and_wait(driver: WebDriver, button_css: str, css: str, timeout: float = 20) -> None:
    """Click ``button_css`` and wait for the next page, then for ``css`` on it.

    The old page is marked through JavaScript rather than watched with ``staleness_of``: asking the
    driver about an element of a page being torn down can fail inside Chromium ("unhandled inspector
    error"), and did in CI. A mark on ``window`` goes with the page, and is read from the new one.
    """
    driver.execute_script("window.__tmsOldPage = true;")
    driver.find_element(By.CSS_SELECTOR, button_css).click()

    def new_page(d: WebDriver) -> bool:
        try:
            return not d.execute_script("return window.__tmsOldPage === true;")
        except WebDriverException:  # asked mid-navigation: ask again
            return False

    WebDriverWait(driver, timeout).until(new_page)
    WebDriverWait(driver, timeout).until(ec.presence_of_element_located((By.CSS_SELECTOR, css)))


def wait_text(driver: WebDriver, css: str, text: str, timeout: float = 60) -> None:
    """Wait until the element at ``css`` reads ``text`` (across live refreshes and reloads)."""

    def reads(d: WebDriver) -> bool:
        try:
            return d.find_element(By.CSS_SELECTOR, css).text.strip() == text
        except Exception:  # noqa: BLE001 - swapped out by a refresh between find and read
            return False

    WebDriverWait(driver, timeout, poll_frequency=0.25).until(reads, f"{css} never read {text!r}")
