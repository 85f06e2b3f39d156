// What tests/ui/browser_train.mjs checks of each example workflow's layout in the real frontend: no two
// nodes' boxes (node.pos / node.size, plus the title bar above pos) overlap, once the template is loaded
// and again once every node that shows a result has one (images, text summaries), and each node's saved
// size fits its current widgets. Runs in the page (page.evaluate). tools/measure_templates.mjs runs the
// same load-and-deliver steps to measure the sizes tools/relayout_templates.py lays the templates out for.

/** Whether the frontend offers Nodes 2.0 (its Comfy.VueNodes.Enabled setting). Runs in the page. */
export function hasNodes2InPage() {
  return window.app.extensionManager?.setting?.get("Comfy.VueNodes.Enabled") !== undefined;
}

/** Turn Nodes 2.0 on or off (a frontend without it: nothing). Runs in the page. */
export async function setNodes2InPage(on) {
  await window.app.extensionManager?.setting?.set("Comfy.VueNodes.Enabled", on);
}

/** The page-side check: load `workflow`, measure, deliver results as the api does, measure again. With
 *  `nodes2` (the frontend's Nodes 2.0 renderer on) node.size is what that renderer grew each node to, which
 *  takes a moment after drawing, the saved-size check (the classic canvas's computeSize) does not apply, and
 *  the training view is checked to sit inside its node's drawn box. */
export async function checkTemplateInPage({ workflow, image, trainId, nodes2 = false }) {
  const { app } = window;
  const { api } = await import("/scripts/api.js");
  const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
  const title = window.LiteGraph.NODE_TITLE_HEIGHT;
  const overlaps = () => {
    const boxes = app.graph._nodes.map((n) => ({ id: n.id, type: n.type, x: n.pos[0], y: n.pos[1] - title,
                                                 w: n.size[0], h: n.size[1] + title }));
    const found = [];
    for (const [i, a] of boxes.entries()) {
      for (const b of boxes.slice(i + 1)) {
        if (a.x < b.x + b.w && b.x < a.x + a.w && a.y < b.y + b.h && b.y < a.y + a.h) found.push(`${a.type}#${a.id} / ${b.type}#${b.id}`);
      }
    }
    return found;
  };
  const saved = Object.fromEntries(workflow.nodes.map((n) => [n.id, n.size]));
  await app.loadGraphData(structuredClone(workflow));
  await sleep(nodes2 ? 2500 : 600);
  const tooSmall = nodes2 ? [] : app.graph._nodes.filter((n) => {
    const [w, h] = n.computeSize();
    return saved[n.id][0] < w - 1 || saved[n.id][1] < h - 1;
  }).map((n) => `${n.type}#${n.id} saved ${saved[n.id]} needs ${n.computeSize().map(Math.round)}`);
  const sizes = () => Object.fromEntries(app.graph._nodes.map((n) => [String(n.id), [...n.size]]));
  const train = app.graph.getNodeById(trainId);
  const loaded = { overlaps: overlaps(), status: train?.pipetrainView?.root?.dataset.status, sizes: sizes() };
  if (nodes2) {  // the view drawn inside the Train Pipeline node's own box, with its status line and chart
    const box = document.querySelector(`[data-node-id="${trainId}"]`)?.getBoundingClientRect();
    const root = train?.pipetrainView?.root;
    const view = root?.getBoundingClientRect();
    const chart = root?.querySelector("canvas")?.getBoundingClientRect();
    loaded.view = { node: Boolean(box), width: Math.round(view?.width || 0), height: Math.round(view?.height || 0),
                    chartHeight: Math.round(chart?.height || 0),
                    inside: Boolean(box && view && view.left >= box.left - 1 && view.right <= box.right + 1
                                    && view.top >= box.top - 1 && view.bottom <= box.bottom + 1),
                    line: root?.querySelector(".pipetrain-status")?.textContent || "" };
  }
  const boxLabels = app.graph._nodes.flatMap((n) => (n.widgets || []).filter((w) => w.inputEl?.dataset?.pipetrainLabel)
    .map((w) => w.name));

  // What a finished run shows: every output node's result, delivered as the api's `executed` event.
  const lora = "pipetrain/a_rather_long_lora_name_that_a_user_might_choose_for_a_character.safetensors";
  for (const n of app.graph._nodes) {
    let output = null;
    if (["SaveImage", "PreviewImage", "SaveAnimatedWEBP"].includes(n.type)) output = { images: [image] };
    else if (n.type === "PipeTrainTrainPipeline") {
      output = { images: [image], text: [`demo: trained 60/60 steps, final loss 0.1234\nLoRA: output/pipetrain/demo/lora/`
        + `demo_step000060.safetensors\nrun folder: output/pipetrain/demo`] };
    } else if (n.type === "PipeTrainSaveLoRA") output = { text: [`saved ${lora}`] };
    if (output) api.dispatchEvent(new CustomEvent("executed", { detail: { node: String(n.id), display_node: String(n.id), output } }));
  }
  await sleep(nodes2 ? 2500 : 1500);
  app.graph.setDirtyCanvas(true, true);
  // A summary box that cuts its text (a long LoRA path) shows less than it holds.
  const cut = app.graph._nodes.flatMap((n) => (n.widgets || []).filter((w) => w.name === "pipetrain_summary")
    .filter((w) => w.element.scrollWidth > w.element.clientWidth + 1 || w.element.scrollHeight > w.element.clientHeight + 1)
    .map((w) => `${n.type}#${n.id} shows ${w.element.clientWidth}x${w.element.clientHeight} of ${w.element.scrollWidth}x${w.element.scrollHeight}`));
  return { loaded, tooSmall, boxLabels, after: { overlaps: overlaps(), cut, sizes: sizes() } };
}

/** Show the left or the right part of the graph at a zoom that still draws the widgets' text (for the
 *  screenshots; the whole graph when it fits at that zoom). */
export function showGraphPartInPage({ width, height, part }) {
  const { app } = window;
  const title = window.LiteGraph.NODE_TITLE_HEIGHT;
  const nodes = app.graph._nodes;
  const x0 = Math.min(...nodes.map((n) => n.pos[0])) - 20;
  const y0 = Math.min(...nodes.map((n) => n.pos[1] - title)) - 20;
  const x1 = Math.max(...nodes.map((n) => n.pos[0] + n.size[0])) + 20;
  const y1 = Math.max(...nodes.map((n) => n.pos[1] + n.size[1])) + 20;
  const [sideBar, topBar] = [60, 80]; // the frontend's own panels over the canvas
  const ds = app.canvas.ds;
  ds.scale = Math.max(0.62, Math.min((width - sideBar) / (x1 - x0), (height - topBar) / (y1 - y0)));
  const left = part === "right" ? Math.max(x0, x1 - (width - sideBar) / ds.scale) : x0;
  ds.offset = [-left + sideBar / ds.scale, -y0 + topBar / ds.scale];
  app.graph.setDirtyCanvas(true, true);
}
