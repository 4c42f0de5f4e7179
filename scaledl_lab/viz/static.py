"""Static figures for ipywidgets: every widget a notebook shows also leaves a PNG behind.

A saved notebook keeps a widget's output as a widget view (which only a live kernel, or the
saved widget state in JupyterLab, can draw) plus a text fallback, ``HBox(children=(...``, which
is what GitHub and nbviewer show. In a kernel that has imported ``scaledl_lab``, a widget is
displayed as :class:`~scaledl_lab.panels.widgets.TrainingPanel` displays itself: with a display id
and, beside the widget view, an ``image/png`` drawn from the widget, updated after every cell.

The PNG shows the controls (each one's description and value) and what the widget computed:
the figures and images shown in its ``Output`` areas (seen as they are published, by a hook on
the kernel's display publisher) and its ``Image`` widgets. An ``interact_manual`` (or any
manual ``interactive``) that nobody has run by the end of the cell that shows it runs once with
its default values, so that the notebook, executed top to bottom, holds its first result both
in the widget's saved state and in the PNG. Text printed into an ``Output`` (``print``) goes to
the kernel's stream thread, out of this hook's reach: it shows in the saved widget state only.
"""

from __future__ import annotations

import base64
import contextlib
import io
import textwrap
from typing import Any

FONT = 9
WIDTH_IN = 10.0
DPI = 80


def figure_png(fig: Any) -> bytes:
    """A matplotlib figure as PNG bytes (no pyplot, no backend needed)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
    return buf.getvalue()


def _children(widget: Any) -> list[Any]:
    return list(getattr(widget, "children", ()) or ())


def walk(widget: Any) -> list[Any]:
    """``widget`` and every widget inside it, depth first, in display order."""
    found = [widget]
    for child in _children(widget):
        found.extend(walk(child))
    return found


def _value_text(widget: Any) -> str | None:
    """How one control reads: its value (a selection's label; a range for sliders)."""
    import ipywidgets as w

    if isinstance(widget, w.Button):
        return None
    if isinstance(widget, (w.HTML, w.HTMLMath, w.Label)):
        import re

        return re.sub(r"<[^>]+>", "", str(widget.value)).strip() or None
    label = getattr(widget, "label", None)
    if isinstance(widget, w.widgets.widget_selection._Selection) and label is not None:
        return str(label)
    if not hasattr(widget, "value"):
        return None
    value = widget.value
    if isinstance(value, float):
        value = f"{value:g}"
    if isinstance(widget, (w.IntProgress, w.FloatProgress)):
        return f"{widget.value:g} / {widget.max:g}"
    if isinstance(widget, w.FloatLogSlider):  # its min and max are exponents
        low, high = widget.base**widget.min, widget.base**widget.max
        return f"{value}  [{low:g} … {high:g}]"
    if hasattr(widget, "min") and hasattr(widget, "max"):
        return f"{value}  [{widget.min:g} … {widget.max:g}]"
    return str(value)


def controls(widget: Any) -> list[tuple[str, str, bool]]:
    """(description, value, is_button) of every control in ``widget``, in display order."""
    import ipywidgets as w

    rows = []
    for child in walk(widget):
        if isinstance(child, (w.Box, w.Output, w.Image)):
            continue
        description = str(getattr(child, "description", "") or "")
        if isinstance(child, w.Button):
            rows.append((description or "button", "", True))
            continue
        value = _value_text(child)
        if value is not None:
            rows.append((description, value, False))
    return rows


def _decode(png: bytes | str) -> Any:
    import matplotlib.image as mpimg

    raw = base64.b64decode(png) if isinstance(png, str) else png
    return mpimg.imread(io.BytesIO(raw), format="png")


def figure_of(widget: Any, shown: dict[str, list[dict[str, Any]]]) -> Any:
    """A matplotlib Figure of ``widget``: its controls on top, then the images it shows
    (``shown``: each Output's model id → the display bundles published into it)."""
    import ipywidgets as w
    from matplotlib.figure import Figure

    rows = controls(widget)
    images, texts = [], []
    for child in walk(widget):
        if isinstance(child, w.Image) and child.value and child.format == "png":
            if child.layout.display != "none":
                images.append(_decode(child.value))
        elif isinstance(child, w.Output):
            for bundle in shown.get(child.model_id, []):
                if "image/png" in bundle:
                    images.append(_decode(bundle["image/png"]))
                elif "text/plain" in bundle:
                    texts.append(str(bundle["text/plain"]))
    per_row = 3
    control_rows = -(-len(rows) // per_row)
    text = "\n".join(textwrap.shorten(t, 140) for t in texts[-6:])
    # Images at their own size (the figure's 80 dpi), narrowed only to fit the width.
    width = max([WIDTH_IN] + [im.shape[1] / DPI for im in images])
    heights = [0.35 + 0.38 * control_rows] + [im.shape[0] / DPI for im in images]
    if text:
        heights.append(0.25 + 0.17 * (text.count("\n") + 1))
    fig = Figure(figsize=(width, sum(heights)))
    axes = fig.subplots(len(heights), 1, gridspec_kw={"height_ratios": heights, "hspace": 0.02})
    axes = list(axes) if len(heights) > 1 else [axes]
    fig.subplots_adjust(left=0.01, right=0.99, top=0.99, bottom=0.01)
    for ax in axes:
        ax.set_axis_off()
    top = axes[0]
    note = "widget controls (run the notebook to use them)"
    top.text(0.0, 1.0, note, va="top", fontsize=FONT, color="0.4", transform=top.transAxes)
    for i, (description, value, is_button) in enumerate(rows):
        row, col = divmod(i, per_row)
        y = 1.0 - (0.35 + 0.38 * (row + 0.5)) / heights[0]
        label = f"[ {description} ]" if is_button else f"{description}: {value}".lstrip(": ")
        top.text(
            col / per_row,
            y,
            textwrap.shorten(label, 42),
            va="center",
            fontsize=FONT,
            transform=top.transAxes,
            bbox={"boxstyle": "round", "fc": "#dbe8f5" if is_button else "#f2f2f2", "ec": "0.7"},
        )
    for ax, im in zip(axes[1:], images, strict=False):
        ax.imshow(im)
    if text:
        axes[-1].text(0.0, 1.0, text, va="top", family="monospace", fontsize=FONT - 1,
                      transform=axes[-1].transAxes)  # fmt: skip
    return fig


def png_of(widget: Any, shown: dict[str, list[dict[str, Any]]]) -> bytes:
    return figure_png(figure_of(widget, shown))


class StaticFigures:
    """The kernel's displayed widgets, each kept with its display handle and what its Output
    areas showed; redraws a widget's PNG after a cell when something in it changed."""

    def __init__(self, shell: Any) -> None:
        self.shell = shell
        self.shown: dict[str, list[dict[str, Any]]] = {}  # Output model id → bundles
        self.displayed: list[tuple[Any, Any, Any]] = []  # (widget, handle, last signature)
        self.fresh: list[Any] = []  # shown during the current cell

    # -- display -----------------------------------------------------------------------

    def display(self, widget: Any) -> bool:
        """What IPython calls to display ``widget`` (its ipython_display formatter)."""
        from IPython.display import display

        handle = display(self.bundle(widget), raw=True, display_id=True)
        self.displayed.append((widget, handle, self.signature(widget)))
        self.fresh.append(widget)
        return True

    def bundle(self, widget: Any) -> dict[str, Any]:
        import ipywidgets as w

        data = dict(widget._repr_mimebundle_())
        if isinstance(widget, w.Output) and not self.shown.get(widget.model_id):
            data["text/plain"] = ""  # an empty output area: nothing to show
            return data
        name = type(widget).__name__
        data["text/plain"] = f"{name} widget (run the notebook to use it)"
        with contextlib.suppress(Exception):  # a widget that cannot be drawn keeps its text
            data["image/png"] = base64.b64encode(png_of(widget, self.shown)).decode("ascii")
        return data

    def signature(self, widget: Any) -> Any:
        import ipywidgets as w

        parts = []
        for child in walk(widget):
            if isinstance(child, w.Output):
                parts.append(len(self.shown.get(child.model_id, [])))
            elif isinstance(child, w.Image):
                parts.append(hash(bytes(child.value or b"")))
            else:
                parts.append(repr(getattr(child, "value", None)))
        return tuple(parts)

    # -- what Output areas show ------------------------------------------------------------

    def publishing(self, msg: dict[str, Any]) -> dict[str, Any]:
        """The display publisher's hook: note a bundle published into a shown Output."""
        parent = msg.get("parent_header", {}).get("msg_id")
        kind = msg.get("msg_type") or msg.get("header", {}).get("msg_type")
        if parent and kind in ("display_data", "clear_output"):
            for out in self._outputs():
                if out.msg_id == parent:
                    if kind == "clear_output":
                        self.shown[out.model_id] = []
                    else:
                        self.shown.setdefault(out.model_id, []).append(msg["content"]["data"])
        return msg

    def _outputs(self) -> list[Any]:
        import ipywidgets as w

        return [
            c for widget, _, _ in self.displayed for c in walk(widget) if isinstance(c, w.Output)
        ]

    # -- after each cell ---------------------------------------------------------------

    def after_cell(self, *_: Any) -> None:
        import ipywidgets as w

        fresh, self.fresh = self.fresh, []
        for widget in fresh:  # a manual interact shown in this cell: its first result
            if isinstance(widget, w.interactive) and widget.manual:
                if not self.shown.get(widget.out.model_id):
                    widget.update()
        for i, (widget, handle, seen) in enumerate(self.displayed):
            now = self.signature(widget)
            if now != seen or widget in fresh:
                handle.update(self.bundle(widget), raw=True)
                self.displayed[i] = (widget, handle, now)


def install(shell: Any) -> StaticFigures | None:
    """Show ``shell``'s widgets with static figures (once per shell); None outside a kernel."""
    if shell is None or not hasattr(shell, "display_pub") or not hasattr(shell, "kernel"):
        return None
    existing = getattr(shell, "_scaledl_static_figures", None)
    if existing is not None:
        return existing
    try:
        import ipywidgets as w
    except ImportError:
        return None
    figures = StaticFigures(shell)
    formatter = shell.display_formatter.ipython_display_formatter
    formatter.for_type(w.DOMWidget, _unless_own_repr(figures))
    shell.display_pub.register_hook(figures.publishing)
    shell.events.register("post_run_cell", figures.after_cell)
    shell._scaledl_static_figures = figures
    return figures


def _unless_own_repr(figures: StaticFigures) -> Any:
    def show(widget: Any) -> bool:
        if type(widget).__module__.startswith("tqdm"):  # a progress bar's text says it all
            from IPython.display import display

            display(widget._repr_mimebundle_(), raw=True)
            return True
        return figures.display(widget)

    return show


def install_in_kernel() -> None:
    """:func:`install` on the running IPython kernel, if this process is one."""
    import sys

    if "IPython" not in sys.modules or "ipykernel" not in sys.modules:
        return
    from IPython import get_ipython

    install(get_ipython())
