"""Reaching and configuring nodes: the Ansible inventory, the project's playbooks and their runs, the Ansible
a node installs, role templates rendered outside Ansible, and podman for the local nodes."""
