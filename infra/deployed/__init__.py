"""A deployed stack as the command line reaches it: its Pulumi state and outputs
(workspace), its EC2 nodes and their SSM commands (nodes), a cluster's head node
(head_node) and compute fleet (cluster_fleet), what the trainer leaves in its bucket
(checkpoints) and what the spend guard counted (ledger_spend).

The targets (infra/targets/) are built from these; the commands (infra/commands/) use the
targets, and these directly only for what every kind of stack shares.
"""
