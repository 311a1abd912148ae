"""The Slurm layout (partitions, accounts, QoS) and the placement preferences that order pools."""
