"""The device mesh: data (ZeRO stages 0–3), tensor/sequence, pipeline and context parallelism
composed on gpt-tiny, expert parallelism on gpt-tiny-moe, each dimension a group of the
``Comm`` (:mod:`.grid`: the mesh and its groups; :mod:`.view`: one group seen as a ``Comm``;
:mod:`.layers`: the ``tp`` slices; :mod:`.stage`: the ``pp`` schedule; :mod:`.program`: the
step with ``dp``'s average or sharding; :mod:`.gather`: the whole model back by its unsplit
names; :mod:`.checks`: its config errors; :mod:`.context`, :mod:`.ring`, :mod:`.context_block`:
the ``cp`` dimension, Ulysses and ring attention over the sequence split; :mod:`.experts`: the
``ep`` dimension, gpt-tiny-moe's experts over data ranks)."""

from ...families import Family, register_family
from ..registry import described
from . import checks, experts, gather, grid, layers, program, stage, view
from .options import MeshOptions

FAMILY = register_family(
    Family(
        name="mesh",
        summary="parallel dimensions composed on a mesh of ranks: dp (ZeRO), tp (sequence), pp, "
        "cp, ep",
        strategies=described("mesh"),
        capabilities={"mesh": True, "mixed_precision": True},
        check=checks.check_mesh,
        options=MeshOptions,
        placement=checks.placement,
    )
)

__all__ = [
    "FAMILY",
    "MeshOptions",
    "checks",
    "experts",
    "gather",
    "grid",
    "layers",
    "program",
    "stage",
    "view",
]
