"""The dashboard in headless Chromium against a real `fxcc serve`: it loads, shows a job a test
submitted while it compiles, then shows it finish. With FXCC_DASHBOARD_SCREENSHOT=path it saves a
screenshot there (docs/dashboard.png in the README came from this test)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from fxcc.client.demo import free_port, wait_healthy
from fxcc.compiler_core.wire import CompileRequest, GraphSpec, Node, NodeRef, Placeholder, TensorSpec

pytestmark = pytest.mark.e2e

CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")


@pytest.fixture
def browser():
    if not (CHROMIUM and CHROMEDRIVER):
        pytest.fail("the dashboard test needs Debian's chromium and chromium-driver "
                    "(`make test` installs them when run as root)", pytrace=False)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage", "--window-size=1280,800"):
        opts.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    yield driver
    driver.quit()


@pytest.fixture
def service(tmp_path):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("FXCC_")}
    # The embedded default on loopback; each compile held 3 s so the page can show it running.
    env.update(TRITON_INTERPRET="1", FXCC_DATA_DIR=str(tmp_path / "data"),
               FXCC_TEST_ONLY_COMPILE_DELAY_S="3")
    log = (tmp_path / "serve.log").open("w")
    proc = subprocess.Popen([sys.executable, "-m", "fxcc.client.cli", "serve", "--port", str(port)],
                            env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc)
        yield url
    finally:
        proc.terminate()
        proc.wait(20)
        log.close()


def _request() -> str:
    spec = TensorSpec(dtype="float32", sizes=[64, 8], strides=[8, 1])
    graph = GraphSpec(placeholders=[Placeholder(name="x", spec=spec)],
                      nodes=[Node(name="s", target="aten.sin.default", args=[NodeRef(name="x")]),
                             Node(name="c", target="aten.cos.default", args=[NodeRef(name="s")])],
                      outputs=[NodeRef(name="c")])
    return CompileRequest(graph=graph).model_dump_json()


def test_dashboard_shows_a_job_compile_and_finish(browser, service, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(service + "/")
    from selenium.common.exceptions import StaleElementReferenceException

    # The page redraws its tables every second: an element read mid-redraw is stale, not wrong.
    wait = WebDriverWait(browser, 30, poll_frequency=0.1, ignored_exceptions=[StaleElementReferenceException])
    wait.until(lambda d: "store: embedded" in d.find_element(By.ID, "store").text)

    answer = httpx.post(f"{service}/v1/compile", content=_request(),
                        headers={"Content-Type": "application/json"}, timeout=30).json()
    job = answer["job_id"]
    row = f'tr[data-job="{job}"] td.state'
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, row)
               and d.find_element(By.CSS_SELECTOR, row).text in ("queued", "running"))
    wait.until(lambda d: d.find_element(By.CSS_SELECTOR, row).text == "done")
    cells = wait.until(lambda d: d.find_element(By.CSS_SELECTOR, f'tr[data-job="{job}"]').text)
    assert answer["key"][:12] in cells and "embedded" in cells
    assert browser.find_element(By.ID, "error").text == ""
    shot = Path(os.environ.get("FXCC_DASHBOARD_SCREENSHOT") or tmp_path / "dashboard.png")
    assert browser.save_screenshot(str(shot))


def test_dashboard_lists_the_build_tasks_of_a_job_clicked(browser, service):
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    from fxcc.compiler_core.build import cuda_build_unavailable
    from tests.worker.test_builds import OPS, many_kernels

    if cuda_build_unavailable() is not None:
        pytest.skip(cuda_build_unavailable())
    answer = httpx.post(f"{service}/v1/compile", content=many_kernels(OPS[:2]).model_dump_json(),
                        headers={"Content-Type": "application/json"}, timeout=30).json()
    job = answer["job_id"]
    browser.get(service + "/")
    wait = WebDriverWait(browser, 120, poll_frequency=0.1, ignored_exceptions=[StaleElementReferenceException])
    row = f'tr[data-job="{job}"]'
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, row + " td.state")
               and d.find_element(By.CSS_SELECTOR, row + " td.state").text == "done")
    browser.find_element(By.CSS_SELECTOR, row).click()
    wait.until(lambda d: job.upper() in d.find_element(By.ID, "taskjob").text.upper())  # h2s are upper case
    cells = wait.until(lambda d: (rows := d.find_elements(By.CSS_SELECTOR, "#tasks tbody tr")) and len(rows) == 2
                       and [r.text for r in rows])
    tasks = httpx.get(f"{service}/v1/jobs/{job}/tasks", timeout=30).json()
    assert len(tasks) == 2
    for task in tasks:  # each task's kernel and the build consumer that ran it are on the page
        assert any(task["name"] in text and task["worker"] in text and "done" in text for text in cells), cells
    assert browser.find_element(By.ID, "error").text == ""


def test_each_job_has_a_page_showing_its_compile(browser, service, tmp_path):
    """The compile explorer: a job's row opens its page (#job=<id>) with its stages, kernels (source,
    config), extern calls and the compile's stage log; the overview charts the finished compile."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    answer = httpx.post(f"{service}/v1/compile", content=_request(),
                        headers={"Content-Type": "application/json"}, timeout=30).json()
    job = answer["job_id"]
    browser.get(service + "/")
    wait = WebDriverWait(browser, 60, poll_frequency=0.1, ignored_exceptions=[StaleElementReferenceException])
    row = f'tr[data-job="{job}"]'
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, row + " td.state")
               and d.find_element(By.CSS_SELECTOR, row + " td.state").text == "done")
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#compilechart svg rect"))  # the job, on the hour's chart
    browser.find_element(By.CSS_SELECTOR, row).click()
    wait.until(lambda d: d.find_element(By.ID, "jobview").is_displayed() and not d.find_element(By.ID, "overview").is_displayed())
    assert browser.current_url.endswith(f"#job={job}")
    explorer = httpx.get(f"{service}/v1/jobs/{job}/explorer", timeout=30).json()
    [kernel] = explorer["kernels"]
    wait.until(lambda d: kernel["name"] in d.find_element(By.CSS_SELECTOR, "#kernels tbody").text)
    assert "lowering" in browser.find_element(By.ID, "jobstages").text
    assert "none" in browser.find_element(By.ID, "jobexterns").text  # sin and cos fuse: no extern call
    details = browser.find_element(By.CSS_SELECTOR, f'details.kernel[data-kernel="{kernel["name"]}"]')
    details.find_element(By.TAG_NAME, "summary").click()
    source = details.find_element(By.TAG_NAME, "pre").text
    assert "@triton.jit" in source and f"def {kernel['name']}(" in source
    schedule = browser.find_element(By.CSS_SELECTOR, 'details.stage[data-stage="schedule"] pre').text
    assert "kernel (pointwise, x=512" in schedule and "stores: buf0" in schedule  # sin and cos: one kernel
    graph = browser.find_element(By.CSS_SELECTOR, 'details.stage[data-stage="graph"]')
    graph.find_element(By.TAG_NAME, "summary").click()
    assert "aten.cos.default(s)" in graph.find_element(By.TAG_NAME, "pre").text
    assert browser.find_element(By.ID, "error").text == ""
    browser.execute_script("window.scrollTo(0, 0)")
    shot = Path(os.environ.get("FXCC_EXPLORER_SCREENSHOT") or tmp_path / "explorer.png")
    assert browser.save_screenshot(str(shot))
    browser.find_element(By.CSS_SELECTOR, "a.back").click()
    wait.until(lambda d: d.find_element(By.ID, "overview").is_displayed())
