"""One module per `python -m infra` command: `add_arguments(parser)` and `run(args) -> str`.

A command imports Pulumi, boto3 or the offline mocks inside `run`, so that the
offline commands (offers, plan without --resources) start without them.
"""
