"""The lab's figure style, in one place: the resolution every notebook figure is drawn at.

Matplotlib's default, 100 dpi, leaves a projected figure's labels a few pixels high. In a
notebook kernel (``import scaledl_lab`` calls :func:`apply_in_kernel`) every figure is drawn at
:data:`FIGURE_DPI` instead, whether pyplot or a bare ``Figure`` makes it and whether the inline
backend or ``savefig`` renders it; scripts and tests keep matplotlib's own settings.
"""

from __future__ import annotations

import sys

FIGURE_DPI = 150  # pixels per inch of every figure a notebook shows


def apply() -> None:
    """Draw every figure made from now on at :data:`FIGURE_DPI` (inline and saved alike)."""
    import matplotlib

    matplotlib.rcParams["figure.dpi"] = FIGURE_DPI
    matplotlib.rcParams["savefig.dpi"] = "figure"


def apply_in_kernel() -> None:
    """:func:`apply` if this process is an IPython kernel (a notebook), else nothing."""
    if "IPython" in sys.modules and "ipykernel" in sys.modules:
        from IPython import get_ipython

        if get_ipython() is not None and hasattr(get_ipython(), "kernel"):
            apply()
