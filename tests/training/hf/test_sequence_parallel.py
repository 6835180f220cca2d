"""A tiny Llama trained with [parallel] sequence = 2 (DeepSpeed Ulysses on gloo) through
`python -m training`, against the same job at sequence = 1; checkpoints resumed across.

One story, four launches: sequence 2 on 2 ranks and sequence 1 on 1 rank from scratch
(the same global batch, so the same losses: the packed documents stay apart in attention
and the loss is weighted by tokens over the group); sequence 2's step-6 checkpoint resumed
at sequence 1, with the uninterrupted run's losses and Adam moments (a gradient scaled by
the group would leave moments off by that factor); sequence 1's resumed at sequence 2 x
data 2 on 4 ranks; both runs export the same weights.
"""

from __future__ import annotations

import pytest
import torch

from tests.training.hf import layout_jobs
from tests.training.hf.layout_jobs import (
    assert_moments_equal,
    assert_same_exported_weights,
    losses,
)
from training.hf.sequence_parallel import document_causal_mask

STEPS, CHECKPOINT = 12, 6
# Each rank's slice of the sums, then an all-reduce: fp32 rounding only (measured: equal to
# 5 decimals). Attention across the packed documents' boundaries, as DeepSpeed's wrapper
# alone would give under SDPA, misses by 7e-4 at step 1 (measured).
LOSS_TOLERANCE = 1e-4
# Two data-parallel ranks average half batches' gradients: another summation order.
DATA_PARALLEL_LOSS_TOLERANCE = 2e-3
MOMENT_RTOL, MOMENT_ATOL = 1e-3, 1e-7


@pytest.mark.multiprocess
# About 60 s alone on 2 cores (measured).
@pytest.mark.slow(
    reason="four tiny-Llama jobs of 1, 2 and 4 ranks (DeepSpeed Ulysses on gloo)", seconds=150
)
def test_sequence_2_trains_as_sequence_1_and_resumes_across_layouts(tmp_path, tiny_hf):
    job = layout_jobs.write_job(tmp_path, tiny_hf, steps=STEPS, checkpoint_every=CHECKPOINT)

    def train(name, ranks, sequence, resume_from=None):
        return layout_jobs.train(
            tmp_path / name,
            job,
            ranks,
            f"parallel.sequence={sequence}",
            resume_from=resume_from and tmp_path / resume_from,
            resume_step=CHECKPOINT,
        )

    split = train("sequence2", ranks=2, sequence=2)
    whole = train("sequence1", ranks=1, sequence=1)
    expected = losses(whole)
    assert list(expected) == list(range(1, STEPS + 1))
    assert losses(split) == pytest.approx(expected, rel=LOSS_TOLERANCE)
    assert expected[STEPS] < expected[1]  # it learns
    assert "tensor 1 x sequence 2 x data 1" in split.stdout  # the run summary's layout

    back = train("back", ranks=1, sequence=1, resume_from="sequence2")
    assert (
        f"step_{CHECKPOINT:08d} was saved by tensor 1 x sequence 2 x data 1 at ZeRO stage 1, "
        "this run is tensor 1 x sequence 1 x data 1 at ZeRO stage 1: converted to a universal "
        "checkpoint (weights and Adam moments) and loaded"
    ) in back.stderr
    assert list(losses(back)) == list(range(CHECKPOINT + 1, STEPS + 1))
    assert losses(back) == pytest.approx({s: expected[s] for s in losses(back)}, rel=LOSS_TOLERANCE)
    assert_moments_equal(tmp_path / "back", tmp_path / "sequence1", STEPS, MOMENT_RTOL, MOMENT_ATOL)

    wider = train("wider", ranks=4, sequence=2, resume_from="sequence1")
    assert "this run is tensor 1 x sequence 2 x data 2" in wider.stderr
    assert losses(wider) == pytest.approx(
        {s: expected[s] for s in losses(wider)}, rel=DATA_PARALLEL_LOSS_TOLERANCE
    )
    assert list(losses(wider)) == list(range(CHECKPOINT + 1, STEPS + 1))

    # Export: the same whole weights as the unsplit run's.
    assert_same_exported_weights(tmp_path / "sequence2", tmp_path / "sequence1")


def test_the_gathered_sequence_attends_within_each_packed_document():
    positions = torch.tensor([[0, 1, 2, 0, 1], [0, 1, 2, 3, 4]])
    mask = document_causal_mask(positions)
    assert mask.shape == (2, 1, 5, 5)
    # Row 0: documents [0, 3) and [3, 5); each token sees itself and its document's past.
    assert mask[0, 0].int().tolist() == [
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [1, 1, 1, 0, 0],
        [0, 0, 0, 1, 0],
        [0, 0, 0, 1, 1],
    ]
    assert mask[1, 0].int().tolist() == torch.ones(5, 5).tril().int().tolist()  # one document
    # One document in every row: plain causal attention, no mask to build.
    assert document_causal_mask(torch.arange(6).expand(3, 6)) is None
