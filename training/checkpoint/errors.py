"""The errors of checkpoint saves and loads, shared by every part of the checkpointer."""

from __future__ import annotations


class CheckpointError(RuntimeError):
    """A checkpoint exists but cannot be written, committed or loaded."""


class DiskFullError(CheckpointError):
    """The checkpoint root's filesystem ran out of space during a save."""
