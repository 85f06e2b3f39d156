// PipeTrain's training view, the pure part: run state from messages, loss smoothing, ETA and the
// chart's layout (chart_draw.js draws it on any CanvasRenderingContext2D-like object). No DOM or
// ComfyUI imports, so tests/ui/chart.test.mjs runs it under plain node.

/** A fresh run state. steps: [[step, loss, lr, time, grad norm or null], ...] in step order (the grad norm is
 *  the gradient norm before clipping; runs from before it have none); evals: [[step, eval loss], ...]. */
export function emptyRun(run = "", total = 0) {
  return { run, total, steps: [], evals: [], samples: [], status: "idle", reason: "", warnings: [], log: [] };
}

/** Whether run folder `run` is the run a TrainPipeline node's settings name: with resume off, its
 *  run_name or that name with the _2, _3... suffix a taken name gets (nodes/runs.py new_run_dir);
 *  when resuming, the named run (any run for "latest", the newest one with a checkpoint). */
export function runMatches(run, { runName = "", resume = "off" } = {}) {
  if (!run) return false;
  if (resume && resume !== "off") return resume === "latest" || run === resume;
  const name = String(runName).trim();
  return !!name && (run === name || (run.startsWith(`${name}_`) && /^\d+$/.test(run.slice(name.length + 1))));
}

const FINISHED = new Set(["done", "cancelled", "failed"]);
// What a run's state keeps, however long it trains (all samples stay in the run folder): the strip
// shows the newest 8 images, the status line the newest warning. nodes/ui_feed.py keeps as many.
export const KEEP_SAMPLES = 8;
export const KEEP_WARNINGS = 16;

/** Apply one engine event ({event, step, loss, lr, time, ...}) to a run state (returns the state). */
export function applyEvent(state, ev) {
  if (!ev || typeof ev !== "object") return state;
  if (Number.isFinite(ev.total) && ev.total > 0) state.total = ev.total;
  switch (ev.event) {
    case "started":
      state.status = "training";
      break;
    case "step": {
      if (!Number.isFinite(ev.loss)) break;
      const rec = [ev.step, ev.loss, Number.isFinite(ev.lr) ? ev.lr : 0, Number.isFinite(ev.time) ? ev.time : 0,
        Number.isFinite(ev.grad_norm) ? ev.grad_norm : null];
      const last = state.steps[state.steps.length - 1];
      if (!last || last[0] < ev.step) state.steps.push(rec);
      else {
        // a resumed run repeats steps: keep the newest value at its place
        const i = state.steps.findIndex((r) => r[0] >= ev.step);
        if (state.steps[i][0] === ev.step) state.steps[i] = rec;
        else state.steps.splice(i, 0, rec);
      }
      if (!FINISHED.has(state.status)) state.status = ev.step >= state.total && state.total > 0 ? "saving" : "training";
      break;
    }
    case "eval": // the held-out eval loss (engine/train/eval_set.py); a resumed run's repeat replaces it
      if (!Number.isFinite(ev.loss)) break;
      state.evals = (state.evals || []).filter((r) => r[0] !== ev.step).concat([[ev.step, ev.loss]]);
      state.evals.sort((a, b) => a[0] - b[0]);
      break;
    case "sampling":
      if (!FINISHED.has(state.status)) state.status = "sampling";
      break;
    case "sample":
      if (!FINISHED.has(state.status)) state.status = "training";
      break;
    case "saved":
    case "checkpoint":
      if (!FINISHED.has(state.status) && state.status !== "stopping") state.status = "training";
      break;
    case "setup":  // a setup phase of the rank ended (engine/train/setup_phases.py)
      state.phase = ev.phase || "";
      state.since = Number.isFinite(ev.since) ? ev.since : state.since || ev.time; // when the rank started
      break;
    case "memory_plan": // memory plan 'fit' (engine/train/fit_setup.py): what it chose, or that nothing fits
      state.plan = planText(ev);
      break;
    case "memory_plan_check": // the first step measured against the plan
      if (Number.isFinite(ev.measured_peak_gib)) state.plan = `${state.plan || "plan"} · step 1 peak ${ev.measured_peak_gib.toFixed(2)} GiB`;
      break;
    case "warning":
      if (ev.message && !state.warnings.includes(ev.message)) {
        state.warnings = state.warnings.concat([ev.message]).slice(-KEEP_WARNINGS);
      }
      break;
    case "done":
    case "cancelled":
      state.status = ev.event;
      break;
    case "error":
      state.status = "failed";
      state.reason = ev.message || state.reason;
      break;
  }
  return state;
}

/** The status line's words for a memory_plan event: the chosen settings, predicted peak and s/step. */
export function planText(ev) {
  const c = ev.chosen;
  if (!c) return `plan: nothing fits in ${ev.budget_gib} GiB`;
  const parts = [`checkpointing ${c.checkpointing}`];
  if (c.block_swap) parts.push(`block swap ${c.block_swap}`);
  if (c.fp8) parts.push("fp8 base");
  parts.push(c.optimizer, `${Number(c.peak_gib).toFixed(2)}/${ev.budget_gib} GiB`, `~${Number(c.seconds).toFixed(2)} s/step`);
  return `plan${ev.reused ? " (saved)" : ""}: ${parts.join(", ")}`;
}

/** Apply one `pipetrain.run` message ({type: reset|event|samples|status, ...}); returns the state. */
export function applyMessage(state, msg) {
  if (!msg) return state;
  if (msg.type === "reset" || !state || (msg.run && state.run && msg.run !== state.run)) {
    state = emptyRun(msg.run || "", msg.total || 0);
    state.status = msg.status || "loading";
    if (msg.type === "reset") return state;
  }
  if (msg.type === "event") applyEvent(state, msg.event);
  else if (msg.type === "samples") {
    state.samples = state.samples.filter((s) => s.step !== msg.step);
    state.samples.push({ step: msg.step, images: msg.images || [], prompts: msg.prompts || [] });
    state.samples = state.samples.slice(-KEEP_SAMPLES);
  } else if (msg.type === "status") {
    state.status = msg.status;
    if (msg.reason) state.reason = msg.reason;
    if (Array.isArray(msg.log)) state.log = msg.log;
  }
  return state;
}

/** The state a reloaded page rebuilds from GET /pipetrain/run_state (same reducer as live messages). */
export function stateFromSnapshot(snap) {
  let state = emptyRun(snap.run, snap.total);
  state.status = "loading";
  for (const ev of snap.events || []) applyEvent(state, ev);
  for (const s of snap.samples || []) state = applyMessage(state, { type: "samples", run: snap.run, ...s });
  if (snap.status && snap.status !== "loading") state.status = snap.status;
  if (snap.reason) state.reason = snap.reason;
  if (Array.isArray(snap.log)) state.log = snap.log;
  return state;
}

/** TensorBoard-style exponential moving average, debiased so the first points are not pulled to 0. */
export function smooth(values, weight = 0.9) {
  const out = [];
  let acc = 0;
  let n = 0;
  for (const v of values) {
    if (!Number.isFinite(v)) {
      out.push(out.length ? out[out.length - 1] : NaN);
      continue;
    }
    acc = acc * weight + (1 - weight) * v;
    n += 1;
    out.push(weight === 0 ? v : acc / (1 - Math.pow(weight, n)));
  }
  return out;
}

/** Smoothing weight for n points: more points, smoother (0.6 for a handful up to 0.98). */
export function autoWeight(n) {
  if (n < 10) return 0.6;
  return Math.min(0.98, 1 - 3 / Math.sqrt(n));
}

/** Seconds left, from the pace of the recent steps (event times), or null when unknown. */
export function etaSeconds(steps, total, window = 50) {
  if (!total || steps.length < 2) return null;
  const last = steps[steps.length - 1];
  if (last[0] >= total) return 0;
  const first = steps[Math.max(0, steps.length - 1 - window)];
  const dt = last[3] - first[3];
  const ds = last[0] - first[0];
  if (!(dt > 0) || !(ds > 0)) return null;
  return (dt / ds) * (total - last[0]);
}

export function formatDuration(seconds) {
  if (seconds === null || !Number.isFinite(seconds)) return "?";
  const s = Math.max(0, Math.round(seconds));
  const h = Math.floor(s / 3600);
  const m = Math.floor((s % 3600) / 60);
  const sec = String(s % 60).padStart(2, "0");
  return h ? `${h}:${String(m).padStart(2, "0")}:${sec}` : `${m}:${sec}`;
}

const STATUS_WORDS = {
  idle: "not started", loading: "loading the model", training: "training", sampling: "rendering samples",
  saving: "saving", stopping: "stopping", done: "done", cancelled: "cancelled", failed: "failed",
  caching: "caching latents", queued: "queued",
};

/** A gradient norm in 3 significant digits ("0.0123", "4.56", "1.23e+3"). */
export function formatNorm(v) {
  return v >= 1e-3 && v < 1e4 ? String(Number(v.toPrecision(3))) : v.toExponential(2);
}

// What the rank does after each setup phase ends (engine/train/loop.py's phases.done names).
const NEXT_PHASE = {
  distributed_init: "checking the nodes", node_checks: "reading the model file", model_load: "checking the block forwards",
  block_probe: "adding the LoRA", lora: "applying the memory options", memory_options: "starting the engine",
  engine: "loading the checkpoint", resume: "the first step (compiles first with compile_blocks)",
};

/** While loading: what the rank does now and the time since it started ("reading the model file · 0:12"). */
export function loadingDetail(state, now = Date.now() / 1000) {
  const parts = [];
  if (state.phase && NEXT_PHASE[state.phase]) parts.push(NEXT_PHASE[state.phase]);
  if (state.since && now >= state.since) parts.push(formatDuration(now - state.since));
  return parts.join(" · ");
}

/** One status line, e.g. "training · step 12/60 · loss 0.1234 · grad norm 0.456 · ETA 0:34". */
export function statusLine(state) {
  const word = STATUS_WORDS[state.status] || state.status;
  const parts = [word];
  const last = state.steps[state.steps.length - 1];
  if (last) parts.push(`step ${last[0]}/${state.total || "?"}`, `loss ${last[1].toFixed(4)}`);
  if (last && Number.isFinite(last[4])) parts.push(`grad norm ${formatNorm(last[4])}`);
  if (["training", "sampling", "saving"].includes(state.status)) {
    const eta = etaSeconds(state.steps, state.total);
    if (eta !== null) parts.push(`ETA ${formatDuration(eta)}`);
  }
  if (state.status === "loading" && !last) {
    const detail = loadingDetail(state);
    if (detail) parts.push(detail);
  }
  if (state.plan) parts.push(state.plan);
  let line = parts.join(" · ");
  // failed: the cause; cancelled: where the checkpoint is and how to continue; stopping: what it waits for
  if (["failed", "cancelled", "stopping"].includes(state.status) && state.reason) line += ` — ${state.reason}`;
  return line;
}

/** Round tick values covering [min, max] (about `count` of them). */
export function niceTicks(min, max, count = 5) {
  if (!Number.isFinite(min) || !Number.isFinite(max)) return [];
  if (max === min) return [min];
  const raw = (max - min) / Math.max(1, count);
  const mag = Math.pow(10, Math.floor(Math.log10(raw)));
  const step = [1, 2, 5, 10].map((f) => f * mag).find((s) => s >= raw) || 10 * mag;
  return ticksEvery(min, max, step);
}

function ticksEvery(min, max, step) {
  const ticks = [];
  for (let v = Math.ceil(min / step - 1e-9) * step; v <= max + step * 1e-9; v += step) ticks.push(Number(v.toPrecision(12)));
  return ticks;
}

/** A y axis of round ticks: [min, max] widened to multiples of a 1/2/2.5/5 step chosen so that
 *  `lo`..`hi` ticks (5-6) cover it; {min, max, step, ticks}. */
export function niceRange(min, max, lo = 5, hi = 6) {
  if (!Number.isFinite(min) || !Number.isFinite(max) || max <= min) return { min, max, step: 0, ticks: [min] };
  const target = (lo + hi) / 2;
  let best = null;
  const mag0 = Math.floor(Math.log10((max - min) / target));
  for (let e = mag0 - 1; e <= mag0 + 1; e++) {
    for (const f of [1, 2, 2.5, 5]) {
      const step = f * Math.pow(10, e);
      const a = Math.floor(min / step + 1e-9) * step;
      const b = Math.ceil(max / step - 1e-9) * step;
      const n = Math.round((b - a) / step) + 1;
      const miss = n < lo ? lo - n : n > hi ? n - hi : 0;
      if (!best || miss < best.miss || (miss === best.miss && step > best.step)) best = { miss, step, a, b };
    }
  }
  const { step, a, b } = best;
  return { min: Number(a.toPrecision(12)), max: Number(b.toPrecision(12)), step, ticks: ticksEvery(a, b, step) };
}

/** At most `maxPoints` points kept, each bucket's min and max (spikes stay visible). */
export function downsample(points, maxPoints) {
  if (points.length <= maxPoints) return points;
  const buckets = Math.max(1, Math.floor(maxPoints / 2));
  const size = points.length / buckets;
  const out = [];
  for (let b = 0; b < buckets; b++) {
    const part = points.slice(Math.floor(b * size), Math.floor((b + 1) * size));
    if (!part.length) continue;
    let lo = part[0];
    let hi = part[0];
    for (const p of part) {
      if (p[1] < lo[1]) lo = p;
      if (p[1] > hi[1]) hi = p;
    }
    out.push(...(lo[0] <= hi[0] ? [lo, hi] : [hi, lo]).filter((p, i, a) => i === 0 || p !== a[0]));
  }
  return out;
}

// Room around the plot: the legend above, loss ticks and title left, LR ticks right, step ticks and title below.
export const PAD = { left: 56, right: 44, top: 18, bottom: 32 };

/** Right end of the x axis: the whole run (its total steps, also before the first step); a run
 *  without a known total ends at its newest step. */
export function xEnd(lastStep, total) {
  return Math.max(lastStep, total > 0 ? total : 1);
}

/** Scales for the chart: x over steps (0..xEnd), y over the loss range (and extraYs, the eval
 *  losses) with a little margin, widened to 5-6 round ticks (yTicks). */
export function layout(steps, total, width, height, pad = PAD, extraYs = []) {
  const xs = steps.map((r) => r[0]);
  const ys = steps.map((r) => r[1]).concat(extraYs).filter(Number.isFinite);
  const x0 = 0;
  const x1 = xEnd(xs.length ? xs[xs.length - 1] : 0, total);
  let y0 = ys.length ? Math.min(...ys) : 0;
  let y1 = ys.length ? Math.max(...ys) : 1;
  if (y1 - y0 < 1e-12) {
    y0 -= 0.5 * Math.abs(y0 || 1);
    y1 += 0.5 * Math.abs(y1 || 1);
  }
  const margin = (y1 - y0) * 0.05;
  const range = niceRange(y0 - margin, y1 + margin);
  y0 = range.min;
  y1 = range.max;
  const w = Math.max(1, width - pad.left - pad.right);
  const h = Math.max(1, height - pad.top - pad.bottom);
  return {
    x0, x1, y0, y1, pad, width, height, yTicks: range.ticks,
    sx: (s) => pad.left + ((s - x0) / (x1 - x0)) * w,
    sy: (v) => pad.top + (1 - (v - y0) / (y1 - y0)) * h,
    stepAt: (px) => x0 + ((px - pad.left) / w) * (x1 - x0),
  };
}

/** The recorded step nearest to step value `s` (binary search), or null. */
export function nearestStep(steps, s) {
  if (!steps.length) return null;
  let lo = 0;
  let hi = steps.length - 1;
  while (hi - lo > 1) {
    const mid = (lo + hi) >> 1;
    if (steps[mid][0] < s) lo = mid;
    else hi = mid;
  }
  return Math.abs(steps[lo][0] - s) <= Math.abs(steps[hi][0] - s) ? steps[lo] : steps[hi];
}
