"""gpt-tiny-moe on the mesh (#49): ``scaledl-lab plan`` for a mesh of ``dp`` and ``ep``
(:mod:`.plan`); the techniques are :mod:`scaledl_lab.moe` and
:mod:`scaledl_lab.strategies.mesh.experts`."""
