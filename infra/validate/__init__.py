"""Proving the fabric: NCCL's log and nccl-tests tables read, judged against the fabric gates, and the
scaling they predict. Imports neither Pulumi nor Ansible."""
