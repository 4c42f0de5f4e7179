"""gpt-tiny-moe on the mesh (#49): ``scaledl-lab plan`` for a mesh of ``dp`` and ``ep``
(:mod:`.plan`); expert parallelism's claims measured (:mod:`.study`: the capacity factor's
trade, the load-balancing loss, the all-to-all across nodes) and decided (:mod:`.report`,
results/moe/, notebook 13); the techniques are :mod:`scaledl_lab.moe` and
:mod:`scaledl_lab.strategies.mesh.experts`."""
