"""What every strategy's per-worker loop uses: its vocabulary (:mod:`.worker`), what a config
implies before any worker starts (:mod:`.plan`), where the steps fall and their learning rates
(:mod:`.schedule`), the layer-wise optimisers (:mod:`.optim`), each family's default optimiser
and the run warnings (:mod:`.health`), faults and checkpoints (:mod:`.faults`,
:mod:`.checkpoint`, :mod:`.snapshots`) and the sequential twins the strategies are tested against
(:mod:`.reference`). Binding a strategy to a runtime looks the strategies up, so it sits above
them (:mod:`scaledl_lab.strategies.launch`); resuming a run runs experiments, beside the front
door (:mod:`scaledl_lab.resume`).
"""
