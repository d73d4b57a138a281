"""The console tests' real headless browser (the browser tests' ``chrome`` fixture)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.console.helpers import CHROMEDRIVER, CHROMIUM


@pytest.fixture
def chrome() -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for argument in (
        "--headless=new",
        "--no-sandbox",  # as root in a container; the browser only ever opens loopback pages
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1360,860",
        "--no-first-run",
        "--disable-extensions",
    ):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()
