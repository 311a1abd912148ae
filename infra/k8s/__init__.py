"""The Kubernetes layer (scheduler.kind kueue): pure builders from the resolved platform to Kubernetes
objects (plain dicts, as `kubectl apply` takes them) and the Helm releases of the operators they need.

Nothing here imports Pulumi: `infra.k8s.resources` turns the objects into pulumi-kubernetes resources,
`gpuplat manifests` writes them as YAML, the policy rules read them from the recording.
"""
