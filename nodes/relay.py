"""One launch of a run, relayed to ComfyUI: its events on the progress bar and the node's UI, Cancel, the result.

RunRelay holds one launcher process. Train Pipeline relays one of them to completion (`relay`); the Wan 2.2
experts pair (nodes/expert_pair.py) relays two, one after the other or side by side (`poll` on each in turn).
Cancel in ComfyUI asks the engine to checkpoint and exit, kills the process group if it does not within a few
seconds, then raises ComfyUI's interrupt. Stop & save (POST /pipetrain/finish, nodes/ui_feed.py) finds a node's
running launches here (`finish_runs`) and asks each to end after its current step as a finished run: the node
returns normally and the rest of the graph runs.
"""
from __future__ import annotations

import atexit
import os
import subprocess
import threading
import time
from pathlib import Path

from ..engine.config.run import RunConfig
from ..engine.events import EventTail
from ..engine.launch import launcher
from ..engine.lora_files import ema_file, is_ema_file
from . import compat, ui_feed
from .runs import RunResult, summary_text
from .step_pace import StepPace
from .train_samples import SampleDecoder

CANCEL_GRACE_S = 7.0  # the engine checkpoints and exits within this; then the group is killed
POLL_S = 0.25
_running: set = set()  # launcher processes alive in this ComfyUI, ended if ComfyUI exits
_by_node: dict[str, list["RunRelay"]] = {}  # ComfyUI node id -> its launches running now (for Stop & save)
_by_node_lock = threading.Lock()  # the server's route reads it from another thread


@atexit.register
def _stop_all_runs() -> None:
    for proc in list(_running):
        launcher.kill_tree(proc, grace=2.0)


class RunFailed(RuntimeError):
    """A launch that ended without its 'done' or 'cancelled' event (the message names the cause and the log)."""


class RunRelay:
    """One launch: start() spawns it, poll() relays what it wrote since (False once it ended), cancel() stops it
    after a checkpoint, close() frees its folder, result() is its RunResult or RunFailed.

    shown: this launch draws the node's chart and progress bar; a launch beside it (the experts pair side by
    side) only logs, as one node has one chart and one bar.
    """

    def __init__(self, cfg: RunConfig, config_path: str, cuda: bool, model_name: str, node_id: str | None = None,
                 vae=None, notice: str = "", shown: bool = True):
        self.cfg, self.config_path, self.cuda, self.model_name, self.notice = cfg, config_path, cuda, model_name, notice
        self.owner = str(node_id) if node_id is not None else ""  # the node Stop & save names (shown or not)
        self.node_id = node_id if shown else None
        self.vae = vae if shown else None
        self.shown = shown
        self.proc = None
        self.decoder = None
        self.closed = False
        self.last = {"step": 0, "total": cfg.train.steps, "loss": float("nan")}
        self.finished, self.errors, self.checkpoint, self.early, self.plan = None, [], None, "", ""
        self.pace = StepPace()

    def start(self) -> "RunRelay":
        cfg = self.cfg
        self.tail = EventTail(cfg.run_dir, start_at_end=True)  # a resumed run's old events are history
        self.feed = ui_feed.RunFeed(self.node_id, cfg.run_name, cfg.run_dir, cfg.train.steps, self.tail.offset)
        if self.notice:
            self.feed.event({"event": "warning", "message": self.notice})
        if self.vae is not None and cfg.sample.every:
            self.decoder = SampleDecoder(cfg.run_dir, self.vae)
        self.log_start = launcher.log_size(cfg.run_dir)
        self.proc = launcher.spawn(cfg, self.config_path, self.cuda, owner=os.getpid())  # kill -9 of ComfyUI stops it
        _running.add(self.proc)
        if self.owner:  # after spawn: the launch removes a finish file left by an earlier attempt
            with _by_node_lock:
                _by_node.setdefault(self.owner, []).append(self)
        self.bar = compat.progress_bar(max(1, cfg.train.steps)) if self.shown else None
        return self

    def poll(self) -> bool:
        """Relay the events written since the last call; whether the launcher is still running."""
        alive = self.proc.poll() is None
        name, last = self.cfg.run_name, self.last
        for ev in self.tail.read_new():
            kind = ev.get("event")
            self.feed.event(ev)
            if kind in ("started", "step", "cancelled", "done"):
                last.update({k: ev[k] for k in ("step", "total", "loss") if k in ev})
                if self.bar is not None:  # ComfyUI's progress hook raises its interrupt here once Cancel is pressed
                    self.bar.update_absolute(last["step"], last["total"])
            if kind == "step":
                self.pace.add(ev["step"], ev.get("time", time.time()))
                _log_progress(name, last, self.pace)
            elif kind == "sample" and self.decoder is not None:
                _show_samples(self.decoder, self.feed, self.bar, ev, last)
            elif kind == "eval":
                compat.log.info("[PipeTrain] %s eval at step %s: loss %.5f", name, ev.get("step"),
                                float(ev.get("loss", float("nan"))))
            elif kind == "warning":
                compat.log.warning("[PipeTrain] %s: %s", name, ev.get("message", ""))
            elif kind == "early_stop":  # eval.early_stop ended the run before its last step
                compat.log.info("[PipeTrain] %s %s", name, ev.get("message", ""))
                self.early = ev.get("message", "")
            elif kind == "finish_requested":  # Stop & save: this step is the last; the final LoRA is saved next
                compat.log.info("[PipeTrain] %s %s", name, ev.get("message", ""))
                self.early = ev.get("message", "")
                self.feed.status("stopping", "saving this step's LoRA, then the graph goes on")
            elif kind == "memory_plan":  # memory plan 'fit': what it chose, predicted peak and s/step
                self.plan = ev.get("message", "")
                compat.log.info("[PipeTrain] %s %s", name, self.plan)
            elif kind in ("done", "cancelled"):
                self.finished = ev
            elif kind == "error":
                self.errors.append(ev)
            elif kind == "checkpoint":
                self.checkpoint = ev
        return alive

    def cancel(self) -> None:
        """Cancel pressed: the engine checkpoints and exits (killed after CANCEL_GRACE_S)."""
        if self.proc is None:
            return
        last = self.last
        self.feed.status("stopping", "writing a checkpoint" if last["step"] else
                         "no step has run yet: nothing to checkpoint")
        launcher.request_cancel(self.cfg.run_dir)
        try:
            self.proc.wait(timeout=CANCEL_GRACE_S)
        except subprocess.TimeoutExpired:
            pass  # killed below
        launcher.kill_tree(self.proc, grace=1.0)
        for ev in self.tail.read_new():  # the engine's last step, checkpoint and 'cancelled' events
            self.feed.event(ev)
            if ev.get("event") == "checkpoint":
                self.checkpoint = ev
        self.feed.status("cancelled", _cancelled_reason(self.cfg.run_name, self.checkpoint))

    def finish(self) -> bool:
        """Stop & save: the engine ends after the current step as if it were the last; whether it was running."""
        if self.proc is None or self.proc.poll() is not None:
            return False
        launcher.request_finish(self.cfg.run_dir)
        return True

    def stop(self, reason: str) -> None:
        """End a launch whose partner failed: the same as Cancel, with the reason on its status line."""
        self.cancel()
        if self.proc is not None:
            self.feed.status("cancelled", reason)

    def close(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            launcher.kill_tree(self.proc)
        _running.discard(self.proc)
        with _by_node_lock:
            mine = _by_node.get(self.owner, [])
            if self in mine:
                mine.remove(self)
            if not mine:
                _by_node.pop(self.owner, None)
        launcher.release(self.cfg, self.proc)
        if self.decoder is not None and not self.closed:
            self.decoder.close()  # its latest images stay for result()
        self.closed = True

    def follow(self) -> tuple:
        """Start, relay until the launch ends (Cancel in ComfyUI cancels it after a checkpoint), then result()."""
        try:
            self.start()
            while self.poll():
                compat.raise_if_interrupted()
                time.sleep(POLL_S)
        except compat.InterruptProcessingException:
            self.cancel()
            raise
        finally:
            self.close()
        return self.result()

    def result(self) -> tuple[RunResult, str, dict]:
        """(RunResult, summary text, the node's ui dict) of a launch that ended; RunFailed if it did not finish."""
        cfg, proc, last = self.cfg, self.proc, self.last
        if proc.returncode != 0 or self.finished is None:
            error_message = launcher.failure_cause(cfg, proc, self.errors, self.log_start)  # names a killed rank
            hint = error_message or "see the log above; the full log is train.log in the run folder"
            self.feed.status("failed", hint if error_message else f"exit code {proc.returncode}: {hint}")
            raise RunFailed(
                f"PipeTrain training failed (exit code {proc.returncode}) in {cfg.run_dir}.\nCause: {hint}\n"
                f"Last lines of train.log:\n{launcher.log_tail(cfg.run_dir, 40)}")
        status = self.finished["event"]
        lora_path = self.finished.get("lora") or newest_lora(cfg.run_dir)
        ema_path = ema_file(lora_path) if lora_path and cfg.train.ema_decay > 0 else None
        result = RunResult(run_dir=cfg.run_dir, run_name=cfg.run_name, lora_path=lora_path, steps=int(last["step"]),
                           total_steps=int(last["total"]), final_loss=float(last["loss"]), model_name=self.model_name,
                           status=status, ema_path=str(ema_path) if ema_path and ema_path.is_file() else "")
        text = summary_text(result) + "".join(f"\n{line}" for line in (self.plan, self.early) if line)
        self.feed.status(status)
        ui = {"text": [text]}
        if self.decoder is not None and self.decoder.latest:
            ui["images"] = self.decoder.latest  # the newest samples stay on the node as its preview
        return result, text, ui


def relay(cfg: RunConfig, config_path: str, cuda: bool, model_name: str, node_id: str | None = None, vae=None,
          notice: str = ""):
    """Run the launcher to completion, mirroring its events on ComfyUI's progress bar and the node's UI."""
    result, text, ui = RunRelay(cfg, config_path, cuda, model_name, node_id=node_id, vae=vae, notice=notice).follow()
    return {"ui": ui, "result": (result, text)}


def finish_runs(node_id: str) -> list[str]:
    """Stop & save for a node: ask each of its running launches (both of a Wan 2.2 experts pair side by side, the
    one running now of a pair one after the other) to end after its current step; their run names, [] for none."""
    with _by_node_lock:
        relays = list(_by_node.get(str(node_id), []))
    return [run.cfg.run_name for run in relays if run.finish()]


def _show_samples(decoder: SampleDecoder, feed: ui_feed.RunFeed, bar, event: dict, last: dict) -> None:
    """Decode a sample event's latents with the graph's VAE; show the first as the node's preview."""
    try:
        refs = decoder.decode(event)
    except compat.InterruptProcessingException:
        raise  # Cancel pressed while decoding (ComfyUI's VAE checks for it): the relay cancels the run
    except Exception as e:  # noqa: BLE001 - a sample that cannot be decoded must not stop training
        message = f"could not decode the samples of step {event.get('step')} with the connected VAE ({e})"
        compat.log.warning("[PipeTrain] %s", message)
        feed.event({"event": "warning", "step": event.get("step"), "message": message})
        return
    feed.samples(int(event["step"]), refs, list(event.get("prompts", [])))
    if decoder.latest_pil is not None and bar is not None:
        bar.update_absolute(last["step"], last["total"], ("JPEG", decoder.latest_pil, 512))


def newest_lora(run_dir: str) -> str:
    files = sorted((p for p in (Path(run_dir) / "lora").glob("*.safetensors") if not is_ema_file(p)),
                   key=lambda p: p.stat().st_mtime)
    return str(files[-1]) if files else ""


def _cancelled_reason(run_name: str, checkpoint: dict | None) -> str:
    """What a cancelled run left and how to go on (the node's status line after Cancel)."""
    if checkpoint is None:
        return "no checkpoint was written (no step had run): queue it again to start over"
    kept = f"{run_name}/checkpoints/{os.path.basename(str(checkpoint.get('path', '')))}"
    return f"set resume to {run_name} (or latest) to continue from step {checkpoint.get('step')} ({kept})"


def _log_progress(name: str, last: dict, pace: StepPace) -> None:
    step, total = last["step"], max(1, last["total"])
    if step == 1 or step % max(1, total // 20) == 0 or step == total:
        eta = pace.eta_seconds(total)  # the node's status line shows the same (web/chart.js etaSeconds)
        compat.log.info("[PipeTrain] %s step %d/%d loss %.4f, ETA %s", name, step, total, last["loss"],
                        "?" if eta is None else f"{eta:.0f} s")
