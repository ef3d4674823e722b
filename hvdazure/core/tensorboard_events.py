"""A TensorBoard event file of scalars, written without TensorFlow.

tensorboard's own writers (`tensorboard.summary.Writer`, and `torch.utils.tensorboard.SummaryWriter` on top
of the same `EventFileWriter`) create their directory and file through `tf.io.gfile`, which imports
TensorFlow wherever it is installed: seconds of start-up and its oneDNN and absl banners in a PyTorch run.
This writes the events `tensorboard.summary.Writer` writes (a float32 tensor with the scalars plugin's
metadata per value, framed as TFRecords by tensorboard's `RecordWriter`) to a local file with plain Python.
Imported only when a run logs to TensorBoard: the protobuf modules cost a tenth of a second.
"""

from __future__ import annotations

import itertools
import os
import socket
import time
from pathlib import Path

import numpy as np
from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.plugins.scalar import metadata as scalars_metadata
from tensorboard.summary.writer.record_writer import RecordWriter
from tensorboard.util import tensor_util

_files_opened = itertools.count()  # the name's last part: files of one process in one second differ


class EventFile:
    """One new event file in `log_dir` (created if missing), named as TensorBoard's writers name theirs."""

    def __init__(self, log_dir: str | Path) -> None:
        log_dir = Path(log_dir)
        log_dir.mkdir(parents=True, exist_ok=True)
        self.path = log_dir / (f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}."
                               f"{os.getpid()}.{next(_files_opened)}")
        self._records = RecordWriter(open(self.path, "wb"))  # noqa: SIM115  (closed by close())
        self._write(event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2"))

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        """One value of the scalar `tag` at optimizer step `step`."""
        event = event_pb2.Event(wall_time=time.time(), step=step)
        metadata = summary_pb2.SummaryMetadata(
            plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name=scalars_metadata.PLUGIN_NAME),
            data_class=summary_pb2.DataClass.DATA_CLASS_SCALAR)
        event.summary.value.add(tag=tag, tensor=tensor_util.make_tensor_proto(np.float32(value)),
                                metadata=metadata)
        self._write(event)

    def flush(self) -> None:
        """Make what was written visible to TensorBoard (a live view reads the file as it grows)."""
        self._records.flush()

    def close(self) -> None:
        self._records.close()

    def _write(self, event: event_pb2.Event) -> None:
        self._records.write(event.SerializeToString())
