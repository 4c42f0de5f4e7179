"""The notebooks' panels: ipywidgets that run experiments from a notebook (:mod:`.widgets`:
controls, a Run button, live progress and curves). Nothing is imported here (the widgets need
ipywidgets)."""
