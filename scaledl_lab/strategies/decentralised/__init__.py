"""Decentralised training: every worker keeps its own replica (:mod:`.replicas`: what the
family shares). Nearest-neighbour training (:mod:`.nnt`: ``nnt``, ``nnt-lockstep``,
``nnt-staged``), gossip (:mod:`.gossip`: ``dpsgd``, ``adpsgd``), local SGD (:mod:`.local_sgd`)
and elastic averaging (:mod:`.easgd`)."""

from . import easgd, gossip, local_sgd, nnt, replicas

__all__ = ["easgd", "gossip", "local_sgd", "nnt", "replicas"]
