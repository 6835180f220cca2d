"""Plan scale: seconds to evaluate the Pulumi program under mocks (infra/dryrun/runner.py, as
`python -m infra plan a100x8 --resources` runs it), and how that grows with gpu:nodes.

The stack file Pulumi.a100x8.yaml (one EC2 node) is run as is, then as a Slurm cluster
(gpu:cluster = slurm, more than one node runs only there) with gpu:nodes = 1, 2, 4, 8, 16.
Node counts run in interleaved rounds in this one process; each is set against the
one-node cluster's time, and against linear growth (n x one node), the target: linear or
better, 16 nodes < 5 s.
"""

from __future__ import annotations

from bench.measure import interleaved, median, metric, timed
from infra.config.stack_file import stack_file_config, stack_file_path
from infra.dryrun.runner import run_program, run_stack_file

TITLE = "Plan scale"
STACK = "a100x8"
NODES = (1, 2, 4, 8, 16)


def run(quick: bool) -> dict:
    rounds = 3 if quick else 7
    path = stack_file_path(STACK)
    config = stack_file_config(path)
    counts = {}

    def nodes(n: int):
        def once() -> float:
            seconds = timed(lambda: counts.__setitem__(n, len(_run(config, n).resources)))
            return seconds

        return once

    variants = {"stack file": lambda: timed(lambda: run_stack_file(path))}
    variants |= {f"{n} nodes": nodes(n) for n in NODES}
    run_stack_file(path)  # warm-up: imports and the first program run
    seconds = {name: median(times) for name, times in interleaved(variants, rounds).items()}
    one = seconds["1 nodes"]
    metrics = [
        metric(f"{path.name} (plan --resources)", seconds["stack file"], "s",
               baseline=one, baseline_label="1-node cluster, same program",
               higher_is_better=False)
    ]  # fmt: skip
    for n in NODES[1:]:
        target = "< 5 s, linear" if n == 16 else "linear"
        metrics.append(
            metric(f"{n} nodes ({counts[n]} resources)", seconds[f"{n} nodes"], "s",
                   baseline=n * one, baseline_label=f"linear: {n} x 1 node", target=target,
                   higher_is_better=False)
        )  # fmt: skip
    return {
        "baseline": "one node's evaluation time, scaled linearly by the node count",
        "setup": f"{path.name} with gpu:nodes overridden, {rounds} interleaved rounds",
        "metrics": metrics,
        "evaluation_s": seconds,
        "resources": counts,
        "notes": [
            f"1 node: {one:.2f} s for {counts[1]} resources; 16 nodes: "
            f"{seconds['16 nodes']:.2f} s for {counts[16]} resources",
            "the node counts are cluster stacks: the queue's MaxCount grows, not the resources",
            "the node-count runs leave out the stack's gpu:trainConfig (its global batch fits "
            "one node's world size); the stack-file run keeps it",
        ],
    }


def _run(config: dict, nodes: int):
    # The stack's job (gpu:trainConfig) fixes a global batch for its own world size, which
    # other node counts need not divide: the scaled runs plan the infrastructure alone.
    scaled = {k: v for k, v in config.items() if k != "gpu:trainConfig"}
    scaled |= {"gpu:cluster": "slurm", "gpu:nodes": nodes}
    return run_program(scaled, stack=STACK, aws_region=config.get("aws:region"))
