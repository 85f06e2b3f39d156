// PipeTrain's ComfyUI extension.
// - TrainPipeline, SaveLoRA, LoadDataset and CacheLatents show the text summary they return
//   ({"ui": {"text": [...]}}: the dataset nodes' report of skipped and altered files).
// - TrainPipeline gets a training view, its first widget: status line (caching, loading, training, sampling, saving,
//   cancelled, failed + reason), step / total / loss / grad norm / ETA, a live loss chart (raw +
//   smoothed; LR and gradient norm on hover) and a strip of the newest samples. While its run trains, a
//   "Stop & save" button beside the status line POSTs /pipetrain/finish: the run ends after the current step
//   as a finished one (final LoRA, checkpoint) and the rest of the graph runs. It is fed by
//   `pipetrain.run` messages keyed by node id (nodes/ui_feed.py) and, after a page reload, by
//   GET /pipetrain/run_state?node=<id>. A node shows only the run its settings name (run_name, or the
//   run it resumes: runMatches); queueing a prompt resets its view until its run reports (or the
//   prompt reuses its cached result); a failed run shows its error and the last lines of its log.
// - The multiline `folders` and `sample_prompts` boxes keep their name above their text.
// - A workflow saved before the rarely changed settings moved to Train Options is converted on load
//   (legacy_workflows.js).
// The state, smoothing and layout live in chart.js, the drawing in chart_draw.js (pure, unit-tested under node),
// the summary and labelled text boxes in text_boxes.js.
// Only the frontend's public extension API is used: `app` and `api` from scripts/app.js and
// scripts/api.js, the registerExtension hooks, LiteGraph's node.addDOMWidget and api events. Other
// scripts/*.js modules are the frontend's internals (tests/unit/test_ui_chart.py fails on an import of one).
import { app } from "../../scripts/app.js";
import { api } from "../../scripts/api.js";
import { applyMessage, emptyRun, runMatches, stateFromSnapshot, statusLine } from "./chart.js";
import { drawChart } from "./chart_draw.js";
import { addOptionsNode, convertOldNode } from "./legacy_workflows.js";
import { fitNode, labelBox, showText } from "./text_boxes.js";

const NODES_WITH_SUMMARY = new Set(["PipeTrainTrainPipeline", "PipeTrainSaveLoRA", "PipeTrainLoadDataset",
  "PipeTrainCacheLatents"]);
const TRAIN_NODE = "PipeTrainTrainPipeline";
const STRIP_IMAGES = 8;
const CHART_HEIGHT = 170;
const STRIP_HEIGHT = 72;
const LABELLED_BOXES = new Set(["folders", "sample_prompts"]); // multiline inputs whose placeholder is their only name
const SETTINGS = ["run_name", "resume", "steps"]; // the widgets that decide which run (and axis) the view shows
const RUNNING = new Set(["loading", "training", "sampling", "saving"]); // statuses Stop & save can end
const FINISH_TIP = "End training after this step and keep it: the LoRA of this step is saved as the final one, "
  + "with a checkpoint, and the rest of the graph runs (Cancel stops everything)";
const runs = new Map(); // node id (string) -> run state

function settings(node) {
  const value = (name) => node.widgets?.find((w) => w.name === name)?.value;
  return { runName: String(value("run_name") ?? ""), resume: String(value("resume") ?? "off"),
           steps: Number(value("steps")) || 0 };
}

function imageUrl(ref) {
  const q = new URLSearchParams({ filename: ref.filename, subfolder: ref.subfolder || "", type: ref.type || "output" });
  return api.apiURL(`/view?${q}`);
}

// The training view's height: status, chart, strip, scroll hint, the gaps between them and the margin.
const STATUS_LINE = 14; // px per line of the status text
const viewHeight = () => 2 * STATUS_LINE + CHART_HEIGHT + STRIP_HEIGHT + 14 + 3 * 4 + 20;

function buildView(node) {
  const root = document.createElement("div");
  root.className = "pipetrain-view";
  root.style.cssText = "display:flex;flex-direction:column;gap:4px;font:11px sans-serif;color:var(--input-text,#ddd);"
    + "overflow:hidden;";
  // The status line and, while the run trains, the Stop & save button at its right: one row of fixed height,
  // so the view keeps its size whether the button shows or not.
  const head = document.createElement("div");
  head.style.cssText = `display:flex;gap:4px;align-items:flex-start;flex-shrink:0;height:${2 * STATUS_LINE}px;`;
  const status = document.createElement("div");
  status.className = "pipetrain-status";
  // Two lines: the second holds a failed or cancelled run's reason (where its checkpoint is, how to go on).
  status.style.cssText = "display:-webkit-box;-webkit-box-orient:vertical;-webkit-line-clamp:2;overflow:hidden;"
    + `overflow-wrap:anywhere;line-height:${STATUS_LINE}px;flex:1;min-width:0;height:${2 * STATUS_LINE}px;`;
  const finish = document.createElement("button");
  finish.className = "pipetrain-finish";
  finish.type = "button";
  finish.textContent = "Stop & save";
  finish.title = FINISH_TIP;
  finish.style.cssText = "display:none;flex-shrink:0;font:11px sans-serif;padding:2px 6px;cursor:pointer;"
    + "color:var(--input-text,#ddd);background:var(--comfy-input-bg,#222);border:1px solid var(--border-color,#555);"
    + "border-radius:4px;";
  head.append(status, finish);
  const canvas = document.createElement("canvas");
  canvas.className = "pipetrain-chart";
  canvas.style.cssText = `width:100%;height:${CHART_HEIGHT}px;background:rgba(0,0,0,0.25);border-radius:4px;flex-shrink:0;`;
  const strip = document.createElement("div");
  strip.className = "pipetrain-samples";
  // A strip wider than the node scrolls: a visible scrollbar, the right edge faded, and a "scroll" hint.
  strip.style.cssText = `display:flex;gap:3px;overflow-x:auto;min-height:${STRIP_HEIGHT}px;scrollbar-width:thin;`;
  const more = document.createElement("div");
  more.className = "pipetrain-samples-more";
  more.style.cssText = "display:none;text-align:right;color:var(--descrip-text,#999);";
  const error = document.createElement("pre");
  error.className = "pipetrain-error";
  error.style.cssText = `display:none;margin:0;height:${STRIP_HEIGHT + 14}px;overflow:auto;white-space:pre-wrap;`
    + "overflow-wrap:anywhere;font:10px/13px monospace;color:#ff9b9b;background:rgba(80,0,0,0.25);"
    + "border-radius:4px;padding:3px;box-sizing:border-box;";
  root.append(head, canvas, strip, more, error);

  // finishing: the run whose Stop & save was pressed (the button waits for its run to end)
  const view = { root, status, finish, canvas, strip, more, error, hoverPx: null, shownSamples: "", finishing: "" };
  finish.addEventListener("click", () => requestFinish(node));
  const hint = () => {
    const hidden = strip.scrollWidth - strip.clientWidth - strip.scrollLeft > 2;
    more.style.display = strip.scrollWidth > strip.clientWidth + 2 ? "block" : "none";
    more.textContent = hidden ? `${strip.children.length} samples · scroll → for more` : `${strip.children.length} samples`;
    strip.style.maskImage = hidden ? "linear-gradient(to right, black 85%, transparent)" : "none";
  };
  strip.addEventListener("scroll", hint);
  view.hint = hint;
  canvas.addEventListener("mousemove", (e) => {
    const rect = canvas.getBoundingClientRect();
    view.hoverPx = ((e.clientX - rect.left) / rect.width) * canvas.width;
    render(node);
  });
  canvas.addEventListener("mouseleave", () => {
    view.hoverPx = null;
    render(node);
  });
  const widget = node.addDOMWidget("pipetrain_view", "pipetrain_view", root, {
    serialize: false,
    hideOnZoom: false,
    getMinHeight: viewHeight,
    getMaxHeight: viewHeight, // a taller node gives its room to the multiline boxes (sample_prompts)
  });
  widget.serialize = false;
  // First on the node, where the eye is (below the input sockets); onSerialize keeps the saved widget
  // values in the order of the widgets that are saved.
  node.widgets.splice(node.widgets.indexOf(widget), 1);
  node.widgets.unshift(widget);
  node.pipetrainView = view;
  return view;
}

function render(node) {
  const view = node.pipetrainView;
  if (!view) return;
  // Only the run this node's settings name (a placeholder state, caching or queued, has no run yet);
  // before any run, the axis spans the node's own step count.
  const set = settings(node);
  const state = runs.get(String(node.id));
  const shown = state && (!state.run || runMatches(state.run, set)) ? state : null;
  const st = shown || emptyRun("", set.steps);
  if (!st.total && !st.run) st.total = set.steps;
  view.status.textContent = statusLine(st) + (st.warnings.length ? `  ⚠ ${st.warnings[st.warnings.length - 1]}` : "");
  view.status.title = [statusLine(st), ...st.warnings].join("\n");
  view.root.dataset.status = st.status;
  view.root.dataset.points = String(st.steps.length);
  const width = Math.max(100, Math.round(view.canvas.clientWidth || 300));
  if (view.canvas.width !== width) view.canvas.width = width;
  if (view.canvas.height !== CHART_HEIGHT) view.canvas.height = CHART_HEIGHT;
  const ctx = view.canvas.getContext("2d");
  if (ctx) drawChart(ctx, st, view.canvas.width, view.canvas.height, view.hoverPx);
  const running = !!st.run && RUNNING.has(st.status);
  if (!running) view.finishing = ""; // that run ended: a resume of the same name is offered the button again
  view.finish.style.display = running ? "block" : "none";
  view.finish.disabled = !running || view.finishing === st.run;
  view.finish.textContent = view.finishing === st.run && running ? "Stopping…" : "Stop & save";
  const failed = st.status === "failed";
  view.error.style.display = failed ? "block" : "none";
  view.strip.style.display = failed ? "none" : "flex";
  if (failed) {
    const text = [`failed: ${st.reason || "see train.log in the run folder"}`, ...(st.log?.length ? ["", "last lines of train.log:", ...st.log] : [])].join("\n");
    if (view.error.textContent !== text) {
      view.error.textContent = text;
      view.error.scrollTop = view.error.scrollHeight;
    }
  }

  const newest = [];
  for (let i = st.samples.length - 1; i >= 0 && newest.length < STRIP_IMAGES; i--) {
    const s = st.samples[i];
    s.images.forEach((ref, k) => newest.length < STRIP_IMAGES && newest.push({ ref, step: s.step, prompt: s.prompts[k] }));
  }
  const key = newest.map((n) => n.ref.filename).join("|");
  if (key !== view.shownSamples) {
    view.shownSamples = key;
    view.strip.replaceChildren(...newest.map((n) => {
      const img = document.createElement("img");
      img.src = imageUrl(n.ref);
      img.title = `step ${n.step}: ${n.prompt || ""}`;
      img.style.cssText = `height:${STRIP_HEIGHT - 8}px;width:auto;border-radius:3px;`;
      img.addEventListener("load", view.hint);
      return img;
    }));
  }
  view.hint();
  node.setDirtyCanvas(true, false);
}

async function requestFinish(node) {
  // Stop & save: the server finds this node's running launch (never a path from here) and asks it to finish.
  const view = node.pipetrainView;
  const st = runs.get(String(node.id));
  if (!view || !st?.run) return;
  view.finishing = st.run;
  render(node);
  let problem = "";
  try {
    const res = await api.fetchApi("/pipetrain/finish", {
      method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ node: String(node.id) }),
    });
    if (res.status !== 200) problem = (await res.json().catch(() => ({}))).error || `HTTP ${res.status}`;
  } catch (e) {
    problem = String(e?.message || e);
  }
  if (problem) { // shown as the status line's warning; the button is offered again
    view.finishing = "";
    st.warnings = st.warnings.concat([`Stop & save failed: ${problem}`]);
    console.warn("PipeTrain:", problem);
  }
  render(node);
}

function trainNodes() {
  return (app.graph?.nodes || []).filter((n) => n.comfyClass === TRAIN_NODE || n.type === TRAIN_NODE);
}

async function restore(node) {
  // A page reloaded mid-run: re-read the run's events and samples from the server.
  try {
    const res = await api.fetchApi(`/pipetrain/run_state?node=${encodeURIComponent(node.id)}`);
    if (res.status !== 200) return;
    const snap = await res.json();
    // Node ids repeat across workflows: another workflow's run (or an older run of this node under
    // another name) is not this node's.
    if (!runMatches(snap.run, settings(node))) return;
    runs.set(String(node.id), stateFromSnapshot(snap));
    render(node);
  } catch (e) {
    console.warn("PipeTrain: could not restore the run view", e);
  }
}

function onRunMessage(event) {
  const msg = event.detail;
  if (!msg || msg.node === undefined) return;
  const id = String(msg.node);
  runs.set(id, applyMessage(runs.get(id), msg));
  const node = app.graph?.getNodeById(isNaN(Number(id)) ? id : Number(id));
  if (node?.pipetrainView) render(node);
}

function onExecuting(event) {
  // CacheLatents runs before training: show "caching latents" on the TrainPipeline nodes.
  const id = event.detail;
  if (id === null || id === undefined) {
    unqueue(); // the prompt is over
    return;
  }
  const running = app.graph?.getNodeById(Number(id));
  if (running?.comfyClass !== "PipeTrainCacheLatents") return;
  for (const node of trainNodes()) {
    const st = runs.get(String(node.id));
    if (st && ["loading", "training", "sampling", "saving", "stopping"].includes(st.status)) continue;
    const fresh = emptyRun();
    fresh.status = "caching";
    runs.set(String(node.id), fresh);
    render(node);
  }
}

const stashed = new Map(); // node id -> the view's state before the prompt now queued

function onPromptQueued() {
  // A new prompt: the old run's chart and status go (kept aside in case the prompt reuses the node's
  // cached result); a node that is still training keeps its view.
  for (const node of trainNodes()) {
    const id = String(node.id);
    const st = runs.get(id);
    if (st && !["idle", "done", "cancelled", "failed"].includes(st.status)) continue;
    if (st) stashed.set(id, st);
    const fresh = emptyRun("", settings(node).steps);
    fresh.status = "queued";
    runs.set(id, fresh);
    render(node);
  }
}

function onCached(event) {
  // The prompt reuses a node's result without training: show the run that made it again.
  for (const id of (event.detail?.nodes || []).map(String)) {
    const node = app.graph?.getNodeById(isNaN(Number(id)) ? id : Number(id));
    if (!stashed.has(id) || runs.get(id)?.status !== "queued") continue;
    runs.set(id, stashed.get(id));
    stashed.delete(id);
    if (node?.pipetrainView) render(node);
  }
}

function unqueue() {
  // A prompt that ended before a node's run began (it did not include the node, or an earlier node
  // failed): the node shows what it showed before the prompt.
  for (const node of trainNodes()) {
    const id = String(node.id);
    const st = runs.get(id);
    if (!st || st.run || !["queued", "caching"].includes(st.status)) continue;
    if (stashed.has(id)) runs.set(id, stashed.get(id));
    else runs.delete(id);
    stashed.delete(id);
    render(node);
  }
}

function onExecutionError(event) {
  // Errors raised before the run has a feed (a setting the preflight refuses) or after it: the node says
  // failed with the message (the message of a training failure carries the last lines of train.log).
  const d = event.detail || {};
  const node = app.graph?.getNodeById(Number(d.node_id));
  if (!node || (node.comfyClass !== TRAIN_NODE && node.type !== TRAIN_NODE)) {
    unqueue();
    return;
  }
  const id = String(node.id);
  const st = runs.get(id)?.run ? runs.get(id) : emptyRun("", settings(node).steps);
  const [first, ...rest] = String(d.exception_message || d.exception_type || "error").trim().split("\n");
  st.status = "failed";
  if (!st.reason) st.reason = first;
  if (!st.log?.length) st.log = rest.slice(-12);
  runs.set(id, st);
  stashed.delete(id);
  render(node);
}

// Listen from the moment this module loads: a reloaded page may get messages before setup().
setInterval(() => { // the elapsed time while a rank loads, when no message comes for many seconds
  for (const [id, state] of runs) {
    if (state?.status !== "loading") continue;
    const node = app.graph?.getNodeById(isNaN(Number(id)) ? id : Number(id));
    if (node?.pipetrainView) render(node);
  }
}, 1000);
api.addEventListener("pipetrain.run", onRunMessage);
api.addEventListener("executing", onExecuting);
api.addEventListener("promptQueued", onPromptQueued);
api.addEventListener("execution_cached", onCached);
api.addEventListener("execution_error", onExecutionError);
api.addEventListener("execution_interrupted", unqueue);

app.registerExtension({
  name: "PipeTrain.TrainingView",
  async beforeRegisterNodeDef(nodeType, nodeData) {
    if (!NODES_WITH_SUMMARY.has(nodeData.name)) return;
    const created = nodeType.prototype.onNodeCreated;
    nodeType.prototype.onNodeCreated = function () {
      const r = created?.apply(this, arguments);
      for (const w of this.widgets || []) if (LABELLED_BOXES.has(w.name)) labelBox(w);
      return r;
    };
    const onExecuted = nodeType.prototype.onExecuted;
    nodeType.prototype.onExecuted = function (message) {
      onExecuted?.apply(this, arguments);
      if (message?.text?.length) showText(this, message.text.join("\n"));
    };
    if (nodeData.name !== TRAIN_NODE) return;
    const onNodeCreated = nodeType.prototype.onNodeCreated;
    nodeType.prototype.onNodeCreated = function () {
      const r = onNodeCreated?.apply(this, arguments);
      buildView(this);
      const node = this;
      for (const w of this.widgets || []) {
        if (!SETTINGS.includes(w.name)) continue;
        const callback = w.callback;
        w.callback = function () {
          const r2 = callback?.apply(this, arguments);
          requestAnimationFrame(() => render(node));
          return r2;
        };
      }
      fitNode(this);
      if (this.size[0] < 380) this.setSize([380, this.size[1]]);
      requestAnimationFrame(() => render(this));
      return r;
    };
    const onSerialize = nodeType.prototype.onSerialize;
    nodeType.prototype.onSerialize = function (o) {
      onSerialize?.apply(this, arguments);
      // LiteGraph saves each value at its widget's index, leaving a hole for the view above them, but
      // loads them by their order among saved widgets: save them in that order.
      if (o.widgets_values) o.widgets_values = (this.widgets || []).filter((w) => w.serialize !== false).map((w) => w.value);
    };
    const onConfigure = nodeType.prototype.onConfigure;
    nodeType.prototype.onConfigure = function (info) {
      const r = onConfigure?.apply(this, arguments);
      convertOldNode(this, info); // a workflow saved before the settings moved to Train Options
      return r;
    };
  },
  loadedGraphNode(node) {
    if (node.comfyClass !== TRAIN_NODE && node.type !== TRAIN_NODE) return;
    addOptionsNode(node);
    restore(node);
  },
});

// For tests and debugging in the browser console.
window.PipeTrainView = { runs, render, restore };
