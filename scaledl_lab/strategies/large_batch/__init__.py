"""Large batches, which register no strategy of their own: the recipe beyond the schedules
(:mod:`.recipe`; the schedules every loop follows are :mod:`scaledl_lab.training.schedule`), its
config checks (:mod:`.checks`), sharp and flat minima (:mod:`.sharpness`), the claims and
figures (:mod:`.report`) and the reproductions of notebook 07 (:mod:`.study`).

Nothing is imported here: the study runs experiments, which sit above the strategies.
"""
