"""Figures: from results tables (:mod:`.plots`), the pipeline's Gantt chart and bubble
(:mod:`.gantt`), diagrams of communication patterns (:mod:`.diagrams`) and the notebooks'
ipywidgets panels (:mod:`.widgets`). Nothing is imported here (``scaledl_lab`` imports
:mod:`.plots` itself; the widgets need ipywidgets)."""
