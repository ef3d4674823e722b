"""The options of `hvdazure export` (what runs it: core/script/export.py, with the trainer class
core/trainer_classes.py finds in the script).

argparse only: the CLI builds its parser from here, and `hvdazure --help` loads no framework.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from hvdazure.core.script.export import ExportRequest

P = TypeVar("P", bound=argparse.ArgumentParser)  # the CLI's parser class: its subcommands' parsers are one
FORMATS = ("onnx", "torchscript", "exported_program", "keras", "saved_model")  # PyTorch's, then Keras's


def add_parser(sub: argparse._SubParsersAction[P]) -> P:
    """`hvdazure export CHECKPOINT OUTPUT --script train.py`: the script's model, with a checkpoint's
    weights, exported for serving."""
    export = sub.add_parser(
        "export", help="export a checkpoint's model for serving (ONNX, TorchScript, .keras, ...)",
        description="Build the model of SCRIPT's trainer (its build_model, with the config the checkpoint's "
                    "run was trained with, under --config and --set), load the weights of CHECKPOINT, and "
                    "export it to OUTPUT. The script is imported, not run: its `if __name__ == "
                    "\"__main__\":` block does not train. The artifact is reloaded and checked against the "
                    "model on an example input (the training data's first batch, or --example) before it "
                    "is put in place. One process, no launcher.",
        epilog="examples:\n"
               "  hvdazure export outputs/checkpoints model.onnx --script train.py\n"
               "  hvdazure export outputs/checkpoints model.pt2 --script train.py --which best\n"
               "  hvdazure export outputs/checkpoints/step-00000120 serving --script keras_train.py "
               "--format saved_model",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    export.add_argument("checkpoint", metavar="CHECKPOINT",
                        help="a directory of checkpoints (its --which is taken) or one checkpoint's "
                             "directory; a path or URL (abfs://...)")
    export.add_argument("output", metavar="OUTPUT",
                        help="the file to write (a directory for saved_model); refused if it exists, unless "
                             "--overwrite")
    export.add_argument("--script", required=True, metavar="SCRIPT",
                        help="the training script whose trainer builds the model (imported, not run)")
    export.add_argument("--trainer", metavar="NAME",
                        help="the trainer class, where the script has several")
    export.add_argument("--format", choices=FORMATS,
                        help="default: by OUTPUT's name: .onnx, .pt2 (exported_program), .pt (torchscript), "
                             ".keras, no suffix (saved_model). PyTorch writes the first three, Keras the "
                             "last two")
    export.add_argument("--which", choices=("latest", "best"), default="latest",
                        help="of a directory of checkpoints: the newest that verifies (default), or the best "
                             "by the monitor the run was configured with")
    export.add_argument("--example", metavar="FILE",
                        help="the example input to trace and check on: a .npy file (the model's input) or "
                             ".npz (its inputs, in order); default: the training data's first batch")
    export.add_argument("--config", metavar="YAML",
                        help="a YAML file of TrainConfig fields, over the checkpoint's")
    export.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                        help="override one config field (repeatable), e.g. --set extra.hidden=64")
    export.add_argument("--overwrite", action="store_true", help="replace OUTPUT if it exists")
    export.add_argument("--json", action="store_true", help="print what was written as JSON")
    return export


def export_request(args: argparse.Namespace) -> ExportRequest:
    """What `hvdazure export`'s arguments ask for."""
    from hvdazure.core.script.export import ExportRequest

    return ExportRequest(args.checkpoint, args.which, args.output, args.format, args.example, args.overwrite)


def config_args(args: argparse.Namespace) -> list[str]:
    """The config's arguments, as TrainConfig's command line takes them."""
    given = ["--config", args.config] if args.config else []
    return given + [part for item in args.overrides for part in ("--set", item)]
