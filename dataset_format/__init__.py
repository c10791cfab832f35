"""The dataset format, one home for it: columns and schema, the card, validation, writing and reading.

A dataset is a directory (or an s3:// prefix) of Parquet files (one row per transition, RLlib's column names)
plus `_card.json`.
Collectors write it, training and users read it; datasets/README.md documents the format for people.
"""

from dataset_format.card import (
    CARD_FILE,
    SCHEMA_VERSION,
    DatasetCard,
    episode_bounds,
    episode_stats,
    read_card,
    summarize,
)
from dataset_format.frames import FrameStore, StackedObservations, load_frame_arrays, read_frames
from dataset_format.location import Location, locate
from dataset_format.readers import (
    RowGroups,
    load_arrays,
    load_pandas,
    load_ray,
    load_table,
    read_row_groups,
    read_table,
    row_group_runs,
    size_on_disk,
    torch_dataloader,
)
from dataset_format.schema import (
    Col,
    FrameColumn,
    FrameNumbering,
    arrow_schema,
    column_to_numpy,
    flat_dim,
    is_frames_type,
    require_storable,
    space_from_dict,
    space_to_dict,
    stored_as_bytes,
    transitions_table,
)
from dataset_format.validation import validate
from dataset_format.writer import refuse_existing, write, write_tables

__all__ = [
    "CARD_FILE",
    "SCHEMA_VERSION",
    "Col",
    "DatasetCard",
    "FrameColumn",
    "FrameNumbering",
    "FrameStore",
    "Location",
    "RowGroups",
    "StackedObservations",
    "arrow_schema",
    "column_to_numpy",
    "episode_bounds",
    "episode_stats",
    "flat_dim",
    "is_frames_type",
    "load_arrays",
    "load_frame_arrays",
    "load_pandas",
    "load_ray",
    "load_table",
    "locate",
    "read_card",
    "read_frames",
    "read_row_groups",
    "read_table",
    "refuse_existing",
    "row_group_runs",
    "size_on_disk",
    "space_from_dict",
    "require_storable",
    "space_to_dict",
    "stored_as_bytes",
    "summarize",
    "torch_dataloader",
    "transitions_table",
    "validate",
    "write",
    "write_tables",
]
