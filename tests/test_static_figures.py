"""Every widget a notebook shows leaves a static PNG beside its widget view (what GitHub and
nbviewer draw), in a real kernel executing a notebook as nbconvert does."""

from __future__ import annotations

import base64
import io

import nbformat
import pytest

w = pytest.importorskip("ipywidgets")
nbclient = pytest.importorskip("nbclient")

from scaledl_lab.viz import static  # noqa: E402

CELLS = [
    "%matplotlib inline\nimport ipywidgets as w\nfrom matplotlib.figure import Figure\n"
    "import scaledl_lab",
    # A manual interact nobody has pressed: it runs once, with its defaults.
    "def draw(n=3, kind='bars'):\n"
    "    fig = Figure(figsize=(4, 2))\n"
    "    fig.subplots().bar(range(n), range(n))\n"
    "    return fig\n\n"
    "w.interact_manual(draw, n=w.IntSlider(value=3, min=1, max=9), kind=['bars', 'lines']);",
    # Controls, a button and an output area that the cell fills by calling the handler.
    "out = w.Output()\ngo = w.Button(description='go')\n"
    "def click(_=None):\n    with out:\n        out.clear_output()\n        display(draw(5))\n"
    "go.on_click(click)\n"
    "display(w.HBox([w.Dropdown(options=['a', 'b'], description='pick'), go]), out)\nclick()",
    "empty = w.Output()\nempty",
    "from tqdm.auto import tqdm\nfor _ in tqdm(range(3), desc='bar'):\n    pass",
]


def _png_size(data: str) -> tuple[int, int]:
    import matplotlib.image as mpimg

    image = mpimg.imread(io.BytesIO(base64.b64decode(data)), format="png")
    return image.shape[1], image.shape[0]


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in CELLS])
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    nbclient.NotebookClient(nb, timeout=240, kernel_name="python3").execute()
    return nb


def test_each_widget_leaves_a_png_and_a_readable_text(executed):
    interact, (controls, area), (empty,), (bar,) = (c.outputs for c in executed.cells[1:])
    for shown, name in ((interact[0], "interactive"), (controls, "HBox"), (area, "Output")):
        assert shown.output_type == "display_data"
        assert "application/vnd.jupyter.widget-view+json" in shown.data
        assert shown.data["text/plain"] == f"{name} widget (run the notebook to use it)"
        assert base64.b64decode(shown.data["image/png"]).startswith(b"\x89PNG")
    # What the widgets computed is in their pictures: the interact ran once (controls and its
    # 4x2 in figure), the filled output area holds its figure; the controls alone are short.
    assert _png_size(interact[0].data["image/png"])[1] > 160
    assert _png_size(area.data["image/png"])[1] > 160
    assert _png_size(controls.data["image/png"])[1] < 80
    # An empty output area shows nothing, and tqdm's bar keeps its own text.
    assert empty.data["text/plain"] == "" and "image/png" not in empty.data
    assert bar.data["text/plain"].startswith("bar: ") and "image/png" not in bar.data


def test_the_manual_interact_ran_once_into_its_saved_output(executed):
    state = executed.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    outputs = [m["state"]["outputs"] for m in state.values() if m["model_name"] == "OutputModel"]
    figures = [o for area in outputs for o in area if "image/png" in o.get("data", {})]
    assert len(figures) == 2  # the interact's first result and the clicked figure


def test_controls_read_as_their_descriptions_and_values():
    panel = w.VBox(
        [
            w.HBox([w.Dropdown(options=[("ring · 8", 8), ("torus", 16)], value=16,
                               description="topology"),
                    w.FloatLogSlider(value=0.04, base=10, min=-3, max=1, description="λ")]),
            w.IntSlider(value=8, min=2, max=32, description="workers"),
            w.ToggleButtons(options=["gpipe", "1f1b"], value="1f1b", description="schedule"),
            w.Button(description="Run"),
            w.Output(),
        ]
    )  # fmt: skip
    assert static.controls(panel) == [
        ("topology", "torus", False),
        ("λ", "0.04  [0.001 … 10]", False),
        ("workers", "8  [2 … 32]", False),
        ("schedule", "1f1b", False),
        ("Run", "", True),
    ]
    assert static.png_of(panel, {}).startswith(b"\x89PNG")


def test_outside_a_kernel_nothing_is_installed():
    assert static.install(None) is None
