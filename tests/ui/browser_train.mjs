// Browser test of the training view, driven by tests/ui/test_ui_browser.py against a real ComfyUI:
// open the example workflow from ComfyUI's template browser, press Run, see the loss chart fill and a sample appear (strip and node
// preview), reload the page mid-run and see the chart come back, press Cancel and see the run stop (the
// Stop & save button shows while it trains, and goes once it is cancelled).
// Then a workflow saved before Train Options existed, converted on load; each example workflow's layout: no overlapping nodes once loaded and once its nodes show results
// (tools/template_layout.mjs), and a fresh template's node shows no other run; last, a failed run's
// view (error and log lines), reset by a newly queued prompt and shown again when that prompt ends. Where the
// frontend has it, each example workflow's layout and training view again with Nodes 2.0 (Vue nodes).
// Screenshots go to <artifacts dir>; the last stdout line is a JSON summary for the Python side.
//
//   node tests/ui/browser_train.mjs <comfyui url> <artifacts dir> <run name> <number of example workflows>
import fs from "node:fs";
import path from "node:path";
import { openBrowser, openComfy } from "../../tools/chromium.mjs";
import { checkTemplateInPage, hasNodes2InPage, setNodes2InPage, showGraphPartInPage } from "../../tools/template_layout.mjs";

const [url, artifacts, runName, templateCount] = process.argv.slice(2);
const TRAIN_ID = 8;
const SAVE_ID = 9;
fs.mkdirSync(artifacts, { recursive: true });
const summary = { statuses: [], steps: {} };
const VIEW = { width: 1700, height: 1200 };
const browser = await openBrowser(VIEW);
const { page } = browser;
const shot = (name) => page.screenshot({ path: path.join(artifacts, name) });
const log = [];
page.on("console", (m) => log.push(`[${m.type()}] ${m.text()}`));
page.on("pageerror", (e) => log.push(`[pageerror] ${e.message}`));

async function view() {
  return page.evaluate((id) => {
    const node = window.app.graph.getNodeById(id);
    const root = node?.pipetrainView?.root;
    if (!root) return null;
    const imgs = [...root.querySelectorAll(".pipetrain-samples img")];
    const previews = window.app.nodePreviewImages?.[String(id)] || window.app.nodePreviewImages?.[id] || [];
    const finish = root.querySelector(".pipetrain-finish"); // Stop & save: offered while the run trains
    return {
      status: root.dataset.status,
      points: Number(root.dataset.points || 0),
      line: root.querySelector(".pipetrain-status")?.textContent || "",
      samplesLoaded: imgs.filter((i) => i.complete && i.naturalWidth > 0).length,
      more: root.querySelector(".pipetrain-samples-more")?.textContent || "",
      preview: (previews.length || 0) + (node.imgs?.length || 0),
      finish: { shown: !!finish && finish.style.display !== "none", enabled: !!finish && !finish.disabled,
                title: finish?.title || "" },
    };
  }, TRAIN_ID);
}

async function until(what, test, timeoutMs) {
  const deadline = Date.now() + timeoutMs;
  let last = null;
  while (Date.now() < deadline) {
    last = await view();
    if (last && !summary.statuses.includes(last.status)) summary.statuses.push(last.status);
    if (last && test(last)) return last;
    await page.waitForTimeout(200);
  }
  throw new Error(`timed out waiting for ${what}; last view: ${JSON.stringify(last)}`);
}

async function focusTrainNode() {
  // The whole node, the training view (status, chart, samples) at its top, in view.
  await page.locator("[data-testid=close-minmap-button]").click({ timeout: 2000 }).catch(() => {});
  await page.evaluate(({ id, height }) => {
    const node = window.app.graph.getNodeById(id);
    const ds = window.app.canvas.ds;
    // at most 85%, less where the node (sized for its tallest renderer, with a preview) is taller than the window
    ds.scale = Math.min(0.85, (height - 90) / (node.size[1] + 40));
    ds.offset = [-node.pos[0] + 120, (height - 30) / ds.scale - (node.pos[1] + node.size[1])];
    window.app.graph.setDirtyCanvas(true, true);
  }, { id: TRAIN_ID, height: VIEW.height });
  await page.waitForTimeout(300);
}

async function pressCancel() {
  // The run bar's "Cancel current run", where the frontend knows the job is running.
  const runBar = page.getByRole("button", { name: "Cancel current run" }).and(page.locator(":enabled"));
  try {
    await runBar.first().waitFor({ state: "visible", timeout: 10000 });
    await runBar.first().click();
    return "run bar";
  } catch (e) {
    if (e?.name !== "TimeoutError") throw e;
  }
  // A frontend that learns of a job only from its start event keeps that button disabled after a
  // reload mid-run; its job list ("1 active") still shows the running job, whose row offers Cancel
  // while the pointer is on it.
  await page.getByRole("button", { name: /\b\d+ active\b/ }).first().click();
  const row = page.locator("[data-job-id]").filter({ hasText: "Running" }).first();
  await row.hover({ timeout: 10000 });
  await row.getByRole("button", { name: "Cancel", exact: true }).click({ timeout: 10000 });
  return "job list";
}

try {
  await openComfy(page, url);
  // The example workflow, as a user finds it: Templates -> PipeTrain -> train_lora_then_test.
  await page.getByRole("button", { name: "Templates" }).click();
  await page.getByText("PipeTrain", { exact: true }).first().click();
  const card = page.getByText("train_lora_then_test", { exact: true });
  await card.waitFor({ timeout: 30000 });
  // The card's thumbnail (the frontend shows it from a blob URL): its pixel size identifies our .jpg.
  const thumbs = () => [...document.querySelectorAll("[role=dialog] img, .p-dialog img")]
    .filter((i) => i.complete && i.naturalWidth > 0).map((i) => [i.naturalWidth, i.naturalHeight]);
  // Thumbnails load one by one: wait for all of them (a slow machine showed only the first one loaded).
  await page.waitForFunction((n) => [...document.querySelectorAll("[role=dialog] img, .p-dialog img")]
    .filter((i) => i.complete && i.naturalWidth > 0).length >= n, Number(templateCount), { timeout: 30000 })
    .catch(() => {});
  summary.templates = await page.evaluate(thumbs);
  await shot("00_templates.png");
  await card.click();
  await page.waitForFunction(() => window.app.graph.getNodeById(8)?.comfyClass === "PipeTrainTrainPipeline",
                             null, { timeout: 30000 });
  await page.evaluate(async ({ runName }) => {
    const node = window.app.graph.getNodeById(8);
    const set = (name, value) => { node.widgets.find((w) => w.name === name).value = value; };
    set("steps", 100000); // runs until Cancel
    set("num_gpus", 1);
    // The template's Train Options node holds its sample settings.
    window.app.graph._nodes.find((n) => n.type === "PipeTrainTrainOptions").widgets
      .find((w) => w.name === "sample_every").value = 4;
    set("run_name", runName);
    // A LoRA name of its own: an earlier test of this server may have saved the template's name.
    window.app.graph.getNodeById(9).widgets.find((w) => w.name === "name").value = runName;
  }, { runName });
  summary.loadedStatus = (await view())?.status; // an earlier run of this server is not this node's
  await focusTrainNode();
  await shot("01_loaded.png");

  // The button that queues the run, not a neighbour that opens the run-mode menu (newer frontends
  // label that one "Run" too).
  await page.getByRole("button", { name: "Run", exact: true }).and(page.locator(":not([aria-haspopup])")).click();
  const t0 = Date.now();
  summary.training = await until("the loss chart to fill", (v) => v.points >= 6, 180000);
  summary.steps.firstChart = Date.now() - t0;
  await focusTrainNode();
  await shot("02_chart.png");
  summary.samples = await until("a sample in the strip and the node preview", (v) => v.samplesLoaded >= 1 && v.preview >= 1, 120000);
  await shot("03_samples.png");

  // A page reload mid-run: the chart and samples come back from /pipetrain/run_state.
  const before = summary.samples.points;
  await page.reload();
  await openComfy(page, url);
  summary.reloaded = await until("the chart after a reload", (v) => v.points >= before && v.samplesLoaded >= 1, 60000);
  await focusTrainNode();
  await shot("04_after_reload.png");

  summary.cancelVia = await pressCancel();
  const pressed = Date.now();
  // ... with where its checkpoint is and how to continue it (the status line's reason)
  summary.cancelled = await until("the cancelled status", (v) => v.status === "cancelled" && v.line.includes("resume"), 60000);
  summary.cancelSeconds = (Date.now() - pressed) / 1000;
  await page.waitForTimeout(500);
  await focusTrainNode();
  await shot("05_cancelled.png");

  // The text summary SaveLoRA returns ({"ui": {"text": [...]}}) as the frontend delivers it: an
  // `executed` event from the api. It shows in a read-only box inside the node, as tall as its text,
  // and is never saved with the workflow.
  await page.evaluate((id) => {
    const node = window.app.graph.getNodeById(id);
    const ds = window.app.canvas.ds;
    ds.scale = 1;
    ds.offset = [-node.pos[0] + 200, -node.pos[1] + 200];
    window.app.graph.setDirtyCanvas(true, true);
  }, SAVE_ID);
  await page.waitForTimeout(300);
  summary.summaryText = await page.evaluate(async (id) => {
    const { api } = await import("/scripts/api.js");
    const node = window.app.graph.getNodeById(id);
    const before = node.serialize().widgets_values?.length ?? 0;
    const text = "saved pipetrain/ui_check.safetensors";
    api.dispatchEvent(new CustomEvent("executed", { detail: { node: String(id), display_node: String(id),
                                                                 output: { text: [text] } } }));
    await new Promise((r) => setTimeout(r, 500));
    const widget = node.widgets?.find((w) => w.name === "pipetrain_summary");
    const box = widget?.element;
    // The node's body on screen (pos is its top-left corner below the title) against the box's rectangle.
    const ds = window.app.canvas.ds;
    const canvasRect = window.app.canvas.canvas.getBoundingClientRect();
    const toScreen = ([x, y]) => [(x + ds.offset[0]) * ds.scale + canvasRect.left,
                                  (y + ds.offset[1]) * ds.scale + canvasRect.top];
    const [left, top] = toScreen(node.pos);
    const [right, bottom] = toScreen([node.pos[0] + node.size[0], node.pos[1] + node.size[1]]);
    const r = box?.getBoundingClientRect();
    const inside = !!r && r.height > 0 && r.left >= left - 2 && r.right <= right + 2 && r.top >= top - 2
      && r.bottom <= bottom + 2;
    return { value: widget?.value, box: box?.tagName, readOnly: box?.readOnly, boxText: box?.value,
             inPage: !!box?.isConnected, inside, boxHeight: r ? Math.round(r.height) : 0,
             lineHeight: box ? parseFloat(getComputedStyle(box).lineHeight) || 14 : 0,
             node: [Math.round(left), Math.round(top), Math.round(right), Math.round(bottom)],
             rect: r ? [r.left, r.top, r.right, r.bottom].map(Math.round) : null,
             serialized: (node.serialize().widgets_values?.length ?? 0) - before, expected: text };
  }, SAVE_ID);
  await shot("06_summary.png");

  // A workflow saved before the rarely changed settings moved to Train Options (widget values by position):
  // converted on load, a Train Options node added with the moved values; saved and loaded again unchanged.
  const fixture = JSON.parse(fs.readFileSync("tests/ui/fixtures/train_lora_then_test_before_train_options.json", "utf8"));
  summary.legacy = await page.evaluate(async ({ workflow, id }) => {
    const read = async (wf) => {
      await window.app.loadGraphData(structuredClone(wf));
      await new Promise((r) => setTimeout(r, 500));
      const g = window.app.graph;
      const train = g.getNodeById(id);
      const options = g._nodes.find((n) => n.type === "PipeTrainTrainOptions");
      const values = (n) => n && Object.fromEntries(n.widgets.filter((w) => w.serialize !== false).map((w) => [w.name, w.value]));
      const linkId = train.inputs[train.findInputSlot("options")].link;
      const link = g.links.get ? g.links.get(linkId) : g.links[linkId];
      const { output } = await window.app.graphToPrompt();
      return { train: values(train), options: values(options), linked: !!options && link?.origin_id === options.id,
               strayInputs: train.inputs.filter((i) => i.widget && !train.widgets.some((w) => w.name === i.widget.name)).map((i) => i.name),
               queued: output[String(id)]?.inputs, saved: train.serialize().widgets_values, viewFirst: train.widgets[0].name,
               graph: g.serialize() };
    };
    const first = await read(workflow);
    const again = await read(first.graph);
    delete first.graph;
    delete again.graph;
    return { ...first, again };
  }, { workflow: fixture, id: TRAIN_ID });

  // Each example workflow, opened fresh: its layout before and after results, its node's training view.
  const image = await page.evaluate((id) => window.PipeTrainView.runs.get(String(id))?.samples.at(-1)?.images[0], TRAIN_ID);
  summary.layouts = {};
  for (const file of fs.readdirSync("example_workflows").filter((f) => f.endsWith(".json")).sort()) {
    const name = file.replace(/\.json$/, "");
    const workflow = JSON.parse(fs.readFileSync(path.join("example_workflows", file), "utf8"));
    const result = await page.evaluate(checkTemplateInPage, { workflow, image, trainId: TRAIN_ID });
    for (const part of ["left", "right"]) {
      await page.evaluate(showGraphPartInPage, { ...VIEW, part });
      await page.waitForTimeout(400);
      await shot(`07_layout_${name}_${part}.png`);
    }
    summary.layouts[name] = result;
  }

  // Nodes 2.0 (the node renderer ComfyUI 0.33's frontend offers: nodes as Vue components, setting
  // Comfy.VueNodes.Enabled): each example workflow again, drawn that way. null where the frontend has none.
  summary.nodes2 = (await page.evaluate(hasNodes2InPage)) ? {} : null;
  if (summary.nodes2) {
    await page.evaluate(setNodes2InPage, true);
    for (const file of fs.readdirSync("example_workflows").filter((f) => f.endsWith(".json")).sort()) {
      const name = file.replace(/\.json$/, "");
      const workflow = JSON.parse(fs.readFileSync(path.join("example_workflows", file), "utf8"));
      summary.nodes2[name] = await page.evaluate(checkTemplateInPage, { workflow, image, trainId: TRAIN_ID, nodes2: true });
      for (const part of ["left", "right"]) {
        await page.evaluate(showGraphPartInPage, { ...VIEW, part });
        await page.waitForTimeout(600);
        await shot(`09_nodes2_${name}_${part}.png`);
      }
    }
    await page.evaluate(setNodes2InPage, false);
  }

  // The last template's node through a failed run (the messages nodes/ui_feed.py sends), then a new
  // prompt queued (the view resets) that ends before training (the failed run shows again).
  summary.failedView = await page.evaluate(async (id) => {
    const { api } = await import("/scripts/api.js");
    const node = window.app.graph.getNodeById(id);
    const run = node.widgets.find((w) => w.name === "run_name").value;
    const send = (type, extra) => api.dispatchEvent(new CustomEvent("pipetrain.run", { detail: { node: String(id), run, type, ...extra } }));
    send("reset", { total: 60, status: "loading" });
    send("event", { event: { event: "step", step: 1, total: 60, loss: 0.5, lr: 1e-4, time: 1 } });
    send("status", { status: "failed", reason: "RuntimeError: CUDA out of memory (a test message)",
                     log: ["step 1/60 loss 0.5000", "Traceback (most recent call last):", "RuntimeError: CUDA out of memory"] });
    await new Promise((r) => setTimeout(r, 300));
    const root = node.pipetrainView.root;
    const failed = { status: root.dataset.status, error: root.querySelector(".pipetrain-error").textContent,
                     // (its display, not its size: a node outside the canvas's view has its DOM widgets hidden)
                     shown: getComputedStyle(root.querySelector(".pipetrain-error")).display !== "none" };
    api.dispatchEvent(new CustomEvent("promptQueued", { detail: { number: 1, batchCount: 1 } }));
    const queued = root.dataset.status;
    api.dispatchEvent(new CustomEvent("executing", { detail: null }));
    return { ...failed, queued, afterPrompt: root.dataset.status };
  }, TRAIN_ID);
  await focusTrainNode();
  await shot("08_failed.png");

  summary.ok = true;
} catch (e) {
  summary.ok = false;
  summary.error = String(e?.stack || e);
  await shot("99_failure.png").catch(() => {});
} finally {
  // The frontend warns when an extension imports one of its internal modules (only this pack is installed).
  summary.internalImportNotices = log.filter((line) => line.includes("[ComfyUI Notice]"));
  fs.writeFileSync(path.join(artifacts, "console.log"), log.join("\n") + "\n");
  fs.writeFileSync(path.join(artifacts, "summary.json"), JSON.stringify(summary, null, 2) + "\n");
  await browser.close();
}
console.log(JSON.stringify(summary));
process.exit(summary.ok ? 0 : 1);
