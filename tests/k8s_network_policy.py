"""Whether a NetworkPolicy set admits one pod to another's port (ingress only), for the tests that hold a
policy to who must and must not reach a port (the guard Job's: tests/unit/test_guard_job_objects.py).

The rules, from the networking/v1 API's field docs (the kubernetes Python client 36.0.3's models,
v1_network_policy_spec.py, _ingress_rule.py, _peer.py, _port.py, generated from the API's OpenAPI):
traffic reaches a pod that no policy of its namespace selects for Ingress; else only traffic matching at
least one ingress rule of the policies selecting it (their union). A rule's `from` empty or missing matches
every source, else any of its peers: a `podSelector` alone, the pods of the policy's own namespace it
selects; a `namespaceSelector` alone, every pod of the namespaces it selects; both, those pods of those
namespaces. Its `ports` empty or missing match every port, else any of them: the protocol (TCP when not
given) and the port (a number here; `endPort` a range). Label selectors as metav1.LabelSelector: every
`matchLabels` pair and every `matchExpressions` requirement (In, NotIn, Exists, DoesNotExist); an empty
selector selects everything.

Not modelled: named ports, egress, traffic from the pod's own node, ipBlock peers."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tests.unit.test_k8s_operators import selects

Policy = Mapping[str, Any]


@dataclass(frozen=True)
class Pod:
    namespace: str
    labels: Mapping[str, str]
    namespace_labels: Mapping[str, str] = field(default_factory=dict)


def _peer_admits(peer: Mapping[str, Any], policy_namespace: str, source: Pod) -> bool:
    pods, namespaces = peer.get("podSelector"), peer.get("namespaceSelector")
    if pods is None and namespaces is None:
        return False  # an ipBlock peer: no pod address is modelled
    in_namespace = (
        source.namespace == policy_namespace
        if namespaces is None
        else selects(namespaces, dict(source.namespace_labels))
    )
    return in_namespace and (pods is None or selects(pods, dict(source.labels)))


def _port_admits(port: Mapping[str, Any], number: int, protocol: str) -> bool:
    if (port.get("protocol") or "TCP") != protocol:
        return False
    if "port" not in port:
        return True
    first = int(port["port"])
    return first <= number <= int(port.get("endPort") or first)


def admits(policies: Sequence[Policy], source: Pod, target: Pod, port: int, protocol: str = "TCP") -> bool:
    selecting = [
        p
        for p in policies
        if p["metadata"]["namespace"] == target.namespace
        and "Ingress" in (p["spec"].get("policyTypes") or ["Ingress"])
        and selects(p["spec"].get("podSelector") or {}, dict(target.labels))
    ]
    if not selecting:
        return True
    return any(
        (
            not rule.get("from")
            or any(_peer_admits(peer, p["metadata"]["namespace"], source) for peer in rule["from"])
        )
        and (not rule.get("ports") or any(_port_admits(each, port, protocol) for each in rule["ports"]))
        for p in selecting
        for rule in p["spec"].get("ingress") or []
    )
