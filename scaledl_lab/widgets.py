"""ipywidgets panels for the notebooks: controls, a Run button, live progress and curves."""

from __future__ import annotations

import time
from typing import Any

import ipywidgets as w
from IPython.display import clear_output, display

from .config import ExperimentConfig
from .experiment import Results, run, to_frame, total_steps

REDRAW_S = 1.5


class LiveCurves:
    """Redraws training loss and test accuracy from the rows seen so far, at most every 1.5 s."""

    def __init__(self) -> None:
        self.out = w.Output()
        self.rows: list[dict[str, Any]] = []
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

        from .plots import plot_curves

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
        with self.out:
            clear_output(wait=True)
            display(fig)


class TrainingPanel:
    """Widgets for one data-parallel run on an existing client; ``run()`` is the Run button."""

    def __init__(self, client: Any, defaults: ExperimentConfig) -> None:
        self.client = client
        self.defaults = defaults
        max_workers = len(client.scheduler_info(n_workers=-1)["workers"])
        self.workers = w.IntSlider(
            value=min(defaults.workers, max_workers), min=1, max=max_workers, description="workers"
        )
        self.batch_size = w.Dropdown(
            options=[16, 32, 64, 128, 256], value=defaults.batch_size, description="batch/worker"
        )
        self.lr = w.FloatLogSlider(
            value=defaults.lr,
            base=10,
            min=-4,
            max=0,
            step=0.1,
            description="lr",
            readout_format=".4f",
        )
        self.epochs = w.IntSlider(value=defaults.epochs, min=1, max=20, description="epochs")
        self.model = w.Dropdown(
            options=["mlp", "cnn", "resnet18"], value=defaults.model, description="model"
        )
        self.button = w.Button(description="Run", button_style="primary", icon="play")
        self.progress = w.IntProgress(value=0, min=0, max=1, description="steps")
        self.status = w.HTML(value="")
        self.curves = LiveCurves()
        self.history: list[Results] = []
        self.button.on_click(lambda _: self.run())
        controls = w.HBox(
            [
                w.VBox([self.workers, self.batch_size, self.lr]),
                w.VBox([self.epochs, self.model, self.button]),
            ]
        )
        self.widget = w.VBox([controls, w.HBox([self.progress, self.status]), self.curves.out])

    def config(self) -> ExperimentConfig:
        """The config the controls describe (validated: a bad choice fails here)."""
        return self.defaults.replace(
            workers=self.workers.value,
            batch_size=self.batch_size.value,
            lr=self.lr.value,
            epochs=self.epochs.value,
            model=self.model.value,
        )

    def _on_rows(self, batch: list[dict[str, Any]]) -> None:
        self.progress.value += sum(r["kind"] == "train" and r["rank"] == 0 for r in batch)
        tests = [r for r in batch if r["kind"] == "test"]
        if tests:
            last = tests[-1]
            self.status.value = f"epoch {last['epoch']:.2f}: test accuracy {last['accuracy']:.2%}"
        self.curves.add(batch)

    def run(self, config: ExperimentConfig | None = None) -> Results:
        cfg = config or self.config()
        self.button.disabled = True
        self.progress.value, self.progress.max = 0, total_steps(cfg)
        self.status.value = f"running {cfg.label} ..."
        self.curves.reset()
        try:
            results = run(cfg, client=self.client, progress=False, on_rows=self._on_rows)
        except Exception as exc:
            self.status.value = f"<b>failed:</b> {exc}"
            raise
        finally:
            self.button.disabled = False
        self.curves.draw()
        final = results.summary().iloc[0]
        self.status.value = (
            f"done in {final['time_s']:.1f} s: test accuracy {final['test_accuracy']:.2%}"
        )
        self.history.append(results)
        return results

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return self.widget._repr_mimebundle_(**kwargs)
