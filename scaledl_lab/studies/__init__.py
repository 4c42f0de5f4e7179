"""Studies that run many experiments and report on them: the paper comparison
(:mod:`.reproduce`, its ``--long`` mode :mod:`.long_run`, the verdicts :mod:`.claims`, simulated
runs side by side :mod:`.side_by_side`), weak-scaling sweeps (:mod:`.scaling`), measuring this
machine for the simulator (:mod:`.calibrate`), and each family's own study, one folder per
family (:mod:`.large_batch`, :mod:`.compression`, :mod:`.model_parallel`, :mod:`.memory`,
:mod:`.low_communication`): they run experiments, so they sit here, above the strategies."""
