"""Load a cluster config (YAML on stdin) with AWS ParallelCluster's own schema.

Runs under the interpreter of .venv-pcluster (requirements-pcluster.txt), not the
project's: `python pcluster_schema.py CLUSTER_NAME < config.yaml`. Prints the first
error as one line, `Path.To.Key: message`, and exits 1; or prints "valid". An unknown
field comes first: a misspelt key also shows up as a missing one, and the
misspelling is the cause.
The schema needs a region and credentials in the environment, not the network.
"""

import sys

import yaml
from marshmallow import ValidationError
from pcluster.schemas.cluster_schema import ClusterSchema


def error_lines(messages, path=""):
    if isinstance(messages, dict):
        for key, value in messages.items():
            step = f"[{key}]" if isinstance(key, int) else (f".{key}" if path else str(key))
            yield from error_lines(value, path + step)
    elif isinstance(messages, list) and all(isinstance(m, str) for m in messages):
        yield f"{path or 'config'}: {' '.join(messages)}"
    else:
        for item in messages:
            yield from error_lines(item, path)


def main() -> int:
    config = yaml.safe_load(sys.stdin)
    try:
        ClusterSchema(cluster_name=sys.argv[1]).load(config)
    except ValidationError as error:
        lines = list(error_lines(error.messages))
        print(sorted(lines, key=lambda line: not line.endswith("Unknown field."))[0])
        return 1
    print("valid")
    return 0


if __name__ == "__main__":
    sys.exit(main())
