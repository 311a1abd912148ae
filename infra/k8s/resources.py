"""The Kubernetes layer as pulumi-kubernetes resources: a Helm chart per operator, then one resource per
object, each registered under the provider's own type token (`kubernetes:apps/v1:Deployment`,
`kubernetes:kueue.x-k8s.io/v1beta2:ClusterQueue`, ...) with the object as its inputs, so `pulumi up`
applies exactly the objects `gpuplat manifests` writes. Objects wait for their namespace; custom
resources wait for the chart that installs their CRD."""

from __future__ import annotations

from typing import Any

import pulumi
import pulumi_kubernetes as k8s
from pulumi_kubernetes import _utilities as k8s_utilities

from infra.k8s.facts import ClusterFacts
from infra.k8s.layer import kubernetes_layer
from infra.k8s.nodes import merged_taints
from infra.k8s.objects import CRD_SUFFIX, HelmRelease, Manifest
from infra.platform.resolve import ResolvedPlatform


def type_token(api_version: str, kind: str, patch: bool = False) -> str:
    """The provider's type token of a kind: the core group is `core`, other groups by their full name."""
    group_version = api_version if "/" in api_version else f"core/{api_version}"
    return f"kubernetes:{group_version}:{kind}{'Patch' if patch else ''}"


def api_group(api_version: str) -> str:
    return api_version.split("/")[0] if "/" in api_version else ""


def logical_name(manifest: Manifest) -> str:
    meta = manifest["metadata"]
    scope = f"{meta['namespace']}-" if meta.get("namespace") else ""
    return f"{manifest['kind'].lower()}-{scope}{meta['name']}"


class KubernetesObject(pulumi.CustomResource):
    """One Kubernetes object; `patch` makes it a server-side apply patch of an object that exists."""

    def __init__(
        self, manifest: Manifest, opts: pulumi.ResourceOptions | None = None, *, patch: bool = False
    ) -> None:
        version: str = k8s_utilities.get_version()
        opts = pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(version=version))
        token = type_token(manifest["apiVersion"], manifest["kind"], patch)
        super().__init__(token, logical_name(manifest), dict(manifest), opts)


def live_node(name: str, opts: pulumi.ResourceOptions) -> pulumi.CustomResource:
    """The Node as the cluster has it (a read: nothing is created or changed)."""
    version: str = k8s_utilities.get_version()
    read = pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(id=name, version=version))
    return pulumi.CustomResource(
        "kubernetes:core/v1:Node", f"node-{name}-live", {"metadata": None, "spec": None}, read
    )


class KubernetesPlatform(pulumi.ComponentResource):
    def __init__(
        self,
        name: str,
        platform: ResolvedPlatform,
        facts: ClusterFacts,
        provider: pulumi.ProviderResource,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__("gpu-platform:k8s:KubernetesPlatform", name, None, opts)
        layer = kubernetes_layer(platform, facts)
        child = pulumi.ResourceOptions(parent=self, provider=provider)
        self.patches = [self._node_patch(patch, child) for patch in layer.node_patches]
        self.namespaces = {
            o["metadata"]["name"]: KubernetesObject(o, child)
            for o in layer.objects
            if o["kind"] == "Namespace"
        }
        self._crds: list[pulumi.Resource] = []
        self.charts = {release.name: self._chart(release, child) for release in layer.releases}
        self.objects = [
            self._object(o, layer.releases, child) for o in layer.objects if o["kind"] != "Namespace"
        ]
        self.register_outputs(
            {
                "namespaces": sorted(self.namespaces),
                "charts": {r.name: f"{r.chart}@{r.version}" for r in layer.releases},
                "objects": len(self.objects) + len(self.namespaces),
            }
        )

    def _after(self, *names: str) -> list[pulumi.Resource]:
        return [self.namespaces[n] for n in names if n in self.namespaces]

    @staticmethod
    def _node_patch(patch: Manifest, opts: pulumi.ResourceOptions) -> KubernetesObject:
        """Labels as they are; taints merged with the live node's (infra/k8s/nodes.py)."""
        taints = patch["spec"]["taints"]
        live = live_node(patch["metadata"]["name"], opts)
        merged = pulumi.Output.all(live.metadata, live.spec).apply(  # type: ignore[attr-defined]
            lambda parts: merged_taints(
                (parts[1] or {}).get("taints") or [], (parts[0] or {}).get("annotations") or {}, taints
            )
        )
        return KubernetesObject({**patch, "spec": {"taints": merged}}, opts, patch=True)

    def _chart(self, release: HelmRelease, child: pulumi.ResourceOptions) -> k8s.helm.v4.Chart:
        args: dict[str, Any] = {
            "chart": release.chart,
            "version": release.version,
            "namespace": release.namespace,
            "values": release.values,
        }
        if release.repository:
            args["repository_opts"] = {"repo": release.repository}
        crds: list[pulumi.Resource] = [
            k8s.yaml.v2.ConfigFile(f"{release.name}{CRD_SUFFIX}{index}", file=url, opts=child)
            for index, url in enumerate(release.crd_urls)
        ]
        # After the CRDs of every release before it in install order too: a controller may look for an
        # API only when it starts (Kueue sets up its ProvisioningRequest admission check only if the CRD
        # is served then: cmd/kueue/main.go:512-526 at v0.19.2; without it the check stays inactive and
        # so does every ClusterQueue that uses it, pkg/cache/scheduler/clusterqueue.go:253-262).
        self._crds += crds
        return k8s.helm.v4.Chart(
            release.name,
            **args,
            opts=pulumi.ResourceOptions.merge(
                child, pulumi.ResourceOptions(depends_on=[*self._after(release.namespace), *self._crds])
            ),
        )

    def _object(
        self, manifest: Manifest, releases: list[HelmRelease], child: pulumi.ResourceOptions
    ) -> KubernetesObject:
        group = api_group(manifest["apiVersion"])
        waits: list[pulumi.Resource] = self._after(manifest["metadata"].get("namespace", ""))
        waits += [self.charts[r.name] for r in releases if group in r.provides]
        return KubernetesObject(
            manifest, pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(depends_on=waits))
        )


def declare_layer(
    platform: ResolvedPlatform,
    provider: pulumi.ProviderResource,
    facts: ClusterFacts,
    depends_on: list[pulumi.Resource] | None = None,
) -> dict[str, Any]:
    """Declare the Kubernetes layer on `provider`'s cluster; returns the stack outputs it adds."""
    layer = KubernetesPlatform(
        f"{platform.name}-k8s", platform, facts, provider, pulumi.ResourceOptions(depends_on=depends_on or [])
    )
    return {"kubernetes_namespaces": sorted(layer.namespaces)}


def existing_cluster_provider(platform: ResolvedPlatform) -> k8s.Provider:
    """The provider of an existing cluster: the stack's kubeconfig and context, else the environment's."""
    k8s_spec = platform.spec.kubernetes
    assert k8s_spec is not None  # the spec requires the section for kueue
    args: dict[str, Any] = {}
    if k8s_spec.kubeconfig:
        args["kubeconfig"] = k8s_spec.kubeconfig
    if k8s_spec.context:
        args["context"] = k8s_spec.context
    return k8s.Provider(f"{platform.name}-cluster", **args)
