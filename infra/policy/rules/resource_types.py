"""The Pulumi type tokens the rules judge, and the CIDRs that mean "the whole internet"."""

from __future__ import annotations

ASG = "aws:autoscaling/group:Group"
EKS_NODE_GROUP = "aws:eks/nodeGroup:NodeGroup"
EKS_CLUSTER = "aws:eks/cluster:Cluster"
LAUNCH_TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"
PLACEMENT_GROUP = "aws:ec2/placementGroup:PlacementGroup"
SECURITY_GROUP = "aws:ec2/securityGroup:SecurityGroup"
SUBNET = "aws:ec2/subnet:Subnet"
INGRESS_RULE = "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"
EGRESS_RULE = "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule"
SG_RULE = "aws:ec2/securityGroupRule:SecurityGroupRule"
INSTANCE = "aws:ec2/instance:Instance"
VOLUME = "aws:ebs/volume:Volume"
LUSTRE = "aws:fsx/lustreFileSystem:LustreFileSystem"
NAT_GATEWAY = "aws:ec2/natGateway:NatGateway"
ELASTIC_IP = "aws:ec2/eip:Eip"
BUCKETS = ("aws:s3/bucket:Bucket", "aws:s3/bucketV2:BucketV2")
BUCKET_SSE = (
    "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration",
    "aws:s3/bucketServerSideEncryptionConfigurationV2:BucketServerSideEncryptionConfigurationV2",
)
BUCKET_PAB = "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock"
IAM_ROLE = "aws:iam/role:Role"
IAM_ROLE_POLICY = "aws:iam/rolePolicy:RolePolicy"
IAM_POLICY = "aws:iam/policy:Policy"
SSM_PARAMETER = "aws:ssm/parameter:Parameter"
TAGGABLE = (
    "aws:ec2/vpc:Vpc",
    SUBNET,
    SECURITY_GROUP,
    "aws:ec2/internetGateway:InternetGateway",
    "aws:ec2/routeTable:RouteTable",
    ELASTIC_IP,
    NAT_GATEWAY,
    "aws:ec2/vpcEndpoint:VpcEndpoint",
    LAUNCH_TEMPLATE,
    PLACEMENT_GROUP,
    ASG,
    EKS_NODE_GROUP,
    EKS_CLUSTER,
    "aws:kms/key:Key",
    INSTANCE,
    VOLUME,
    LUSTRE,
    "aws:fsx/dataRepositoryAssociation:DataRepositoryAssociation",
    *BUCKETS,
    IAM_ROLE,
    "aws:iam/instanceProfile:InstanceProfile",
)
OPEN_IPV4 = "0.0.0.0/0"
OPEN_IPV6 = "::/0"
