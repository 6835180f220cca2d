"""Load cluster configs with AWS ParallelCluster's own schema.

Runs under the interpreter of .venv-pcluster (requirements-pcluster.txt), not the
project's: `python pcluster_schema.py CLUSTER_NAME < configs.yaml`, where the YAML maps
a name to a config. Prints a JSON object mapping each name to its verdict: "valid", or
the first error as one line, `Path.To.Key: message`. An unknown field comes first: a
misspelt key also shows up as a missing one, and the misspelling is the cause.
Many configs in one process: loading ParallelCluster takes seconds, a config milliseconds.
The schema needs a region and credentials in the environment, not the network.
"""

import json
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


def verdict(cluster_name: str, config: dict) -> str:
    try:
        ClusterSchema(cluster_name=cluster_name).load(config)
    except ValidationError as error:
        lines = list(error_lines(error.messages))
        return sorted(lines, key=lambda line: not line.endswith("Unknown field."))[0]
    return "valid"


def main() -> int:
    configs = yaml.safe_load(sys.stdin)
    print(json.dumps({name: verdict(sys.argv[1], config) for name, config in configs.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
