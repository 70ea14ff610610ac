"""Run by tests: ``vitkit train RECIPE [overrides] [--resume CHECKPOINT]`` in this process, as the
command runs it, each rank's process ending at once (``os._exit``, as a killed process does: no
clean-up, no handler) right after the end of epoch ``--die-after-epoch``, once ``last.ckpt`` of that
epoch is written. Lightning starts the other ranks with this script's own arguments."""

from __future__ import annotations

import argparse
import os
import sys

import lightning as L

from vitkit.train import train

#: The exit status of a process that ended at --die-after-epoch (SIGKILL's, as a shell reports it).
KILLED = 137


class DieAfterEpoch(L.Callback):
    """End the process after epoch ``epoch`` (0-based) once the callbacks before this one saved."""

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.current_epoch == self.epoch:
            sys.stdout.flush()
            os._exit(KILLED)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("recipe")
    parser.add_argument("overrides", nargs="*")
    parser.add_argument("--resume")
    parser.add_argument("--die-after-epoch", type=int)
    args = parser.parse_args()
    callbacks = [DieAfterEpoch(args.die_after_epoch)] if args.die_after_epoch is not None else []
    result = train(args.recipe, args.overrides, resume=args.resume, callbacks=callbacks)
    if result.primary:
        print(f"run directory: {result.run_dir}")


if __name__ == "__main__":
    main()
