"""The EKS cluster of the Kueue platform (scheduler.kind kueue, kubernetes.distribution eks): control
plane, add-ons, access, one managed node group per pool, the autoscaler's identity, and the Kubernetes
provider the layer above is declared with.

- The control plane runs in the VPC's private subnets; its endpoint is private for the nodes and public
  for `pulumi up` (the Kubernetes layer is applied from wherever Pulumi runs). Access entries only
  (authentication mode API); Kubernetes secrets encrypted with a KMS key of the stack; every control
  plane log type on (botocore 1.44.8, eks service model, LogType).
- Managed add-ons at EKS's default version for the cluster version: the VPC CNI, kube-proxy and the Pod
  Identity agent before any node (nodes need them to become Ready), CoreDNS after the service pools'
  nodes (its pods need somewhere to run). The cluster installs no self-managed copies of them.
- Nodes carry the cluster security group besides their role's: with security groups in a launch
  template, EKS no longer adds it, and it is what lets nodes and control plane talk (EKS user guide,
  launch-templates.adoc, "Using custom security groups").
- Model servers mount the shared filesystem here (infra/k8s/serving.py), unlike Slurm's inference
  nodes: the Lustre group admits the inference nodes' group too (the network admits train and service).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s

from infra.backends.aws.eks_iam import autoscaler_role, cluster_role, model_server_role, node_roles
from infra.backends.aws.eks_nodes import EksNodePool, EksNodePoolArgs
from infra.backends.aws.network import LUSTRE_PORTS
from infra.backends.aws.tags import pool_tags
from infra.errors import SpecError
from infra.k8s.facts import AUTOSCALER_NAMESPACE, AUTOSCALER_SERVICE_ACCOUNT, MODEL_SERVER_ACCOUNT
from infra.k8s.objects import node_labels, serving_namespace
from infra.k8s.tenancy import team_group
from infra.platform.resolve import ResolvedPlatform, ResolvedPool
from infra.platform.zones import pool_zones
from infra.spec.load import CONFIG_KEY

CONTROL_PLANE_LOGS = ["api", "audit", "authenticator", "controllerManager", "scheduler"]
NODE_ADDONS = ("vpc-cni", "kube-proxy", "eks-pod-identity-agent")
# The VPC CNI enforces NetworkPolicy objects only with its network policy agent turned on (EKS user guide,
# "Configure your cluster for Kubernetes network policies", cni-network-policy.html: the add-on's
# configuration value enableNetworkPolicy "true"); without it the tenancy policies are accepted and ignored.
ADDON_CONFIGURATION = {"vpc-cni": {"enableNetworkPolicy": "true"}}
SCHEDULED_ADDONS = ("coredns",)
# EKS user guide, access-policy-reference.adoc, "AmazonEKSClusterAdminPolicy".
CLUSTER_ADMIN_POLICY = "arn:{partition}:eks::aws:cluster-access-policy/AmazonEKSClusterAdminPolicy"
# What `aws eks get-token` prints (EKS user guide, "Connect kubectl to an EKS cluster by creating a
# kubeconfig file": the exec apiVersion `aws eks update-kubeconfig` writes).
TOKEN_API_VERSION = "client.authentication.k8s.io/v1beta1"


# cluster-autoscaler's AWS provider knows GPU nodes by this label (cloudprovider/aws, GPULabel): on a node
# that carries it, GPUs not yet advertised by the device plugin count as coming, so one pending pod does
# not make it scale the group out again while the first node brings its GPUs up.
ACCELERATOR_LABEL = "k8s.amazonaws.com/accelerator"


def accelerator_label(pool: ResolvedPool) -> dict[str, str]:
    gpu = pool.node_type.gpu
    return {ACCELERATOR_LABEL: f"nvidia-{gpu.model.lower()}"} if gpu and gpu.count else {}


def eks_problems(platform: ResolvedPlatform) -> list[tuple[str, str]]:
    """What an EKS cluster cannot do that the stack asks for: (stack field, message)."""
    problems = []
    if platform.spec.aws.image_id:
        problems.append(
            (
                f"{CONFIG_KEY}.aws.image_id",
                "EKS node groups boot the EKS-optimized Amazon Linux 2023 AMI of their type (NVIDIA for "
                "GPU pools) and join the cluster by themselves; drop aws.image_id for kubernetes eks",
            )
        )
    for index, pool in enumerate(platform.spec.pools):
        if pool.max_nodes < 1:
            problems.append(
                (
                    f"{CONFIG_KEY}.pools[{index}].max",
                    f"pool {pool.name!r} has at most {pool.max_nodes} nodes; an EKS node group holds at "
                    "least one (scaling_config max_size >= 1): raise max or remove the pool",
                )
            )
    return problems


def kubeconfig(cluster_name: str, endpoint: str, certificate_authority: str, region: str) -> str:
    """A kubeconfig that reaches the cluster with the caller's AWS credentials (`aws eks get-token`)."""
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": cluster_name,
                    "cluster": {"server": endpoint, "certificate-authority-data": certificate_authority},
                }
            ],
            "contexts": [{"name": cluster_name, "context": {"cluster": cluster_name, "user": cluster_name}}],
            "current-context": cluster_name,
            "users": [
                {
                    "name": cluster_name,
                    "user": {
                        "exec": {
                            "apiVersion": TOKEN_API_VERSION,
                            "command": "aws",
                            "args": ["eks", "get-token", "--cluster-name", cluster_name, "--region", region],
                        }
                    },
                }
            ],
        },
        sort_keys=True,
    )


@dataclass(frozen=True)
class EksClusterArgs:
    platform: ResolvedPlatform
    subnet_by_zone: dict[str, pulumi.Input[str]]
    security_group_ids: dict[str, pulumi.Input[str]]  # pool role -> its security group
    bucket_arns: dict[str, pulumi.Output[str]]
    tags: dict[str, str]


class EksCluster(pulumi.ComponentResource):
    def __init__(self, name: str, args: EksClusterArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("gpu-platform:aws:EksCluster", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        platform = args.platform
        spec = platform.spec
        k8s_spec = spec.kubernetes
        assert k8s_spec is not None and spec.region is not None  # the spec requires both for eks
        problems = eks_problems(platform)
        if problems:
            raise SpecError("; ".join(f"{field}: {message}" for field, message in problems))

        role, role_policies = cluster_role(name, args.tags, child)
        secrets_key = aws.kms.Key(
            f"{name}-secrets-key",
            description=f"Kubernetes secrets of the {platform.name} EKS cluster",
            enable_key_rotation=True,
            tags=args.tags,
            opts=child,
        )
        self.cluster = aws.eks.Cluster(
            f"{name}-cluster",
            role_arn=role.arn,
            version=k8s_spec.version,
            vpc_config={
                "subnet_ids": list(args.subnet_by_zone.values()),
                "endpoint_private_access": True,
                "endpoint_public_access": True,
            },
            access_config={
                "authentication_mode": "API",
                "bootstrap_cluster_creator_admin_permissions": True,
            },
            bootstrap_self_managed_addons=False,
            enabled_cluster_log_types=CONTROL_PLANE_LOGS,
            encryption_config={"provider": {"key_arn": secrets_key.arn}, "resources": ["secrets"]},
            tags=args.tags,
            opts=pulumi.ResourceOptions(parent=self, depends_on=role_policies),
        )
        cluster_name = self.cluster.name
        node_addons = [self._addon(name, addon, args.tags) for addon in NODE_ADDONS]

        roles = node_roles(name, [p.role for p in platform.pools], args.bucket_arns, args.tags, child)
        if platform.pools_with_role("infer"):
            self._lustre_clients(name, "infer", args.security_group_ids)
        cluster_sg = self.cluster.vpc_config.cluster_security_group_id
        self.node_pools = {
            pool.name: EksNodePool(
                f"{platform.name}-{pool.name}",
                EksNodePoolArgs(
                    pool=pool.spec,
                    node_type=pool.node_type,
                    cluster_name=cluster_name,
                    node_role_arn=roles[pool.role].arn,
                    subnet_ids=[args.subnet_by_zone[zone] for zone in pool_zones(platform, pool)],
                    security_group_ids=[args.security_group_ids[pool.role], cluster_sg],
                    root_volume_gib=spec.aws.root_volume_gib,
                    efa=platform.uses_efa(pool),
                    placement=spec.fabric.placement,
                    labels={**node_labels(pool), **accelerator_label(pool)},
                    tags=pool_tags(platform, pool),
                    after=list(node_addons),
                ),
                opts=child,
            )
            for pool in platform.pools
        }
        service_groups: list[pulumi.Resource] = [
            self.node_pools[p.name].node_group for p in platform.pools_with_role("service")
        ]
        # What the Kubernetes layer waits for: DNS on running service nodes, and the autoscaler's identity.
        self.ready: list[pulumi.Resource] = [
            self._addon(name, addon, args.tags, after=service_groups) for addon in SCHEDULED_ADDONS
        ]
        if k8s_spec.scaler == "cluster-autoscaler":
            self.ready.append(
                aws.eks.PodIdentityAssociation(
                    f"{name}-autoscaler-identity",
                    cluster_name=cluster_name,
                    namespace=AUTOSCALER_NAMESPACE,
                    service_account=AUTOSCALER_SERVICE_ACCOUNT,
                    role_arn=autoscaler_role(name, cluster_name, args.tags, child).arn,
                    tags=args.tags,
                    opts=pulumi.ResourceOptions(parent=self, depends_on=node_addons),
                )
            )
        if spec.serving is not None:
            # The model server reads the models bucket as itself, never as its node.
            self.ready.append(
                aws.eks.PodIdentityAssociation(
                    f"{name}-model-server-identity",
                    cluster_name=cluster_name,
                    namespace=serving_namespace(platform),
                    service_account=MODEL_SERVER_ACCOUNT,
                    role_arn=model_server_role(name, args.bucket_arns, args.tags, child).arn,
                    tags=args.tags,
                    opts=pulumi.ResourceOptions(parent=self, depends_on=node_addons),
                )
            )
        for index, principal in enumerate(k8s_spec.admin_arns):
            self._admin(f"{name}-admin-{index}", principal, args.tags)
        for team in platform.spec.scheduler.teams:
            for index, principal in enumerate(team.iam_principals):
                # The group the team namespace's RoleBinding names (infra/k8s/tenancy.py): members get the
                # team's role there and nothing cluster-wide.
                aws.eks.AccessEntry(
                    f"{name}-team-{team.name}-{index}",
                    cluster_name=self.cluster.name,
                    principal_arn=principal,
                    type="STANDARD",
                    kubernetes_groups=[team_group(team.name)],
                    tags=args.tags,
                    opts=pulumi.ResourceOptions(parent=self),
                )

        config = pulumi.Output.all(
            cluster_name, self.cluster.endpoint, self.cluster.certificate_authority.data
        ).apply(lambda parts: kubeconfig(parts[0], parts[1], parts[2], str(spec.region)))
        self.kubeconfig: pulumi.Output[str] = pulumi.Output.secret(config)
        self.provider = k8s.Provider(f"{name}-k8s", kubeconfig=self.kubeconfig, opts=child)
        self.register_outputs(
            {
                "cluster_name": cluster_name,
                "endpoint": self.cluster.endpoint,
                "node_groups": {p: pool.node_group.node_group_name for p, pool in self.node_pools.items()},
            }
        )

    def _lustre_clients(self, name: str, role: str, security_group_ids: dict[str, pulumi.Input[str]]) -> None:
        for low, high in LUSTRE_PORTS:
            aws.vpc.SecurityGroupIngressRule(
                f"{name}-lustre-{low}-from-{role}",
                security_group_id=security_group_ids["lustre"],
                referenced_security_group_id=security_group_ids[role],
                ip_protocol="tcp",
                from_port=low,
                to_port=high,
                description=f"lustre-{low}-from-{role}",
                opts=pulumi.ResourceOptions(parent=self),
            )

    def _addon(
        self, name: str, addon: str, tags: dict[str, str], after: list[pulumi.Resource] | None = None
    ) -> aws.eks.Addon:
        configuration = ADDON_CONFIGURATION.get(addon)
        return aws.eks.Addon(
            f"{name}-{addon}",
            cluster_name=self.cluster.name,
            addon_name=addon,
            configuration_values=json.dumps(configuration) if configuration else None,
            tags=tags,
            opts=pulumi.ResourceOptions(parent=self, depends_on=after or []),
        )

    def _admin(self, name: str, principal: str, tags: dict[str, str]) -> None:
        entry = aws.eks.AccessEntry(
            name,
            cluster_name=self.cluster.name,
            principal_arn=principal,
            type="STANDARD",
            tags=tags,
            opts=pulumi.ResourceOptions(parent=self),
        )
        aws.eks.AccessPolicyAssociation(
            f"{name}-cluster-admin",
            cluster_name=self.cluster.name,
            principal_arn=principal,
            policy_arn=CLUSTER_ADMIN_POLICY.format(partition=principal.split(":")[1]),
            access_scope={"type": "cluster"},
            opts=pulumi.ResourceOptions(parent=self, depends_on=[entry]),
        )
