"""Studies that run many experiments and report on them: the paper comparison
(:mod:`.reproduce`, its ``--long`` mode :mod:`.long_run`, the verdicts :mod:`.claims`, simulated
runs side by side :mod:`.side_by_side`), weak-scaling sweeps (:mod:`.scaling`) and measuring this
machine for the simulator (:mod:`.calibrate`). The families' own studies are in their folders
(``studies/large_batch/study.py``, ``studies/compression/study.py``)."""
