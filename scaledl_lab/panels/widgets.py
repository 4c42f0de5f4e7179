"""ipywidgets panels for the notebooks: controls, a Run button, live progress and curves. A
panel runs experiments, so it sits above the front door (figures it draws come from
:mod:`scaledl_lab.viz`)."""

from __future__ import annotations

import base64
import contextlib
import html
import time
from typing import Any

import ipywidgets as w
from IPython.display import DisplayHandle, display

from ..config import ExperimentConfig
from ..experiment import Results, run, to_frame, total_steps
from ..runtime.dask.cluster import live_workers, start_local
from ..viz.static import figure_png

REDRAW_S = 1.5
LABEL = {"description_width": "90px"}  # wide enough for "batch/worker"
TEXT = "TrainingPanel: controls, a Run button, progress and curves (run the notebook to use it)"


class LiveCurves:
    """Redraws training loss and test accuracy from the rows seen so far, at most every 1.5 s.

    The figure goes into an Image widget, so it is part of the widget state that a saved
    notebook keeps, and ``png`` holds the last one for a static copy.
    """

    def __init__(self) -> None:
        self.image = w.Image(format="png", layout=w.Layout(display="none"))
        self.rows: list[dict[str, Any]] = []
        self.png = b""
        self._last = 0.0

    def reset(self) -> None:
        self.rows = []
        self._last = 0.0

    def add(self, batch: list[dict[str, Any]]) -> None:
        self.rows.extend(batch)
        if time.monotonic() - self._last > REDRAW_S:
            self.draw()

    def draw(self) -> None:
        from matplotlib.figure import Figure

        from ..viz.plots import plot_curves

        self._last = time.monotonic()
        frame = to_frame(self.rows)
        if not (frame["kind"] == "train").any():
            return
        fig = Figure(figsize=(10, 3.4))
        left, right = fig.subplots(1, 2)
        plot_curves(frame, metric="loss", x="epoch", kind="train", ax=left)
        if (frame["kind"] == "test").any():
            plot_curves(frame, metric="accuracy", x="epoch", kind="test", ax=right)
        fig.tight_layout()
        self.png = figure_png(fig)
        self.image.value = self.png
        self.image.layout.display = None


def _worker_count(client: Any) -> int:
    """How many workers ``client``'s cluster has now; 0 when it is closed or has none."""
    if client is None or client.status != "running":
        return 0
    return len(live_workers(client))


def _error_html(exc: BaseException) -> str:
    return f"<b style='color:#b00020'>failed:</b> {html.escape(f'{type(exc).__name__}: {exc}')}"


class TrainingPanel:
    """Widgets for one data-parallel run on ``client``; ``run()`` is what the Run button does.

    The panel survives what a notebook session does to it. A client that was shut down (the
    notebook's last cell does that) or whose cluster is gone is replaced, at the next Run, by a
    fresh local cluster of the same size; a failed run says why in the panel itself (a button
    click's traceback would only reach JupyterLab's log console); while it trains, the button
    is disabled and says so.
    """

    def __init__(self, client: Any, defaults: ExperimentConfig) -> None:
        self.client = client
        self.defaults = defaults
        self.size = _worker_count(client) or defaults.workers  # workers a fresh cluster gets
        self.workers = w.IntSlider(
            value=min(defaults.workers, self.size),
            min=1,
            max=self.size,
            description="workers",
            style=LABEL,
        )
        self.batch_size = w.Dropdown(
            options=[16, 32, 64, 128, 256],
            value=defaults.batch_size,
            description="batch/worker",
            style=LABEL,
        )
        # A list, not a log slider: a slider snaps 0.05 to 10**-1.3 = 0.0501 in the browser, so
        # Run with the defaults would train with another learning rate than the notebook's.
        self.lr = w.Dropdown(
            options=sorted({0.001, 0.003, 0.01, 0.03, 0.05, 0.1, 0.3, defaults.lr}),
            value=defaults.lr,
            description="lr",
            style=LABEL,
        )
        self.epochs = w.IntSlider(
            value=defaults.epochs, min=1, max=20, description="epochs", style=LABEL
        )
        self.model = w.Dropdown(
            options=["mlp", "cnn", "resnet18"],
            value=defaults.model,
            description="model",
            style=LABEL,
        )
        self.button = w.Button(description="Run", button_style="primary", icon="play")
        self.progress = w.IntProgress(value=0, min=0, max=1, description="steps")
        self.status = w.HTML(value="")
        self.curves = LiveCurves()
        self.history: list[Results] = []
        self._handles: list[DisplayHandle] = []
        self.button.on_click(self._clicked)
        controls = w.HBox(
            [
                w.VBox([self.workers, self.batch_size, self.lr]),
                w.VBox([self.epochs, self.model, self.button]),
            ]
        )
        self.widget = w.VBox([controls, w.HBox([self.progress, self.status]), self.curves.image])

    def config(self) -> ExperimentConfig:
        """The config the controls describe (validated: a bad choice fails here)."""
        return self.defaults.replace(
            workers=self.workers.value,
            batch_size=self.batch_size.value,
            lr=self.lr.value,
            epochs=self.epochs.value,
            model=self.model.value,
        )

    def _clicked(self, _button: Any) -> None:
        # run() has put the error in the panel; raised here it would only reach the log console.
        with contextlib.suppress(Exception):
            self.run()

    def _busy(self, busy: bool) -> None:
        for control in (self.workers, self.batch_size, self.lr, self.epochs, self.model):
            control.disabled = busy
        self.button.disabled = busy
        self.button.description = "Training…" if busy else "Run"
        self.button.icon = "hourglass-half" if busy else "play"

    def _live_client(self) -> tuple[Any, str]:
        """The client to train on, and a note when it is a fresh one started here."""
        if _worker_count(self.client):
            return self.client, ""
        why = (
            "no Dask client was given"
            if self.client is None
            else "the notebook's Dask cluster was shut down or lost"
        )
        workers = f"{self.size} worker" + ("s" if self.size != 1 else "")
        note = f"{why}, so this run started a fresh local cluster of {workers}"
        self.status.value = f"{note} …"
        if self.client is not None and self.client.status != "closed":
            with contextlib.suppress(Exception):  # a client whose scheduler is gone
                self.client.close(timeout=5)
        self.client = start_local(self.size, dashboard=False)
        return self.client, note

    def _on_rows(self, batch: list[dict[str, Any]]) -> None:
        self.progress.value += sum(r["kind"] == "train" and r["rank"] == 0 for r in batch)
        tests = [r for r in batch if r["kind"] == "test"]
        if tests:
            last = tests[-1]
            self.status.value = f"epoch {last['epoch']:.2f}: test accuracy {last['accuracy']:.2%}"
        self.curves.add(batch)

    def run(self, config: ExperimentConfig | None = None) -> Results:
        """Train once with the controls' config (or ``config``); errors show in the panel too."""
        self._busy(True)
        self.progress.value, self.progress.bar_style = 0, "info"
        try:
            cfg = config or self.config()
            client, note = self._live_client()
            self.progress.value, self.progress.max = 0, total_steps(cfg)
            self.status.value = f"training {html.escape(cfg.label)} …"
            self.curves.reset()
            results = run(cfg, client=client, progress=False, on_rows=self._on_rows, log=None)
        except Exception as exc:
            self.progress.bar_style = "danger"
            self.status.value = _error_html(exc)
            raise
        finally:
            self._busy(False)
        self.curves.draw()
        self.progress.bar_style = "success"
        final = results.summary().iloc[0]
        self.status.value = (
            f"done in {final['time_s']:.1f} s: test accuracy {final['test_accuracy']:.2%}"
            + (f" <i>({note})</i>" if note else "")
        )
        self.history.append(results)
        for handle in self._handles:  # a saved notebook keeps the last figure as a fallback
            handle.update(self._mimebundle(), raw=True)
        return results

    def _mimebundle(self) -> dict[str, Any]:
        bundle = dict(self.widget._repr_mimebundle_())
        bundle["text/plain"] = TEXT
        if self.curves.png:
            bundle["image/png"] = base64.b64encode(self.curves.png).decode("ascii")
        return bundle

    def _ipython_display_(self) -> None:
        # Shown with a display id, so that each finished run can update what a notebook saves:
        # where widgets do not render (a static viewer), the last curves show instead of text.
        self._handles.append(display(self._mimebundle(), raw=True, display_id=True))
