"""Upper bounds on sizes a stack may ask for, each with the reason a user is told."""

from __future__ import annotations

# Kubernetes is designed for clusters of at most 5,000 nodes
# (https://kubernetes.io/docs/setup/best-practices/cluster-large/); the platform plans no larger one.
MAX_NODES = 5000
MAX_NODES_REASON = (
    "the largest cluster Kubernetes supports (kubernetes.io/docs/setup/best-practices/cluster-large); "
    "split a larger fleet into several stacks"
)
