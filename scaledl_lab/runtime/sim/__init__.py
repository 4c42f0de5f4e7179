"""The simulated runtime: every worker in one process under a virtual clock (:mod:`.scheduler`,
a worker's side :mod:`.comm`, hosted servers :mod:`.servers`), charged by the cost model
(:mod:`.cost`, its config checks :mod:`.cost_checks`)."""
