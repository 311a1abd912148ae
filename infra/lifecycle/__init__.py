"""A platform's life: bring-up on each backend (local podman cluster, cloud stacks through Pulumi's
Automation API), scale and teardown."""
