// PipeTrain's ComfyUI extension.
// - TrainPipeline, SaveLoRA, LoadDataset and CacheLatents show the text summary they return
//   ({"ui": {"text": [...]}}: the dataset nodes' report of skipped and altered files).
// - TrainPipeline gets a training view: status line (caching, loading, training, sampling, saving,
//   cancelled, failed + reason), step / total / loss / grad norm / ETA, a live loss chart (raw +
//   smoothed; LR and gradient norm on hover) and a strip of the newest samples. It is fed by
//   `pipetrain.run` messages keyed by node id (nodes/ui_feed.py) and, after a page reload, by
//   GET /pipetrain/run_state?node=<id>.
// The state, smoothing and drawing live in chart.js (pure, unit-tested under node).
// Only the frontend's public extension API is used: `app` and `api` from scripts/app.js and
// scripts/api.js, the registerExtension hooks, LiteGraph's node.addDOMWidget and api events. Other
// scripts/*.js modules are the frontend's internals (tests/unit/test_ui_chart.py fails on an import of one).
import { app } from "../../scripts/app.js";
import { api } from "../../scripts/api.js";
import { applyMessage, drawChart, emptyRun, stateFromSnapshot, statusLine } from "./chart.js";

const NODES_WITH_SUMMARY = new Set(["PipeTrainTrainPipeline", "PipeTrainSaveLoRA", "PipeTrainLoadDataset",
  "PipeTrainCacheLatents"]);
const TRAIN_NODE = "PipeTrainTrainPipeline";
const STRIP_IMAGES = 8;
const CHART_HEIGHT = 150;
const SUMMARY_LINES = 8;
const runs = new Map(); // node id (string) -> run state

function fitNode(node) {
  // Grow the node to what its widgets need (never shrink what the user or the workflow chose).
  const [w, h] = node.computeSize();
  node.setSize([Math.max(node.size[0], w), Math.max(node.size[1], h)]);
}

function showText(node, text) {
  let widget = node.widgets?.find((w) => w.name === "pipetrain_summary");
  if (!widget) {
    // A read-only text box of our own (a DOM widget), not the frontend's STRING widget factory.
    const box = document.createElement("textarea");
    box.className = "pipetrain-summary";
    box.readOnly = true;
    box.spellcheck = false;
    box.style.cssText = "width:100%;height:100%;box-sizing:border-box;resize:none;white-space:pre;overflow:auto;"
      + "font:11px/14px monospace;color:var(--descrip-text,#aaa);background:var(--comfy-input-bg,#222);"
      + "border:1px solid var(--border-color,#444);border-radius:4px;padding:4px;";
    // As tall as its lines (up to SUMMARY_LINES), so a one-line summary does not push into the node
    // below; the frontend takes the widget's margin (above and below the box) out of this height.
    const lines = () => Math.min(SUMMARY_LINES, box.value.split("\n").length);
    const height = () => lines() * 14 + 12 + 2 * (widget?.margin ?? 10);
    widget = node.addDOMWidget("pipetrain_summary", "pipetrain_summary", box, {
      serialize: false, // display only: never saved into the workflow's widget values
      hideOnZoom: false,
      margin: 4,
      getValue: () => box.value,
      setValue: (v) => { box.value = v ?? ""; },
      getMinHeight: height,
      getMaxHeight: height,
    });
    widget.serialize = false;
  }
  widget.value = text;
  fitNode(node);
  node.setDirtyCanvas(true, true);
}

function imageUrl(ref) {
  const q = new URLSearchParams({ filename: ref.filename, subfolder: ref.subfolder || "", type: ref.type || "output" });
  return api.apiURL(`/view?${q}`);
}

function buildView(node) {
  const root = document.createElement("div");
  root.className = "pipetrain-view";
  root.style.cssText = "display:flex;flex-direction:column;gap:4px;font:11px sans-serif;color:var(--input-text,#ddd);";
  const status = document.createElement("div");
  status.className = "pipetrain-status";
  status.style.cssText = "white-space:nowrap;overflow:hidden;text-overflow:ellipsis;";
  const canvas = document.createElement("canvas");
  canvas.className = "pipetrain-chart";
  canvas.style.cssText = `width:100%;height:${CHART_HEIGHT}px;background:rgba(0,0,0,0.25);border-radius:4px;`;
  const strip = document.createElement("div");
  strip.className = "pipetrain-samples";
  strip.style.cssText = "display:flex;gap:3px;overflow-x:auto;min-height:0;";
  root.append(status, canvas, strip);

  const view = { root, status, canvas, strip, hoverPx: null, shownSamples: "" };
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
    getMinHeight: () => CHART_HEIGHT + 90,
  });
  widget.serialize = false;
  node.pipetrainView = view;
  return view;
}

function render(node) {
  const view = node.pipetrainView;
  const state = runs.get(String(node.id));
  if (!view) return;
  // Before any run, the axis spans the node's own step count.
  const st = state || emptyRun("", Number(node.widgets?.find((w) => w.name === "steps")?.value) || 0);
  view.status.textContent = statusLine(st) + (st.warnings.length ? `  ⚠ ${st.warnings[st.warnings.length - 1]}` : "");
  view.status.title = [statusLine(st), ...st.warnings].join("\n");
  view.root.dataset.status = st.status;
  view.root.dataset.points = String(st.steps.length);
  const width = Math.max(100, Math.round(view.canvas.clientWidth || 300));
  if (view.canvas.width !== width) view.canvas.width = width;
  if (view.canvas.height !== CHART_HEIGHT) view.canvas.height = CHART_HEIGHT;
  const ctx = view.canvas.getContext("2d");
  if (ctx) drawChart(ctx, st, view.canvas.width, view.canvas.height, view.hoverPx);

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
      img.style.cssText = "height:72px;width:auto;border-radius:3px;";
      return img;
    }));
  }
  node.setDirtyCanvas(true, false);
}

function trainNodes() {
  return (app.graph?.nodes || []).filter((n) => n.comfyClass === TRAIN_NODE || n.type === TRAIN_NODE);
}

async function restore(node) {
  // A page reloaded mid-run: re-read the run's events and samples from the server.
  try {
    const res = await api.fetchApi(`/pipetrain/run_state?node=${encodeURIComponent(node.id)}`);
    if (res.status !== 200) return;
    runs.set(String(node.id), stateFromSnapshot(await res.json()));
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
  if (id === null || id === undefined) return;
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

// Listen from the moment this module loads: a reloaded page may get messages before setup().
api.addEventListener("pipetrain.run", onRunMessage);
api.addEventListener("executing", onExecuting);

app.registerExtension({
  name: "PipeTrain.TrainingView",
  async beforeRegisterNodeDef(nodeType, nodeData) {
    if (!NODES_WITH_SUMMARY.has(nodeData.name)) return;
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
      fitNode(this);
      if (this.size[0] < 380) this.setSize([380, this.size[1]]);
      requestAnimationFrame(() => render(this));
      return r;
    };
  },
  loadedGraphNode(node) {
    if (node.comfyClass === TRAIN_NODE || node.type === TRAIN_NODE) restore(node);
  },
});

// For tests and debugging in the browser console.
window.PipeTrainView = { runs, render, restore };
