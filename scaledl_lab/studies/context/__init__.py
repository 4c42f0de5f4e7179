"""Context parallelism's claims measured (#49, notebook 13): ring attention's activations per
rank and the transfers it hides (Liu et al. 2023), Ulysses' all-to-all volume against the ring's
(Jacobs et al. 2023), zig-zag's balance of causal work (:mod:`.study` measures, :mod:`.report`
decides and writes results/context/); the techniques are :mod:`scaledl_lab.strategies.mesh`'s
``context``, ``ring`` and ``context_block``."""
