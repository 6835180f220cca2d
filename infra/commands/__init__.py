"""One module per `python -m infra` command: `add_arguments(parser)` and `run(args) -> str`.

Beside them, what several commands share: workspace (the Pulumi stack through the
Automation API, boto3 clients, the yes/no question), nodes (EC2 states, the job stop
over SSM, spot requests), checkpoints (what the trainer leaves beside its checkpoints
in S3) and outcome (text plus an exit status).

A command imports Pulumi, boto3 or the offline mocks inside `run`, so that the
offline commands (offers, plan without --resources) start without them.
"""
