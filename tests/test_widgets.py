"""The notebook training panel survives what students do, on a real cluster (no browser).

Run twice in a row, Run after the notebook shut its cluster down, a bad choice in the controls:
each ends with the panel itself saying what happened, the button usable again.
"""

from __future__ import annotations

import base64

import pytest
from common import SMALL

from scaledl_lab import ExperimentConfig
from scaledl_lab.panels.widgets import TEXT, TrainingPanel
from scaledl_lab.runtime.dask.cluster import start_local

pytest.importorskip("ipywidgets")

TINY = ExperimentConfig(strategy="allreduce", workers=2, model="mlp", **SMALL)


def _watch_busy(panel: TrainingPanel) -> list[tuple[bool, str]]:
    """What the button looked like each time rows arrived (i.e. while training)."""
    seen: list[tuple[bool, str]] = []
    on_rows = panel._on_rows

    def spy(batch: list[dict]) -> None:
        seen.append((panel.button.disabled, panel.button.description))
        on_rows(batch)

    panel._on_rows = spy  # type: ignore[method-assign]
    return seen


def _assert_done(panel: TrainingPanel) -> None:
    assert panel.progress.value == panel.progress.max > 0
    assert panel.progress.bar_style == "success"
    assert panel.status.value.startswith("done in ")
    assert (panel.button.disabled, panel.button.description) == (False, "Run")
    assert panel.curves.image.value[:8] == b"\x89PNG\r\n\x1a\n"


def test_run_twice_in_a_row_shows_busy_state_and_keeps_a_static_figure(client) -> None:
    panel = TrainingPanel(client, defaults=TINY)
    assert panel.workers.max == 2
    bundle = panel._mimebundle()
    assert bundle["text/plain"] == TEXT and "image/png" not in bundle  # no `VBox(children=...`
    seen = _watch_busy(panel)
    for n in (1, 2):
        panel._clicked(panel.button)
        _assert_done(panel)
        assert len(panel.history) == n
    assert seen and set(seen) == {(True, "Training…")}
    png = base64.b64decode(panel._mimebundle()["image/png"])
    assert png == panel.curves.png and png.startswith(b"\x89PNG")


def test_a_bad_choice_fails_in_the_panel_not_only_in_the_log(client) -> None:
    panel = TrainingPanel(client, defaults=TINY.replace(train_subset=400))
    panel.batch_size.value = 256  # 200 samples per worker: not one batch
    panel._clicked(panel.button)  # a click does not raise: the panel says why
    assert "failed:" in panel.status.value and "batch_size=256" in panel.status.value
    assert panel.progress.bar_style == "danger"
    assert (panel.button.disabled, panel.button.description) == (False, "Run")
    with pytest.raises(ValueError, match="batch_size=256"):
        panel.run()  # called from a cell, the error is raised as well (nbval sees it)


def test_run_after_the_cluster_was_shut_down_starts_a_fresh_one() -> None:
    """The notebook's last cell runs ``client.shutdown()``; a Run after Run All used to fail
    with ``KeyError: 'workers'`` in the log console only."""
    gone = start_local(1, dashboard=False)
    gone.shutdown()
    panel = TrainingPanel(gone, defaults=TINY.replace(workers=1))
    assert panel.workers.max == 1
    try:
        panel._clicked(panel.button)
        _assert_done(panel)
        assert "fresh local cluster of 1 worker" in panel.status.value
        assert panel.client is not gone and panel.client.status == "running"
        fresh = panel.client
        panel.run()  # the fresh cluster is kept for the next Run
        assert panel.client is fresh and "fresh" not in panel.status.value
    finally:
        if panel.client is not gone:
            panel.client.shutdown()


def test_run_with_the_cluster_gone_starts_a_fresh_one() -> None:
    """The cluster stopped under a live client (workers and scheduler gone, client open)."""
    client = start_local(1, dashboard=False)
    panel = TrainingPanel(client, defaults=TINY.replace(workers=1))
    client.cluster.close()
    try:
        panel.run()
        _assert_done(panel)
        assert "shut down or lost" in panel.status.value
    finally:
        client.close()
        if panel.client is not client:
            panel.client.shutdown()
