"""Names the platform gives things from the spec, which a spec's own names must not take."""

# The Slurm partition over the on-demand training pools where they hold more than one GPU type.
PLACEMENT_PARTITION = "gpus"
