"""Ulysses sequence parallelism for a Hugging Face model (DeepSpeed's ALST,
https://www.deepspeed.ai/tutorials/ulysses-alst-sequence-parallelism/).

Each rank of a ``parallel.sequence``-way group holds a slice of every sequence; inside each
attention layer two all-to-alls trade that for the whole sequence and a slice of the heads
(UlyssesSPAttentionHF, deepspeed/runtime/sequence_parallel/ulysses_sp.py, DeepSpeed 0.19.8).
DeepSpeed registers that attention in transformers' table and builds the groups
(``register_with_transformers``: ranks ``i*sequence .. (i+1)*sequence - 1`` form group i,
parallel_state_sp.py). What the trainer adds:

- The slicing. Every rank of a group reads the same micro-batch (the sampler is keyed by
  data-parallel rank, so a change of layout resumes at the same sample) and keeps its own
  slice of the tokens, targets and positions. DeepSpeed's UlyssesSPDataLoaderAdapter would
  instead gather one batch per rank and hand them out in turns.
- The loss. A rank's share is its slice's summed token losses over the group's count of
  tokens that are predicted: the shares add up to the whole sequence's mean loss, whose
  gradient DeepSpeed then sums over the group (ZeRO divides the sum over a
  sequence-and-data group by its data-parallel ranks only: stage_1_and_2.py
  ``average_tensor``, stage3.py ``__avg_scatter_grads``). The value every rank reports is the
  group's total, so the trainer's mean over ranks is the batch's loss.
- Document boundaries. DeepSpeed's wrapper drops transformers' attention mask (it was
  built for the local slice) and gathers the position ids, which restart at each packed
  document. Flash attention keeps documents apart from those positions; PyTorch's SDPA
  would attend across them, so under SDPA the causal mask is rebuilt per document from the
  gathered positions, as transformers builds it without sequence parallelism
  (masking_utils.py ``find_packed_sequence_indices``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn


@dataclass(frozen=True)
class SequenceGroup:
    """This rank's place in its sequence-parallel group."""

    group: object  # the torch.distributed process group
    rank: int
    size: int

    def slice(self, tensor: torch.Tensor) -> torch.Tensor:
        """This rank's equal share of `tensor`'s sequence dimension (dim 1)."""
        width = tensor.shape[1] // self.size
        return tensor[:, self.rank * width : (self.rank + 1) * width]

    def share_of_loss(self, summed: torch.Tensor, counted: torch.Tensor) -> torch.Tensor:
        """The loss this rank backpropagates, `summed` over the group's `counted` tokens,
        valued at the group's whole loss."""
        totals = torch.stack([summed.detach().float(), counted.float()])
        dist.all_reduce(totals, group=self.group)
        share = summed / totals[1].clamp(min=1)
        whole = totals[0] / totals[1].clamp(min=1)
        return share + (whole - share).detach()


def register_ulysses(model: nn.Module, attention: str, sequence: int, micro_batch: int):
    """Install Ulysses for `model` (a transformers model loaded with `attention`): returns
    the groups object for ``deepspeed.initialize``'s ``mpu`` (UlyssesGroups, below) and this
    rank's SequenceGroup. Once per process, after the process group is up."""
    from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPAttentionHF
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    if attention == "sdpa":
        ALL_ATTENTION_FUNCTIONS["sdpa"] = _within_documents(ALL_ATTENTION_FUNCTIONS["sdpa"])
    ulysses = UlyssesSPAttentionHF.register_with_transformers(
        model_name_or_path=model,
        core_attn_implementation=attention,
        sequence_parallel_size=sequence,
        micro_batch_size=micro_batch,
    )
    group = ulysses.get_sequence_parallel_group()
    return UlyssesGroups(ulysses), SequenceGroup(
        group, dist.get_rank(group), dist.get_world_size(group)
    )


class UlyssesGroups:
    """DeepSpeed's Ulysses groups (parallel_state_sp.py) without their alias of model
    parallelism to sequence parallelism. With the alias the engine writes the sequence
    degree into every checkpoint as its tensor degree (engine.py
    ``_checkpoint_parallel_metadata``), and ds_to_universal then refuses the checkpoint
    ("model-state file count 1 does not match pp_degree=1 * tp_degree=2",
    checkpoint/reshape_3d_utils.py): no change of layout could resume it. Every rank of a
    sequence group holds whole weights, so model parallelism is 1 here, over a group of
    this rank alone (DeepSpeed all-reduces gradient norms over it). Ulysses' own object
    also lacks the tensor-parallel names a universal checkpoint's load asks for."""

    def __init__(self, ulysses):
        # Every rank takes part in creating every group (torch.distributed.new_group).
        alone = [dist.new_group([rank]) for rank in range(dist.get_world_size())]
        self._alone = alone[dist.get_rank()]
        # DeepSpeed tells Ulysses' groups object from Megatron's by this attribute
        # (utils/groups.py, _get_data_parallel_world_size).
        self.initialize_sequence_parallel = ulysses.initialize_sequence_parallel
        self.get_sequence_parallel_group = ulysses.get_sequence_parallel_group
        self.get_sequence_parallel_world_size = ulysses.get_sequence_parallel_world_size
        self.get_sequence_parallel_rank = ulysses.get_sequence_parallel_rank
        self.get_sequence_data_parallel_group = ulysses.get_sequence_data_parallel_group
        self.get_sequence_data_parallel_world_size = ulysses.get_sequence_data_parallel_world_size
        self.get_sequence_data_parallel_rank = ulysses.get_sequence_data_parallel_rank

    def get_model_parallel_group(self):
        return self._alone

    def get_model_parallel_world_size(self) -> int:
        return 1

    def get_model_parallel_rank(self) -> int:
        return 0

    # Loading a universal checkpoint asks for the tensor degree by this name
    # (base_optimizer.py, load_hp_checkpoint_state_from_checkpoint_dir).
    get_tensor_model_parallel_group = get_model_parallel_group
    get_tensor_model_parallel_world_size = get_model_parallel_world_size
    get_tensor_model_parallel_rank = get_model_parallel_rank


def _within_documents(sdpa):
    """transformers' SDPA attention, causal within each document of the gathered
    `position_ids` (a document starts where its position is 0)."""

    def attend(module, query, key, value, attention_mask, *args, position_ids=None, **kwargs):
        if attention_mask is None and position_ids is not None:
            attention_mask = document_causal_mask(position_ids)
        return sdpa(
            module, query, key, value, attention_mask, *args, position_ids=position_ids, **kwargs
        )

    return attend


def document_causal_mask(position_ids: torch.Tensor) -> torch.Tensor | None:
    """[batch, 1, seq, seq] booleans, True where a token may attend: itself and the earlier
    tokens of its document. None when every row is one document (plain causal attention)."""
    starts = position_ids == 0
    starts[:, 0] = True
    if not starts[:, 1:].any():
        return None
    document = starts.cumsum(dim=1)
    same = document[:, :, None] == document[:, None, :]
    seq = position_ids.shape[1]
    causal = torch.ones(seq, seq, dtype=torch.bool, device=position_ids.device).tril()
    return (same & causal)[:, None]
