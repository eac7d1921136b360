"""Several gateways on one warehouse: membership, rendezvous placement and per-stream ownership."""

from engine.cluster.locator import ClusterLocator, lease_key_of, split_ref, stream_ref
from engine.cluster.membership import Member, Membership
from engine.cluster.ownership import Ownership, Plan, StreamHost, plan
from engine.cluster.rendezvous import assign, owner_of

__all__ = [
    "ClusterLocator", "Member", "Membership", "Ownership", "Plan", "StreamHost", "assign", "lease_key_of",
    "owner_of", "plan", "split_ref", "stream_ref",
]
