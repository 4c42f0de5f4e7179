"""The real runtime: ranks as long-running Dask tasks, tensors over torch.distributed. The
driver's side (:mod:`.driver`), a worker's side (:mod:`.worker`), the Comm over
torch.distributed (:mod:`.comm`, its work handles :mod:`.work`), each worker's device
(:mod:`.devices`), server calls as torch.distributed messages (:mod:`.p2p`), collectives among
the survivors of a lost worker (:mod:`.survivors`) and the Dask cluster itself
(:mod:`.cluster`)."""
