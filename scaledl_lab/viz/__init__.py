"""Figures: from results tables (:mod:`.plots`), the pipeline's Gantt chart and bubble
(:mod:`.gantt`), diagrams of communication patterns (:mod:`.diagrams`) and a static PNG beside
every widget a notebook shows (:mod:`.static`), and the figures' resolution in a notebook
(:mod:`.style`). Nothing here runs an experiment: the notebooks' panels that do are
:mod:`scaledl_lab.panels`. Nothing is imported here (``scaledl_lab`` imports :mod:`.plots`,
:mod:`.static` and :mod:`.style` itself)."""
