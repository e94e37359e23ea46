"""Jobs on the node: which job ran on which GPUs, and why a job is slow."""
