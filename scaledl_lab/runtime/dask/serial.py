"""bfloat16 tensors through Dask: its tensor serializer goes through NumPy, which has no
bfloat16, so such tensors (a 16-bit run's weights and checkpoints) are pickled instead (torch's
own pickling keeps their bits). Imported by the rank tasks' module, where results and rows are
serialized; other dtypes keep Dask's serializer."""

from __future__ import annotations

from typing import Any

import distributed.protocol.torch  # noqa: F401  (Dask's own tensor serializer, registered now)
import torch
from distributed.protocol.serialize import dask_serialize

_DASKS = dask_serialize.dispatch(torch.Tensor)


@dask_serialize.register(torch.Tensor)
def _tensor(t: torch.Tensor) -> Any:
    if t.dtype == torch.bfloat16:
        raise NotImplementedError  # Dask then takes its next serializer: pickle
    return _DASKS(t)
