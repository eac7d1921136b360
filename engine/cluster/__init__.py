"""Several gateways on one warehouse: membership, rendezvous placement and per-stream ownership."""

from engine.cluster.membership import Member, Membership
from engine.cluster.ownership import Ownership, Plan, StreamHost, plan
from engine.cluster.rendezvous import assign, owner_of

__all__ = ["Member", "Membership", "Ownership", "Plan", "StreamHost", "assign", "owner_of", "plan"]
