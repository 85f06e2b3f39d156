"""The files in a run folder that tell a running run to end (the launcher and the node write them, a shell user
may touch them, engine/train/stop_flag.py reads them once per optimizer step):
- CANCEL_FILE: checkpoint and stop, as a cancelled run;
- FINISH_FILE (Stop & save): the step under way is the run's last, and it ends as a finished run."""

CANCEL_FILE = "cancel"
FINISH_FILE = "finish"
