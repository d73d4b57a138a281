"""A headless Chromium driving the console, and the steps every browser test takes in it."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


async def in_browser(step: Callable[[], T]) -> T:
    """A blocking Selenium step, off the event loop that serves opgate."""
    return await asyncio.to_thread(step)


def navigate(driver: Any, action: Callable[[], object]) -> None:
    """Do what leaves the page (a click, a form submission) and wait, bounded, until the next
    page has replaced it and loaded: a click returns before the browser has navigated.

    The old page is marked with a window property a new document cannot have. (Waiting for an
    old element to go stale is not enough: while the page unloads, Chromium may answer the
    staleness probe with "Node with given id does not belong to the document", an unknown
    error rather than a stale reference.)"""
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.support.ui import WebDriverWait

    marker = secrets.token_hex(8)
    driver.execute_script("window.opgateTestPage = arguments[0];", marker)
    action()

    def replaced(d: Any) -> bool:
        return bool(
            d.execute_script(
                "return window.opgateTestPage === undefined && document.readyState === 'complete';"
            )
        )

    # while the old document unloads, a script may fail to run: that is "not yet"
    WebDriverWait(driver, 15, ignored_exceptions=(WebDriverException,)).until(replaced)


def click(driver: Any, element: Any) -> None:
    navigate(driver, element.click)


def sign_in(driver: Any, base: str, token: str, identity: str) -> None:
    from selenium.webdriver.common.by import By

    driver.get(f"{base}/console/login")
    driver.find_element(By.ID, "identity").send_keys(identity)
    driver.find_element(By.ID, "token").send_keys(token)
    click(driver, driver.find_element(By.ID, "sign-in"))
