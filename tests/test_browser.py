"""A student's session in a real browser: JupyterLab, headless Chromium, notebooks 01, 03, 15.

Notebook 03 is opened as stored: its interactive widget must show as a figure (an image in
the page) before anything runs, not as widget text; in the same page, notebook 15's figure of
its two traces side by side must show as an image too. Notebook 01 is opened as stored, then all
its cells run from the Run menu; the test presses the training panel's Run button after Run All
(the notebook's last cell has shut its cluster down) and once more, and waits each time for the
progress bar to reach 100 % and the curves to appear. A screenshot of every step is saved under
``$SCALEDL_ARTIFACTS`` (else the test's tmp_path) and the folder is printed. It needs Debian's
``chromium`` and ``chromium-driver`` (.ci/run installs them) and is skipped without them;
Selenium is pointed at both, so it never downloads a browser.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
REPO = Path(__file__).resolve().parents[1]
NOTEBOOK = "01_data_parallel.ipynb"
WIDGET_NOTEBOOK = "03_async_sgd.ipynb"  # an interact_manual panel (scaledl_lab.viz.static)
TRACE_NOTEBOOK = "15_traces.ipynb"  # the two traces' static figure

pytestmark = [
    pytest.mark.browser,
    pytest.mark.timeout(1200),  # ~2.5 min on an idle 2-core machine; generous for a busy one
    pytest.mark.skipif(
        not (CHROMIUM.exists() and CHROMEDRIVER.exists()),
        reason="needs Debian's chromium and chromium-driver "
        "(apt-get install chromium chromium-driver; .ci/run installs them)",
    ),
]
webdriver = pytest.importorskip("selenium.webdriver", reason="needs selenium (the [test] extra)")
pytest.importorskip("jupyterlab", reason="needs jupyterlab (the [test] extra)")

# Lab settings for a quiet, predictable page: no news pop-up, every cell kept in the page.
SETTINGS = {
    "@jupyterlab/apputils-extension/notification": {"fetchNews": "false"},
    "@jupyterlab/notebook-extension/tracker": {"windowingMode": "none"},
}

# The training panel's state, read from the page: its Run button, progress bar, curves, status.
PANEL_JS = """
const buttons = [...document.querySelectorAll('.jp-Notebook .widget-button')];
if (!buttons.length) return null;
const out = buttons[0].closest('.jp-OutputArea-output');
const bar = out.querySelector('.progress-bar');
const img = out.querySelector('img.widget-image');
const status = out.querySelector('.widget-html-content');
return {
  panels: buttons.length,
  button: buttons[0].textContent.trim(),
  disabled: buttons[0].disabled,
  progress: bar ? bar.style.width : null,
  curves: img ? img.naturalWidth > 0 && getComputedStyle(img).display !== 'none' : false,
  status: status ? status.textContent : '',
};
"""

# The code cells' prompts ("[3]:", "[*]:", "[ ]:") and any traceback in their outputs.
CELLS_JS = """
return {
  prompts: [...document.querySelectorAll('.jp-CodeCell .jp-InputArea-prompt')]
    .map(p => p.textContent.trim()),
  errors: [...document.querySelectorAll('.jp-OutputArea-output')]
    .map(o => o.textContent).filter(t => t.includes('Traceback')).map(t => t.slice(-1000)),
};
"""


# Scroll the cell that creates the training panel to the top of the notebook.
SCROLL_JS = """
const cell = [...document.querySelectorAll('.jp-CodeCell')]
  .find(c => c.querySelector('.jp-InputArea').textContent.includes('TrainingPanel(client'));
if (cell) cell.scrollIntoView({block: 'start'});
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(what: str, check: Callable[[], Any], timeout: float, state: Callable[[], Any]) -> Any:
    """Poll ``check`` until it returns something true; on timeout say what the page showed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = check()
        if result:
            return result
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}; page: {state()}")


def _api(base: str, token: str, path: str, method: str = "GET") -> Any:
    request = urllib.request.Request(
        f"{base}{path}", method=method, headers={"Authorization": f"token {token}"}
    )
    with urllib.request.urlopen(request, timeout=10) as reply:
        body = reply.read()
    return json.loads(body) if body else None


@pytest.fixture
def artefacts(tmp_path: Path) -> Path:
    root = os.environ.get("SCALEDL_ARTIFACTS")
    folder = Path(root) / "browser" if root else tmp_path / "screenshots"
    folder.mkdir(parents=True, exist_ok=True)
    print(f"\nbrowser test artefacts (screenshots, logs): {folder}")
    return folder


@pytest.fixture
def lab(tmp_path: Path, artefacts: Path) -> Iterator[tuple[str, str]]:
    """JupyterLab on a free localhost port with a random token, serving copies of notebooks 01
    and 03 in quick mode; its kernels are shut down and the server stopped afterwards."""
    root, home = tmp_path / "lab", tmp_path / "home"
    root.mkdir()
    for name in (NOTEBOOK, WIDGET_NOTEBOOK, TRACE_NOTEBOOK):
        shutil.copy(REPO / "notebooks" / name, root / name)
    for name, values in SETTINGS.items():
        path = home / "settings" / f"{name}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))
    port, token = _free_port(), secrets.token_hex(16)
    env = {
        **os.environ,
        "SCALEDL_QUICK": "1",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        # The kernel spec runs `python`: make it this interpreter.
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]),
        "JUPYTERLAB_SETTINGS_DIR": str(home / "settings"),
        "JUPYTERLAB_WORKSPACES_DIR": str(home / "workspaces"),
        "JUPYTER_RUNTIME_DIR": str(home / "runtime"),
        "JUPYTER_CONFIG_DIR": str(home / "config"),
    }
    log = (artefacts / "jupyterlab.log").open("w")
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--allow-root"]  # CI is root
        + [f"--ServerApp.{k}={v}" for k, v in {"ip": "127.0.0.1", "port": port}.items()]
        + ["--ServerApp.port_retries=0", f"--ServerApp.root_dir={root}"]
        + [f"--IdentityProvider.token={token}"],
        cwd=root,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group, so nothing it starts outlives the test
    )
    base = f"http://127.0.0.1:{port}"
    try:

        def up() -> bool:
            assert server.poll() is None, f"JupyterLab exited; see {log.name}"
            try:
                return _api(base, token, "/api/status") is not None
            except OSError:
                return False

        _wait("JupyterLab to start", up, 120, lambda: log.name)
        yield base, token
    finally:
        try:
            for kernel in _api(base, token, "/api/kernels"):
                _api(base, token, f"/api/kernels/{kernel['id']}", method="DELETE")
        except OSError:
            pass
        try:  # the server's own shutdown: SIGINT asks for a confirmation it never gets here
            _api(base, token, "/api/shutdown", method="POST")
        except OSError:
            server.send_signal(signal.SIGTERM)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            pass
        try:  # whatever the server started and left behind (a kernel, Dask workers)
            os.killpg(server.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        server.wait()
        log.close()


@pytest.fixture
def browser(artefacts: Path) -> Iterator[Any]:
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in (
        "--headless=new",
        "--no-sandbox",  # CI runs as root
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1400,1000",
    ):
        options.add_argument(arg)
    # A driver path given to the service: Selenium Manager is never run, nothing is downloaded.
    service = Service(str(CHROMEDRIVER), log_output=str(artefacts / "chromedriver.log"))
    driver = webdriver.Chrome(options=options, service=service)
    try:
        yield driver
    finally:
        driver.quit()


# Run All of notebook 01 in the browser, then its panel twice: ~2.5 min idle, 6.5 min loaded;
# notebook 03's case below starts JupyterLab and Chromium in every suite.
@pytest.mark.slow
def test_notebook_01_in_jupyterlab(lab: tuple[str, str], browser: Any, artefacts: Path) -> None:
    from selenium.webdriver.common.by import By

    base, token = lab
    started = time.monotonic()
    shots: list[str] = []

    def panel() -> Any:
        return browser.execute_script(PANEL_JS)

    def cells() -> Any:
        return browser.execute_script(CELLS_JS)

    def shot(name: str) -> None:
        browser.execute_script(SCROLL_JS)  # the panel's cell in view, as a student looks at it
        time.sleep(0.3)
        path = artefacts / f"{len(shots) + 1:02d}-{name}.png"
        browser.save_screenshot(str(path))
        shots.append(f"{path.name} at {time.monotonic() - started:.0f} s: {panel()}")

    def idle() -> bool:  # the status bar says "Python 3 (ipykernel) | Idle"
        bar = browser.find_elements(By.ID, "jp-main-statusbar")
        return bool(bar) and re.search(r"\|\s*Idle\b", bar[0].text) is not None

    def run_panel(name: str) -> None:
        browser.execute_script("document.querySelector('.jp-Notebook .widget-button').click();")
        busy = _wait("the busy state", lambda: (p := panel()) and p["disabled"] and p, 60, panel)
        assert busy["button"] == "Training…", busy
        shot(f"{name}-training")
        done = _wait(
            "the run to finish",
            lambda: (
                (p := panel()) and not p["disabled"] and p["status"][:4] in ("done", "fail") and p
            ),
            300,
            panel,
        )
        assert done["status"].startswith("done"), done
        assert done["progress"] == "100%" and done["curves"], done
        shot(f"{name}-done")

    try:
        browser.get(f"{base}/lab/tree/{NOTEBOOK}?token={token}")
        _wait("the notebook", lambda: cells()["prompts"], 120, cells)
        _wait("the kernel", idle, 120, cells)
        time.sleep(1)
        shot("opened")  # as stored: what a student sees before running anything
        browser.find_element(By.XPATH, "//li[@role='menuitem'][.//div[text()='Run']]").click()
        browser.find_element(By.XPATH, "//li[.//div[text()='Run All Cells']]").click()
        _wait("Run All to start", lambda: "[*]:" in cells()["prompts"], 30, cells)
        _wait("the panel", lambda: (p := panel()) and p["disabled"], 180, panel)
        shot("run-all-training")

        def ran_all() -> bool:
            state = cells()
            assert not state["errors"], "a cell failed:\n" + "\n".join(state["errors"])
            return all(p[1:-2].isdigit() for p in state["prompts"]) and idle()

        _wait("Run All to finish", ran_all, 600, cells)
        state = panel()
        assert state and state["progress"] == "100%" and state["curves"], state
        shot("run-all-done")
        run_panel("run-after-run-all")  # the last cell shut the cluster down
        assert "fresh local cluster" in panel()["status"], panel()
        run_panel("run-again")
    finally:
        shot("last")
        print("\n".join(shots))
        print(f"browser test: {time.monotonic() - started:.0f} s in the browser")


# The output of the cell that shows notebook 03's interact panel, as the page draws it.
WIDGET_JS = """
const cell = [...document.querySelectorAll('.jp-CodeCell')]
  .find(c => c.querySelector('.jp-InputArea').textContent.includes('interact_manual('));
if (!cell) return null;
cell.scrollIntoView({block: 'start'});
const out = cell.querySelector('.jp-OutputArea');
const images = [...out.querySelectorAll('img')]
  .filter(i => i.complete && i.naturalWidth > 0 && i.offsetParent !== null);
return {images: images.length, text: out.textContent.trim().slice(0, 300)};
"""


# The output of the cell that draws notebook 15's two traces, as the page shows it.
TRACE_JS = """
const cell = [...document.querySelectorAll('.jp-CodeCell')]
  .find(c => c.querySelector('.jp-InputArea').textContent.includes('plot_step_traces('));
if (!cell) return null;
cell.scrollIntoView({block: 'start'});
const images = [...cell.querySelectorAll('.jp-OutputArea img')]
  .filter(i => i.complete && i.naturalWidth > 0 && i.offsetParent !== null);
return {images: images.length, width: images.length ? images[0].naturalWidth : 0};
"""


def test_notebook_03_shows_its_widget_as_a_figure_before_running(
    lab: tuple[str, str], browser: Any, artefacts: Path
) -> None:
    """As stored (executed with scaledl_lab.viz.static in its kernel), the interact panel's
    first result is in the saved widget state: the page shows its figure, not widget text.
    Then notebook 15, as stored: its static figure of the two traces of one step is drawn
    (the same JupyterLab and browser: a page load more, a few seconds)."""
    base, token = lab
    browser.get(f"{base}/lab/tree/{WIDGET_NOTEBOOK}?token={token}")

    def shown() -> Any:
        state = browser.execute_script(WIDGET_JS)
        return state if state and state["images"] else None

    try:
        state = _wait("the widget's figure", shown, 120, lambda: browser.execute_script(WIDGET_JS))
        assert "interactive(children=" not in state["text"], state
        assert "Error displaying widget" not in state["text"], state
    finally:
        browser.save_screenshot(str(artefacts / "03-opened.png"))
    browser.get(f"{base}/lab/tree/{TRACE_NOTEBOOK}?token={token}")

    def figure() -> Any:
        state = browser.execute_script(TRACE_JS)
        return state if state and state["images"] else None

    try:
        state = _wait("the traces' figure", figure, 120, lambda: browser.execute_script(TRACE_JS))
        assert state["width"] > 800, state  # both traces, side by side
    finally:
        browser.save_screenshot(str(artefacts / "15-opened.png"))
